// TensorBoard event files written by hand (no TensorFlow, no protobuf library).
//
// A tfevents file is a sequence of TFRecords:
//   [uint64 length][uint32 masked_crc32c(length bytes)][data][uint32 masked_crc32c(data)]
// (all little-endian), where masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 and
// CRC32C is the Castagnoli CRC (core/crc32c.hpp). Each record's data is a serialized tensorflow `Event`:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record of a file carries file_version "brain.Event:2" and no summary; that
// is how TensorBoard recognises the format. Everything here is encoded by hand and
// checked against Debian's python3-protobuf in test/core/read_tfevents.py.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mtnlg::tb {

// The rotation-plus-constant TFRecord applies so that CRCs of CRCs stay well spread.
uint32_t mask_crc(uint32_t crc);
uint32_t unmask_crc(uint32_t masked);

// Protobuf wire-format pieces (appended to `out`).
void put_varint(std::string& out, uint64_t v);
void put_tag(std::string& out, uint32_t field, uint32_t wire_type);

// One (tag, value) pair of a Summary.
struct ScalarValue {
  std::string tag;
  float value = 0;
};

// Serialized Event messages.
std::string encode_file_version_event(double wall_time, std::string_view version = "brain.Event:2");
std::string encode_scalar_event(double wall_time, int64_t step, const std::vector<ScalarValue>& values);
// One TFRecord around `data`.
std::string encode_record(std::string_view data);

// The conventional file name: events.out.tfevents.<unix seconds>.<hostname>.<pid>.<counter>
// (the counter makes names unique when one process opens several writers in a second).
std::string event_file_name(int64_t unix_seconds, std::string_view hostname, int64_t pid, int64_t counter);

// Appends scalar events to a new event file in `dir` (created if missing). Not thread-
// safe; one writer per process (the trainer opens it on global rank 0 only). Records
// are buffered by stdio; flush() makes them visible to a running TensorBoard. The
// destructor flushes and closes (errors there are swallowed, flush() reports them).
class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event with one value. Non-finite values are written as they are (TensorBoard
  // shows NaN/inf); the float conversion rounds to nearest.
  void scalar(const std::string& tag, double value, int64_t step);
  // One Event holding every value of `values`, all at `step` (smaller than one event
  // per tag; TensorBoard reads both forms).
  void scalars(const std::map<std::string, double>& values, int64_t step);
  // The trainer's per-iteration helper: for each key k of `values` writes
  // "<prefix>/<k>" at step = iteration and "<prefix>-vs-tokens/<k>" at step =
  // consumed_tokens (Megatron's "vs samples" idea, with tokens since batch sizes ramp).
  // Then flushes. prefix defaults to "train".
  void log_iteration(const std::map<std::string, double>& values, int64_t iteration, int64_t consumed_tokens,
                     const std::string& prefix = "train");
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mtnlg::tb
