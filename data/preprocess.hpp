// `mtnlg data preprocess`: JSONL (plain, .gz, .zst) -> Megatron .bin/.idx per json key,
// the same output as Megatron's tools/preprocess_data.py without --split-sentences:
// each document is one sequence, --append-eod appends <|endoftext|> to non-empty
// documents, empty documents repeat the previous document boundary.
//
// Parallelism: the reader cuts the input into batches of lines, N workers parse and
// tokenize batches, and one writer appends the results strictly in input order, so the
// files are byte-identical for any worker count. Output goes to temporary names that are
// renamed only after every key's pair is complete; on any error nothing is left behind.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mtnlg::data {

// Reads lines from plain, gzip or zstd files (detected by magic bytes, not extension).
class LineReader {
 public:
  explicit LineReader(const std::string& path);  // InputError if it cannot be opened
  // Bytes [begin, end) of a plain (uncompressed) file, end = -1 for its end; begin must
  // be a line start. Line numbers still count from the file's first line (the lines
  // before `begin` are counted when it opens). begin == end reads nothing (any file).
  LineReader(const std::string& path, int64_t begin, int64_t end);
  ~LineReader();
  // Next line without its '\n' (and a trailing '\r'); false at end of input.
  bool next(std::string& line);
  int64_t line_number() const { return line_no_; }  // 1-based number of the last line returned
  int64_t bytes_read() const;  // compressed bytes consumed (for progress)
  int64_t file_size() const { return file_size_; }

  struct Source;

 private:
  bool fill();
  std::string path_;
  std::unique_ptr<Source> src_;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  bool eof_ = false;
  int64_t line_no_ = 0, file_size_ = 0;
};

// True when the file starts with the gzip or zstd magic bytes.
bool input_is_compressed(const std::string& path);
// Part `part` of `parts` of a plain file cut at line boundaries: [begin, end) where the
// cut k is the first line start at or after byte floor(k * size / parts). The parts are
// contiguous, cover the file in order, and some may be empty.
std::pair<int64_t, int64_t> line_aligned_range(const std::string& path, int64_t parts, int64_t part);

struct PreprocessOptions {
  std::string input;
  std::string output_prefix;
  std::string vocab_file;
  std::string merge_file;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  int64_t workers = 1;
  bool skip_bad_lines = false;       // malformed lines are counted and skipped instead of fatal
  bool allow_special_tokens = false;  // "<|endoftext|>" in text -> 50256 (Megatron: plain text)
  bool progress = true;
  int64_t batch_lines = 512;  // lines per work item
  // Only bytes [range_begin, range_end) of the input (line_aligned_range; plain files),
  // range_end = -1 for the whole file. A multi-rank run gives each rank one range.
  int64_t range_begin = 0, range_end = -1;
  // Called from the writing thread after each batch with its documents, tokens and the
  // input bytes read for it (compressed bytes for a .gz/.zst input; over the whole run
  // they add up to the range's size, or the file's).
  std::function<void(int64_t docs, int64_t tokens, int64_t input_bytes)> on_progress;
};

struct PreprocessResult {
  int64_t documents = 0;     // documents written per key
  int64_t bad_lines = 0;     // skipped with skip_bad_lines
  std::string first_bad;     // "file:line: reason" of the first skipped line
  std::vector<int64_t> tokens;        // per json key
  std::vector<std::string> prefixes;  // output prefix per json key
  double seconds = 0;          // total wall time
  double load_seconds = 0;     // reading the tokenizer files
  double flush_seconds = 0;    // fsync + rename of the outputs
};

// Output prefix for one key: PREFIX_<key>_document (Megatron's naming).
std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key);

PreprocessResult preprocess_jsonl(const PreprocessOptions& opt);

}  // namespace mtnlg::data
