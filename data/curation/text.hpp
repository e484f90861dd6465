// Text normalisation and JSONL streaming shared by the curation tools (dedup,
// decontamination, quality classifier, synthetic corpus).
//
// Normalisation (one definition for every tool, so a 13-gram found by decontamination
// and a shingle hashed by dedup mean the same thing):
//   * ASCII letters are lower-cased, ASCII digits kept;
//   * bytes >= 0x80 (UTF-8 sequences) are kept as word characters, unchanged;
//   * ASCII punctuation and control characters inside a word are deleted
//     ("Don't" -> "dont", "U.S." -> "us");
//   * ASCII whitespace separates words; runs of whitespace count once.
// A word is therefore a maximal whitespace-free run with at least one kept byte.
// Every word keeps the byte range it came from, so `--mode cut` can map an n-gram
// match back to the original text.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/atomic_file.hpp"

namespace mtnlg::curation {

struct Word {
  uint32_t begin = 0;  // byte range [begin, end) in the original text
  uint32_t end = 0;
  uint64_t hash = 0;  // hash of the normalised word (FNV-1a 64, then mixed)
};

// Splits `text` into normalised words (appended to `out`, which is cleared first).
void normalize_words(std::string_view text, std::vector<Word>& out);

// The normalised text itself ("words joined by one space"); for tests and debugging.
std::string normalize_text(std::string_view text);

// Hash of the n consecutive words starting at `words[i]` (order-sensitive).
uint64_t ngram_hash(const Word* words, int64_t n);

// All word n-gram hashes of a document (one per start position). A document with
// fewer than n words but at least one yields ONE shingle over all its words (so short
// documents still match their exact copies); an empty document yields none.
void shingle_hashes(const std::vector<Word>& words, int64_t n, std::vector<uint64_t>& out);

// Reads a JSONL file line by line with a large buffer. Lines are returned without the
// trailing '\n' (a '\r' before it is kept: the line is written back byte-identical).
class LineReader {
 public:
  explicit LineReader(const std::string& path);
  // Bytes [begin, end) of the file (begin a line start, end -1 = the file's end); line
  // numbers continue from `lines_before` (the lines of the file before `begin`).
  LineReader(const std::string& path, int64_t begin, int64_t end, int64_t lines_before);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  // Next line; false at end of file. `line_no` is 1-based.
  bool next(std::string& line, int64_t& line_no);
  int64_t bytes_read() const { return bytes_read_; }
  const std::string& path() const { return path_; }

 private:
  bool refill();
  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<char> buf_;
  size_t pos_ = 0, len_ = 0;
  bool eof_ = false;
  int64_t line_no_ = 0;
  int64_t bytes_read_ = 0;
  int64_t limit_ = -1;  // bytes left in the range; -1 = no limit
};

// Lines and documents (non-blank lines) in bytes [begin, end) of a file: a rank of a
// multi-rank run counts its share so that all ranks agree on global line numbers and
// document indices before processing.
struct LineCounts {
  int64_t lines = 0, documents = 0;
};
LineCounts count_lines(const std::string& path, int64_t begin, int64_t end);

// True for a line holding only ASCII whitespace: not a document (skipped, counted).
bool is_blank_line(std::string_view line);

// Parses one JSONL line and returns the string field `key`. Throws InputError naming
// `path:line_no` for malformed JSON, a non-object line, a missing key (listing the
// keys present) or a non-string value.
std::string extract_text(const std::string& line, const std::string& key, const std::string& path, int64_t line_no);

// Writes a file under a temporary name, then renames it into place on close(), so a
// crash never leaves a half-written output (DESIGN invariant 6). Curation's name for
// core's AtomicFile (core/atomic_file.hpp), whose commit() is close() here.
class AtomicWriter {
 public:
  explicit AtomicWriter(std::string path) : f_(std::move(path)) {}
  void write(std::string_view s) { f_.write(s); }
  void write_line(std::string_view s) { f_.write_line(s); }
  void close() {
    if (!f_.committed()) f_.commit();
  }

 private:
  AtomicFile f_;
};

// Whole-file atomic write (core/atomic_file.hpp).
using mtnlg::write_file_atomic;

// File name without directories and without the last extension ("a/b.jsonl" -> "b").
std::string file_stem(const std::string& path);

}  // namespace mtnlg::curation
