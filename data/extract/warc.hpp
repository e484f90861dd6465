// WARC reader (docs/specs/warc.md): WARC/1.0 and WARC/1.1 records from a plain `.warc`
// file or a `.warc.gz` made of gzip members (one member per record, as Common Crawl
// writes them; several records in one member are read too). A member is decompressed
// whole by libdeflate when it is small enough, else streamed by zlib. One record is in
// memory at a time, its block capped at `max_record_bytes`, so memory does not grow with
// the file.
//
// Every framing fault is a `WarcError` naming the file, the record's ordinal, the byte
// offset where the record starts (for gzip: the compressed offset of the member that
// holds the record's first byte) and the field or part at fault, with a `cause` key for
// the report's per-cause counts. After a fault, `resync()` moves to the next record
// start that can be found (the next gzip member, or the next "WARC/1." line of a plain
// file) so `--skip-bad-records` can carry on.
#pragma once
#include <libdeflate.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace mtnlg::extract {

class WarcError : public InputError {
 public:
  WarcError(std::string cause, std::string msg) : InputError(std::move(msg)), cause_(std::move(cause)) {}
  const std::string& cause() const { return cause_; }

 private:
  std::string cause_;  // truncated | gzip | header | oversize | encoding | http
};

struct WarcRecord {
  std::string version;                                       // "WARC/1.0" or "WARC/1.1"
  std::vector<std::pair<std::string, std::string>> headers;  // in file order, names as written
  std::string block;                                         // Content-Length bytes
  int64_t ordinal = 0;                                       // 1-based record number in the file
  int64_t offset = 0;                                        // see the file comment
  // First header whose name matches (ASCII case-insensitive), or "".
  std::string_view header(std::string_view name) const;
  std::string_view type() const { return header("WARC-Type"); }
};

class WarcReader {
 public:
  WarcReader(std::string path, int64_t max_record_bytes);
  ~WarcReader();
  WarcReader(const WarcReader&) = delete;
  WarcReader& operator=(const WarcReader&) = delete;

  // The next record; false at a clean end of file. Throws WarcError.
  bool next(WarcRecord& rec);
  // After a WarcError: skip to the next place a record can start. False when none is left.
  bool resync();
  bool gzip() const { return gzip_; }
  const std::string& path() const { return path_; }
  int64_t file_bytes() const { return file_bytes_; }
  // Bytes of the file consumed so far (compressed bytes for gzip): for progress.
  int64_t bytes_read() const { return raw_pos_ - static_cast<int64_t>(zs_.avail_in); }

 private:
  // Buffered decompressed stream.
  bool fill();                                    // more bytes into buf_; false at EOF
  bool whole_member();                            // the gzip member at zs_.next_in by libdeflate, if it can
  void took_member(size_t at, size_t in_used);    // a member decompressed whole: its start, its bytes consumed
  size_t trailer_size() const;                    // the size the file's last 4 bytes give its last member, or 0
  bool member_into_buffer(size_t size);           // the member at zs_.next_in into buf_ if it holds <= size
  bool more_raw();                                // more compressed bytes after the unread ones; false at EOF
  bool read_line(std::string& line, size_t max);  // without the CRLF/LF; false at EOF before any byte
  bool read_exact(std::string& out, size_t n);    // false when the stream ended first
  int64_t record_offset() const;                  // of the byte at pos_
  void seek_raw(int64_t off);                     // restart reading at a raw byte offset
  int64_t find_raw(int64_t from, std::string_view pat, bool line_start);
  [[noreturn]] void fail(const std::string& cause, int64_t ordinal, int64_t offset, const std::string& what) const;
  [[noreturn]] void fail_record(const WarcRecord& rec, const std::string& cause, const std::string& what);
  // The steps of next().
  bool read_version_line(WarcRecord& rec);
  void read_header_fields(WarcRecord& rec);
  int64_t content_length(const WarcRecord& rec);
  [[noreturn]] void skip_oversize_block(const WarcRecord& rec, int64_t len);

  std::string path_;
  int64_t max_record_bytes_;
  std::FILE* f_ = nullptr;
  bool gzip_ = false, eof_raw_ = false, member_open_ = false;
  int64_t file_bytes_ = 0, raw_pos_ = 0;  // raw bytes read from the file
  z_stream zs_{};                         // zs_.next_in, avail_in: the compressed bytes read, not yet used
  std::vector<unsigned char> raw_;
  std::unique_ptr<libdeflate_decompressor, void (*)(libdeflate_decompressor*)> deflate_{nullptr, nullptr};
  std::vector<char> member_out_;  // a whole member's bytes (whole_member)
  std::string buf_;               // decompressed bytes not yet consumed: buf_[pos_..]
  size_t pos_ = 0;
  int64_t out_pos_ = 0;  // decompressed bytes before buf_[0]
  // Decompressed position -> compressed offset of the member that starts there (gzip).
  std::map<int64_t, int64_t> members_;
  int64_t ordinal_ = 0;
  int64_t rec_start_ = 0;  // decompressed (gzip) or raw position of the last record start
  bool failed_ = false, gzip_fault_ = false, in_record_ = false;
  int64_t fault_member_ = 0;  // compressed offset of the member a gzip fault was in
};

// The conventional shard name of a WARC/WET input: its file name without `.gz`,
// `.warc` or `.wet` (and `.warc.wet`), e.g. CC-MAIN-x-00001.warc.gz -> CC-MAIN-x-00001.
std::string warc_stem(const std::string& path);

}  // namespace mtnlg::extract
