// Text normalisation and JSONL streaming for the curation tools (see text.hpp).
#include "data/curation/text.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace mtnlg::curation {

namespace {

// Byte classes for normalisation: 0 = separator (whitespace), 1 = dropped (ASCII
// punctuation/control), 2 = kept as is (digits, UTF-8 bytes), 3 = upper-case letter.
struct ByteClasses {
  uint8_t cls[256];
  constexpr ByteClasses() : cls{} {
    for (int c = 0; c < 256; ++c) {
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f')
        cls[c] = 0;
      else if (c >= 'A' && c <= 'Z')
        cls[c] = 3;
      else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c >= 0x80)
        cls[c] = 2;
      else
        cls[c] = 1;
    }
  }
};
constexpr ByteClasses kClasses{};

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

}  // namespace

void normalize_words(std::string_view text, std::vector<Word>& out) {
  out.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    while (i < n && kClasses.cls[p[i]] == 0) ++i;
    if (i >= n) break;
    size_t begin = i;
    uint64_t h = kFnvOffset;
    bool any = false;
    for (; i < n; ++i) {
      uint8_t c = kClasses.cls[p[i]];
      if (c == 0) break;
      if (c == 1) continue;
      unsigned char b = c == 3 ? static_cast<unsigned char>(p[i] + 32) : p[i];
      h = (h ^ b) * kFnvPrime;
      any = true;
    }
    if (any) out.push_back(Word{static_cast<uint32_t>(begin), static_cast<uint32_t>(i), mix64(h)});
  }
}

std::string normalize_text(std::string_view text) {
  std::vector<Word> words;
  normalize_words(text, words);
  std::string s;
  for (const auto& w : words) {
    if (!s.empty()) s.push_back(' ');
    for (uint32_t k = w.begin; k < w.end; ++k) {
      auto ch = static_cast<unsigned char>(text[k]);
      uint8_t c = kClasses.cls[ch];
      if (c == 2) s.push_back(static_cast<char>(ch));
      if (c == 3) s.push_back(static_cast<char>(ch + 32));
    }
  }
  return s;
}

uint64_t ngram_hash(const Word* words, int64_t n) {
  uint64_t h = 0x6a09e667f3bcc908ull ^ static_cast<uint64_t>(n);
  for (int64_t j = 0; j < n; ++j) h = mix64(h ^ words[j].hash);
  return h;
}

void shingle_hashes(const std::vector<Word>& words, int64_t n, std::vector<uint64_t>& out) {
  out.clear();
  const auto m = static_cast<int64_t>(words.size());
  if (m == 0) return;
  if (m < n) {
    out.push_back(ngram_hash(words.data(), m));
    return;
  }
  out.reserve(static_cast<size_t>(m - n + 1));
  for (int64_t i = 0; i + n <= m; ++i) out.push_back(ngram_hash(words.data() + i, n));
}

// ---------------------------------------------------------------------------------
LineReader::LineReader(const std::string& path) : path_(path), buf_(1 << 20) {
  f_ = std::fopen(path.c_str(), "rb");
  if (!f_) throw_input("{}: cannot open ({})", path, std::strerror(errno));
}

LineReader::LineReader(const std::string& path, int64_t begin, int64_t end, int64_t lines_before) : LineReader(path) {
  if (::fseeko(f_, begin, SEEK_SET) != 0)
    throw_runtime("{}: seek to byte {} failed ({})", path, begin, std::strerror(errno));
  if (end >= 0) limit_ = std::max<int64_t>(0, end - begin);
  line_no_ = lines_before;
}

LineCounts count_lines(const std::string& path, int64_t begin, int64_t end) {
  LineReader r(path, begin, end, 0);
  LineCounts c;
  std::string line;
  int64_t no = 0;
  while (r.next(line, no)) {
    ++c.lines;
    c.documents += !is_blank_line(line);
  }
  return c;
}

LineReader::~LineReader() {
  if (f_) std::fclose(f_);
}

bool LineReader::refill() {
  if (eof_) return false;
  // Keep the unconsumed tail, then read more after it.
  if (pos_ > 0) {
    std::memmove(buf_.data(), buf_.data() + pos_, len_ - pos_);
    len_ -= pos_;
    pos_ = 0;
  }
  if (len_ == buf_.size()) buf_.resize(buf_.size() * 2);  // a line longer than the buffer
  size_t want = buf_.size() - len_;
  if (limit_ >= 0) want = std::min(want, static_cast<size_t>(limit_));
  size_t got = want == 0 ? 0 : std::fread(buf_.data() + len_, 1, want, f_);
  if (limit_ >= 0) limit_ -= static_cast<int64_t>(got);
  if (got == 0) {
    if (want > 0 && std::ferror(f_)) throw_runtime("{}: read error", path_);
    eof_ = true;
    return false;
  }
  len_ += got;
  bytes_read_ += static_cast<int64_t>(got);
  return true;
}

bool LineReader::next(std::string& line, int64_t& line_no) {
  size_t scan_from = pos_;
  for (;;) {
    const void* nl = std::memchr(buf_.data() + scan_from, '\n', len_ - scan_from);
    if (nl) {
      size_t end = static_cast<size_t>(static_cast<const char*>(nl) - buf_.data());
      line.assign(buf_.data() + pos_, end - pos_);
      pos_ = end + 1;
      line_no = ++line_no_;
      return true;
    }
    size_t consumed = len_ - pos_;
    if (!refill()) {
      if (len_ > pos_) {  // last line without '\n'
        line.assign(buf_.data() + pos_, len_ - pos_);
        pos_ = len_;
        line_no = ++line_no_;
        return true;
      }
      return false;
    }
    scan_from = pos_ + consumed;
  }
}

bool is_blank_line(std::string_view line) {
  for (char c : line)
    if (kClasses.cls[static_cast<unsigned char>(c)] != 0) return false;
  return true;
}

std::string extract_text(const std::string& line, const std::string& key, const std::string& path, int64_t line_no) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a huge number
    // nlohmann's message names the byte; keep only the part after the prefix.
    std::string what = e.what();
    auto pos = what.find("parse error");
    if (pos == std::string::npos) pos = what.find("] ") == std::string::npos ? std::string::npos : what.find("] ") + 2;
    throw_input("{}:{}: malformed JSON line ({})", path, line_no, pos == std::string::npos ? what : what.substr(pos));
  }
  if (!j.is_object()) throw_input("{}:{}: expected a JSON object per line, got {}", path, line_no, j.type_name());
  auto it = j.find(key);
  if (it == j.end()) {
    std::string keys;
    for (auto& [k, v] : j.items()) keys += (keys.empty() ? "" : ", ") + k;
    throw_input("{}:{}: no field \"{}\" (fields present: {}; choose one with --json-key)", path, line_no, key,
                keys.empty() ? "none" : keys);
  }
  if (!it->is_string())
    throw_input("{}:{}: field \"{}\" is {}, expected a string", path, line_no, key, it->type_name());
  return it->get<std::string>();
}

std::string file_stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

}  // namespace mtnlg::curation
