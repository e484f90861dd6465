// TensorBoard event-file writer: protobuf wire encoding of Event/Summary, TFRecord
// framing, and the file writer. See tensorboard.hpp for the formats.
#include "core/tensorboard.hpp"

#include "core/crc32c.hpp"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"

namespace mtnlg::tb {

namespace {

void put_le32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_le64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Protobuf wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_bytes_field(std::string& out, uint32_t field, std::string_view bytes) {
  put_tag(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

void put_double_field(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, kFixed64);
  put_le64(out, bits);
}

void put_float_field(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, kFixed32);
  put_le32(out, bits);
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  // A '/' in a host name would turn the file name into a path.
  std::string h(buf);
  for (char& c : h)
    if (c == '/') c = '_';
  return h;
}

}  // namespace

uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint32_t unmask_crc(uint32_t masked) {
  uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_tag(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

std::string encode_file_version_event(double wall_time, std::string_view version) {
  std::string ev;
  put_double_field(ev, 1, wall_time);
  put_bytes_field(ev, 3, version);
  return ev;
}

std::string encode_scalar_event(double wall_time, int64_t step, const std::vector<ScalarValue>& values) {
  std::string summary;
  for (const auto& v : values) {
    std::string value_msg;
    put_bytes_field(value_msg, 1, v.tag);
    put_float_field(value_msg, 2, v.value);
    put_bytes_field(summary, 1, value_msg);
  }
  std::string ev;
  put_double_field(ev, 1, wall_time);
  // int64 negative steps encode as 10-byte two's-complement varints, as protobuf does.
  put_tag(ev, 2, kVarint);
  put_varint(ev, static_cast<uint64_t>(step));
  put_bytes_field(ev, 5, summary);
  return ev;
}

std::string encode_record(std::string_view data) {
  std::string rec;
  rec.reserve(data.size() + 16);
  std::string len;
  put_le64(len, data.size());
  rec += len;
  put_le32(rec, mask_crc(crc32c(len)));
  rec.append(data.data(), data.size());
  put_le32(rec, mask_crc(crc32c(data)));
  return rec;
}

std::string event_file_name(int64_t unix_seconds, std::string_view hostname, int64_t pid, int64_t counter) {
  return fmt::format("events.out.tfevents.{}.{}.{}.{}", unix_seconds, hostname, pid, counter);
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  static std::atomic<int64_t> counter{0};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw_runtime("{}: cannot create the TensorBoard directory: {}", dir, ec.message());
  const double t = now_seconds();
  path_ = (std::filesystem::path(dir) /
           event_file_name(static_cast<int64_t>(t), host_name(), static_cast<int64_t>(::getpid()), counter++))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw_runtime("{}: cannot open for writing: {}", path_, std::strerror(errno));
  write_record(encode_file_version_event(t));
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write_record(const std::string& event) {
  const std::string rec = encode_record(event);
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size())
    throw_runtime("{}: write failed: {}", path_, std::strerror(errno));
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step) {
  write_record(encode_scalar_event(now_seconds(), step, {{tag, static_cast<float>(value)}}));
}

void TensorBoardWriter::scalars(const std::map<std::string, double>& values, int64_t step) {
  if (values.empty()) return;
  std::vector<ScalarValue> vs;
  vs.reserve(values.size());
  for (const auto& [tag, v] : values) vs.push_back({tag, static_cast<float>(v)});
  write_record(encode_scalar_event(now_seconds(), step, vs));
}

void TensorBoardWriter::log_iteration(const std::map<std::string, double>& values, int64_t iteration,
                                      int64_t consumed_tokens, const std::string& prefix) {
  std::map<std::string, double> by_iter, by_tokens;
  for (const auto& [k, v] : values) {
    by_iter[prefix + "/" + k] = v;
    by_tokens[prefix + "-vs-tokens/" + k] = v;
  }
  scalars(by_iter, iteration);
  scalars(by_tokens, consumed_tokens);
  flush();
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0) throw_runtime("{}: flush failed: {}", path_, std::strerror(errno));
}

}  // namespace mtnlg::tb
