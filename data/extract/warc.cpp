// WARC reader: see warc.hpp and docs/specs/warc.md.
#include "data/extract/warc.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace mtnlg::extract {

namespace {

constexpr size_t kRawChunk = 1 << 16;
// A gzip member is decompressed whole by libdeflate (about three times zlib's speed) when
// it is complete in the compressed bytes read (those grow to at least kWholeMemberIn while
// it is not) and decompresses to at most kWholeMemberOut; other members, and any libdeflate
// does not decompress (a corrupt one: zlib then gives what it holds before the fault, and
// the fault), are streamed through zlib. Memory stays bounded either way. The bounds hold a
// file written as one gzip member (`gzip file.warc`) of up to 64 MiB: read whole at the
// first read, it is decompressed in one call into a buffer its trailer sizes.
constexpr size_t kWholeMemberIn = size_t{64} << 20, kWholeMemberOut = size_t{256} << 20;
constexpr size_t kRawGzip = size_t{512} << 10;  // compressed bytes read at a time
constexpr size_t kMaxHeaderLine = 1 << 16;
constexpr int kMaxHeaders = 1024;

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A header line shown in an error: printable ASCII, at most 60 characters.
std::string shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 60)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > 60) out += "...";
  return out;
}

}  // namespace

std::string_view WarcRecord::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return {};
}

std::string warc_stem(const std::string& path) {
  std::string n = std::filesystem::path(path).filename().string();
  for (const char* suf : {".gz", ".wet", ".warc", ".wet"}) {
    const size_t l = std::strlen(suf);
    if (n.size() > l && n.compare(n.size() - l, l, suf) == 0) n.resize(n.size() - l);
  }
  return n;
}

WarcReader::WarcReader(std::string path, int64_t max_record_bytes)
    : path_(std::move(path)), max_record_bytes_(max_record_bytes) {
  f_ = std::fopen(path_.c_str(), "rb");
  if (!f_) throw_input("{}: cannot open ({})", path_, std::strerror(errno));
  std::error_code ec;
  file_bytes_ = static_cast<int64_t>(std::filesystem::file_size(path_, ec));
  unsigned char magic[2] = {0, 0};
  const size_t got = std::fread(magic, 1, 2, f_);
  gzip_ = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  std::rewind(f_);
  raw_.resize(gzip_ ? kRawGzip : kRawChunk);
  if (gzip_ && file_bytes_ > 0 && static_cast<size_t>(file_bytes_) <= kWholeMemberIn) {
    raw_.resize(static_cast<size_t>(file_bytes_));  // the whole file at the first read
  }
  if (gzip_ && inflateInit2(&zs_, 15 + 16) != Z_OK) throw_runtime("{}: zlib initialisation failed", path_);
  if (gzip_) {
    deflate_ = {libdeflate_alloc_decompressor(), libdeflate_free_decompressor};
    if (!deflate_) throw_runtime("{}: libdeflate initialisation failed", path_);
  }
}

WarcReader::~WarcReader() {
  if (gzip_) inflateEnd(&zs_);
  if (f_) std::fclose(f_);
}

void WarcReader::fail(const std::string& cause, int64_t ordinal, int64_t offset, const std::string& what) const {
  throw WarcError(cause, fmt::format("{}: record {} at byte {}: {}", path_, ordinal, offset, what));
}

int64_t WarcReader::record_offset() const {
  const int64_t p = out_pos_ + static_cast<int64_t>(pos_);
  if (!gzip_) return p;
  auto it = members_.upper_bound(p);
  if (it == members_.begin()) return 0;
  return std::prev(it)->second;
}

bool WarcReader::fill() {
  if (pos_ > (1u << 20) && pos_ * 2 > buf_.size()) {  // drop consumed bytes
    buf_.erase(0, pos_);
    out_pos_ += static_cast<int64_t>(pos_);
    pos_ = 0;
  }
  if (!gzip_) {
    if (eof_raw_) return false;
    const size_t n = std::fread(raw_.data(), 1, raw_.size(), f_);
    if (n == 0) {
      if (std::ferror(f_)) throw_runtime("{}: read error ({})", path_, std::strerror(errno));
      eof_raw_ = true;
      return false;
    }
    raw_pos_ += static_cast<int64_t>(n);
    buf_.append(reinterpret_cast<const char*>(raw_.data()), n);
    return true;
  }
  unsigned char out[kRawChunk];
  for (;;) {
    if (!member_open_ && whole_member()) return true;
    if (zs_.avail_in == 0) {
      const size_t n = eof_raw_ ? 0 : std::fread(raw_.data(), 1, raw_.size(), f_);
      if (n == 0) {
        if (std::ferror(f_)) throw_runtime("{}: read error ({})", path_, std::strerror(errno));
        eof_raw_ = true;
        if (member_open_) {
          const int64_t start = fault_member_ = std::prev(members_.end())->second;
          failed_ = gzip_fault_ = true;
          fail("gzip", in_record_ ? ordinal_ : ordinal_ + 1, start, "gzip member cut short (the file ends inside it)");
        }
        return false;
      }
      zs_.next_in = raw_.data();
      zs_.avail_in = static_cast<uInt>(n);
      raw_pos_ += static_cast<int64_t>(n);
    }
    if (!member_open_) {
      const int64_t dpos = out_pos_ + static_cast<int64_t>(buf_.size());
      members_[dpos] = raw_pos_ - static_cast<int64_t>(zs_.avail_in);
      // Keep the member of the current record's first byte and those after it.
      auto keep = members_.upper_bound(rec_start_);
      if (keep != members_.begin()) members_.erase(members_.begin(), std::prev(keep));
      member_open_ = true;
    }
    zs_.next_out = out;
    zs_.avail_out = sizeof(out);
    const int ret = inflate(&zs_, Z_NO_FLUSH);
    const size_t produced = sizeof(out) - zs_.avail_out;
    buf_.append(reinterpret_cast<const char*>(out), produced);
    if (ret == Z_STREAM_END) {
      inflateReset(&zs_);
      member_open_ = false;
    } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
      const int64_t start = fault_member_ = std::prev(members_.end())->second;
      failed_ = gzip_fault_ = true;
      fail("gzip", in_record_ ? ordinal_ : ordinal_ + 1, start,
           fmt::format("corrupt gzip member ({})", zs_.msg ? zs_.msg : "inflate error"));
    }
    if (produced > 0 || ret == Z_STREAM_END) return true;
  }
}

// More compressed bytes after the unread ones (moved to the front of raw_, which grows to
// hold twice as many); false at the end of the file.
bool WarcReader::more_raw() {
  if (eof_raw_) return false;
  const size_t have = zs_.avail_in;
  if (have > 0 && zs_.next_in != raw_.data()) std::memmove(raw_.data(), zs_.next_in, have);
  if (raw_.size() < 2 * have) raw_.resize(2 * have);
  const size_t n = std::fread(raw_.data() + have, 1, raw_.size() - have, f_);
  if (n == 0) {
    if (std::ferror(f_)) throw_runtime("{}: read error ({})", path_, std::strerror(errno));
    eof_raw_ = true;
  }
  raw_pos_ += static_cast<int64_t>(n);
  zs_.next_in = raw_.data();
  zs_.avail_in = static_cast<uInt>(have + n);
  return n > 0;
}

// The gzip member that starts at zs_.next_in, decompressed whole by libdeflate into buf_:
// false (nothing consumed, zs_ still at the member) when it is not whole in at most
// kWholeMemberIn compressed bytes, is larger than kWholeMemberOut, is not a valid member
// (zlib then reads it as before: its error, or what it holds before a fault), or has a
// header CRC (which libdeflate does not check and zlib does).
bool WarcReader::whole_member() {
  // Compressed bytes ahead: at least kLow (raw_ is then refilled, to its size) unless the
  // file ends first, so a member is seldom cut at the end of what was read.
  constexpr size_t kLow = size_t{64} << 10;
  if (zs_.avail_in < kLow && !eof_raw_) more_raw();
  if (zs_.avail_in < 10 || (zs_.next_in[3] & 0x02) != 0) return false;  // no header yet, or FHCRC
  if (member_out_.empty()) member_out_.resize(size_t{256} << 10);
  if (const size_t size = trailer_size(); size > member_out_.size() && member_into_buffer(size)) return true;
  for (;;) {
    size_t in_used = 0, out_used = 0;
    const auto r = libdeflate_gzip_decompress_ex(deflate_.get(), zs_.next_in, zs_.avail_in, member_out_.data(),
                                                 member_out_.size(), &in_used, &out_used);
    if (r == LIBDEFLATE_SUCCESS) {
      took_member(buf_.size(), in_used);
      buf_.append(member_out_.data(), out_used);
      return true;
    }
    if (r == LIBDEFLATE_INSUFFICIENT_SPACE && member_out_.size() < kWholeMemberOut) {
      member_out_.resize(2 * member_out_.size());
    } else if (r == LIBDEFLATE_BAD_DATA && zs_.avail_in < kWholeMemberIn && !eof_raw_) {
      more_raw();  // the member may go on past the bytes read
    } else {
      return false;
    }
  }
}

// A member decompressed whole: its start (its output at buf_[at]) is recorded, its
// compressed bytes consumed.
void WarcReader::took_member(size_t at, size_t in_used) {
  members_[out_pos_ + static_cast<int64_t>(at)] = raw_pos_ - static_cast<int64_t>(zs_.avail_in);
  auto keep = members_.upper_bound(rec_start_);  // as in fill()
  if (keep != members_.begin()) members_.erase(members_.begin(), std::prev(keep));
  zs_.next_in += in_used;
  zs_.avail_in -= static_cast<uInt>(in_used);
}

// When the compressed bytes ahead end the file, their last 4 bytes are the last member's
// size (ISIZE, modulo 2^32): for a file of one member, the size of the member at
// zs_.next_in. 0 when they do not end the file or the size is over kWholeMemberOut.
size_t WarcReader::trailer_size() const {
  if (raw_pos_ != file_bytes_ || zs_.avail_in < 18) return 0;
  const unsigned char* t = zs_.next_in + zs_.avail_in - 4;
  const size_t isize = size_t{t[0]} | size_t{t[1]} << 8 | size_t{t[2]} << 16 | size_t{t[3]} << 24;
  return isize <= kWholeMemberOut ? isize : 0;
}

// The member at zs_.next_in decompressed straight to the end of buf_ when it is `size`
// bytes or fewer, in one attempt (the doubling buffer of whole_member decompresses again
// from the member's start at each try, and its bytes are then copied); false, buf_ as it
// was, otherwise.
bool WarcReader::member_into_buffer(size_t size) {
  const size_t at = buf_.size();
  buf_.resize(at + size);
  size_t in_used = 0, out_used = 0;
  const auto r = libdeflate_gzip_decompress_ex(deflate_.get(), zs_.next_in, zs_.avail_in, buf_.data() + at, size,
                                               &in_used, &out_used);
  buf_.resize(r == LIBDEFLATE_SUCCESS ? at + out_used : at);
  if (r != LIBDEFLATE_SUCCESS) return false;
  took_member(at, in_used);
  return true;
}

bool WarcReader::read_line(std::string& line, size_t max) {
  line.clear();
  for (;;) {
    const size_t nl = buf_.find('\n', pos_);
    if (nl != std::string::npos) {
      line.assign(buf_, pos_, nl - pos_);
      pos_ = nl + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return true;
    }
    if (buf_.size() - pos_ > max) {
      line.assign(buf_, pos_, max);
      return true;  // the caller sees an over-long line and fails
    }
    if (!fill()) {
      if (pos_ == buf_.size()) return false;
      line.assign(buf_, pos_, std::string::npos);
      pos_ = buf_.size();
      return true;
    }
  }
}

bool WarcReader::read_exact(std::string& out, size_t n) {
  out.clear();
  while (out.size() < n) {
    if (pos_ == buf_.size()) {
      if (!fill()) return false;
      continue;
    }
    const size_t take = std::min(n - out.size(), buf_.size() - pos_);
    out.append(buf_, pos_, take);
    pos_ += take;
  }
  return true;
}

// A record in four steps: its version line, its header fields, its Content-Length, its
// block and closing CRLF CRLF. Every fault but an oversize block leaves the reader
// failed (resync() finds the next record); an oversize block is skipped first.
bool WarcReader::next(WarcRecord& rec) {
  in_record_ = false;
  if (!read_version_line(rec)) return false;
  read_header_fields(rec);
  const int64_t len = content_length(rec);
  if (len > max_record_bytes_) skip_oversize_block(rec, len);
  if (!read_exact(rec.block, static_cast<size_t>(len)))
    fail_record(rec, "truncated",
                fmt::format("block cut short: Content-Length {} but only {} bytes follow", len, rec.block.size()));
  std::string line;
  for (int k = 0; k < 2; ++k) {  // the record ends with CRLF CRLF
    if (!read_line(line, 64)) fail_record(rec, "truncated", "the file ends before the record's closing CRLF CRLF");
    if (!line.empty())
      fail_record(rec, "header",
                  fmt::format("expected CRLF CRLF after the {}-byte block (is Content-Length right?), found '{}'", len,
                              shown(line)));
  }
  in_record_ = false;
  return true;
}

void WarcReader::fail_record(const WarcRecord& rec, const std::string& cause, const std::string& what) {
  failed_ = true;
  fail(cause, rec.ordinal, rec.offset, what);
}

// The record's first line (blank lines between records are tolerated: some writers add
// them); false at a clean end of the file.
bool WarcReader::read_version_line(WarcRecord& rec) {
  std::string line;
  for (;;) {
    if (pos_ == buf_.size() && !fill()) return false;
    const int64_t off = record_offset();
    const int64_t dpos = out_pos_ + static_cast<int64_t>(pos_);
    if (!read_line(line, kMaxHeaderLine)) return false;
    if (line.empty()) continue;
    rec = WarcRecord{};
    rec.ordinal = ++ordinal_;
    rec.offset = off;
    rec_start_ = gzip_ ? dpos : off;
    in_record_ = true;
    break;
  }
  if (line.rfind("WARC/", 0) != 0)
    fail_record(rec, "header",
                fmt::format("expected the version line 'WARC/1.0' or 'WARC/1.1', found '{}'", shown(line)));
  if (line != "WARC/1.0" && line != "WARC/1.1")
    fail_record(rec, "header", fmt::format("unsupported version '{}' (1.0 and 1.1 are read)", shown(line)));
  rec.version = line;
  return true;
}

// "Name: value" lines up to the blank line; a line starting with a space or tab
// continues the previous value.
void WarcReader::read_header_fields(WarcRecord& rec) {
  std::string line;
  for (;;) {
    if (!read_line(line, kMaxHeaderLine)) fail_record(rec, "truncated", "the file ends inside the record's header");
    if (line.empty()) break;
    if (line.size() >= kMaxHeaderLine) fail_record(rec, "header", "a header line longer than 64 KiB");
    if ((line[0] == ' ' || line[0] == '\t') && !rec.headers.empty()) {  // folded continuation
      rec.headers.back().second += " ";
      rec.headers.back().second += trim(line);
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0)
      fail_record(rec, "header", fmt::format("header line '{}' is not 'Name: value'", shown(line)));
    if (static_cast<int>(rec.headers.size()) >= kMaxHeaders) fail_record(rec, "header", "more than 1024 header fields");
    rec.headers.emplace_back(std::string(trim(std::string_view(line).substr(0, colon))),
                             std::string(trim(std::string_view(line).substr(colon + 1))));
  }
  if (rec.type().empty()) fail_record(rec, "header", "WARC-Type: missing");
}

int64_t WarcReader::content_length(const WarcRecord& rec) {
  const std::string_view cl = rec.header("Content-Length");
  if (cl.empty()) fail_record(rec, "header", "Content-Length: missing");
  int64_t len = 0;
  for (char c : cl) {
    if (c < '0' || c > '9' || len > (int64_t{1} << 50))
      fail_record(rec, "header", fmt::format("Content-Length: '{}' is not a byte count", shown(cl)));
    len = len * 10 + (c - '0');
  }
  return len;
}

// Skips the block so the next record can be read, then fails the record as oversize (the
// caller decides whether to go on; the reader is not failed: it is at the next record).
void WarcReader::skip_oversize_block(const WarcRecord& rec, int64_t len) {
  for (int64_t left = len; left > 0;) {
    if (pos_ == buf_.size() && !fill())
      fail_record(rec, "truncated", fmt::format("the file ends inside the block (Content-Length {})", len));
    const int64_t take = std::min<int64_t>(left, static_cast<int64_t>(buf_.size() - pos_));
    pos_ += static_cast<size_t>(take);
    left -= take;
  }
  std::string end;
  read_line(end, 4);
  read_line(end, 4);
  in_record_ = false;
  fail("oversize", rec.ordinal, rec.offset,
       fmt::format("Content-Length {} is over the record size cap of {} bytes (--max-record-bytes)", len,
                   max_record_bytes_));
}

void WarcReader::seek_raw(int64_t off) {
  if (fseeko(f_, off, SEEK_SET) != 0)
    throw_runtime("{}: cannot seek to byte {} ({})", path_, off, std::strerror(errno));
  in_record_ = false;
  out_pos_ += static_cast<int64_t>(buf_.size());
  buf_.clear();
  pos_ = 0;
  raw_pos_ = off;
  eof_raw_ = false;
  members_.clear();
  member_open_ = false;
  if (gzip_) {
    inflateReset(&zs_);
    zs_.avail_in = 0;
  } else {
    out_pos_ = off;
  }
}

// The first occurrence of `pat` in the raw file at or after byte `from` (a '\n' before
// it when `line_start`), or -1.
int64_t WarcReader::find_raw(int64_t from, std::string_view pat, bool line_start) {
  std::vector<char> chunk(1 << 16);
  const size_t keep = pat.size();  // overlap between chunks
  int64_t base = from;
  std::string window;
  if (fseeko(f_, from, SEEK_SET) != 0) return -1;
  for (;;) {
    const size_t n = std::fread(chunk.data(), 1, chunk.size(), f_);
    if (n == 0) return -1;
    window.append(chunk.data(), n);
    size_t at = 0;
    while ((at = window.find(pat, at)) != std::string::npos) {
      const int64_t abs = base + static_cast<int64_t>(at);
      if (!line_start || (at > 0 && window[at - 1] == '\n')) return abs;
      ++at;
    }
    if (window.size() > keep) {
      const size_t drop = window.size() - keep;
      window.erase(0, drop);
      base += static_cast<int64_t>(drop);
    }
  }
}

bool WarcReader::resync() {
  if (!failed_) return true;  // already at the next record (after an oversize record)
  failed_ = false;
  if (!gzip_) {
    const int64_t at = find_raw(rec_start_ + 1, "WARC/1.", true);
    if (at < 0) {
      seek_raw(file_bytes_);
      eof_raw_ = true;
      return false;
    }
    seek_raw(at);
    return true;
  }
  // gzip: the member holding the failed record's first byte, and the one after it.
  auto m = members_.upper_bound(rec_start_);
  const int64_t member_start = m == members_.begin() ? 0 : std::prev(m)->second;
  int64_t next_member = -1;
  if (!gzip_fault_ && m != members_.end()) next_member = m->second;
  if (next_member < 0 && !gzip_fault_) {
    // The member is intact so far: inflate to its end; what follows starts a record.
    try {
      while (member_open_ && fill()) {}
      if (!member_open_) {
        const int64_t end_raw = raw_pos_ - static_cast<int64_t>(zs_.avail_in);
        seek_raw(end_raw);
        return end_raw < file_bytes_;
      }
      return false;  // end of file
    } catch (const WarcError&) {
      failed_ = false;
    }
  }
  if (next_member < 0) {
    static constexpr char kMagic[] = {'\x1f', '\x8b', '\x08'};
    next_member = find_raw((gzip_fault_ ? fault_member_ : member_start) + 1, std::string_view(kMagic, 3), false);
  }
  gzip_fault_ = false;
  if (next_member < 0) {
    seek_raw(file_bytes_);
    eof_raw_ = true;
    return false;
  }
  seek_raw(next_member);
  return true;
}

}  // namespace mtnlg::extract
