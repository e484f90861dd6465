// `mtnlg data preprocess`: JSONL (plain, .gz, .zst) -> Megatron .bin/.idx per json key,
// the same output as Megatron's tools/preprocess_data.py without --split-sentences:
// each document is one sequence, --append-eod appends <|endoftext|> to non-empty
// documents, empty documents repeat the previous document boundary. The tokenizer is
// GPT-2's (vocab.json + merges.txt) or a Hugging Face tokenizer.json (data/hf_tokenizer.hpp,
// as Megatron's HuggingFaceTokenizer: each document encoded with the file's
// post-processor, so BOS where its template adds one, and its EOS as end of document).
//
// Parallelism: the reader cuts the input into batches of lines, N workers parse and
// tokenize batches, and one writer appends the results strictly in input order, so the
// files are byte-identical for any worker count. Several inputs are read one after the
// other into the same outputs: the files are those of preprocessing each input and
// merging the results in the given order (`data merge`), which is preprocessing their
// concatenation when every input ends with a newline. Output goes to temporary names that are
// renamed only after every key's pair is complete; on any error nothing is left behind.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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
  int64_t bytes_read() const;                       // compressed bytes consumed (for progress)
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

// Bytes [begin, end) of one input (a line-aligned range of a plain file), or the whole
// file (any format) when begin == 0 and end == -1.
struct InputPiece {
  std::string path;
  int64_t begin = 0, end = -1;
};

struct PreprocessOptions {
  std::vector<std::string> inputs;  // read in this order into one dataset per key
  std::string output_prefix;
  std::string vocab_file;  // GPT-2: vocab.json + merges.txt, or
  std::string merge_file;
  std::string tokenizer_file;  // a Hugging Face tokenizer.json
  // tokenizer.json: the end-of-document token's text; empty: eos_token of the
  // tokenizer_config.json beside it (needed with append_eod).
  std::string eod_token;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  int64_t workers = 1;
  bool skip_bad_lines = false;        // malformed lines are counted and skipped instead of fatal
  bool allow_special_tokens = false;  // GPT-2: "<|endoftext|>" in text -> 50256 (Megatron: plain text)
  bool progress = true;
  int64_t batch_lines = 512;  // lines per work item
  // When set, only these pieces of the inputs, in this order (split_inputs: a multi-rank
  // run gives each rank its share; it may be empty). Unset: every input whole.
  std::optional<std::vector<InputPiece>> pieces;
  // Called from the writing thread after each batch with its documents, tokens and the
  // input bytes read for it (compressed bytes for a .gz/.zst input; over the whole run
  // they add up to the pieces' sizes, or the files').
  std::function<void(int64_t docs, int64_t tokens, int64_t input_bytes)> on_progress;
};

// InputError (exit 2) naming the file when: there is no input, an input does not exist,
// two inputs are the same file (by path or by inode), or an output file of
// `output_prefix` (PREFIX_<key>_document.bin/.idx) is one of the inputs.
void check_preprocess_inputs(const std::vector<std::string>& inputs, const std::string& output_prefix,
                             const std::vector<std::string>& json_keys);
// Sum of the inputs' file sizes (compressed sizes for .gz/.zst).
int64_t total_input_bytes(const std::vector<std::string>& inputs);
// Share `part` of `parts` of the inputs taken as one byte stream (their concatenation in
// order): cut k is placed at byte floor(k * total / parts) and moved to the next line
// start of the plain file it falls in, or to the nearer end of a compressed file (which
// is never split: it is one unit of work). The shares are contiguous, cover every input
// in order, and some may be empty; a share lists its pieces file by file.
std::vector<InputPiece> split_inputs(const std::vector<std::string>& inputs, int64_t parts, int64_t part);
// "a.jsonl" for one input, "a.jsonl +2 more" for three (progress labels).
std::string inputs_label(const std::vector<std::string>& inputs);

struct PreprocessResult {
  int64_t documents = 0;              // documents written per key
  int64_t bad_lines = 0;              // skipped with skip_bad_lines
  std::string first_bad;              // "file:line: reason" of the first skipped line
  std::vector<int64_t> tokens;        // per json key
  std::vector<std::string> prefixes;  // output prefix per json key
  double seconds = 0;                 // total wall time
  double load_seconds = 0;            // reading the tokenizer files
  double flush_seconds = 0;           // fsync + rename of the outputs
};

// Output prefix for one key: PREFIX_<key>_document (Megatron's naming).
std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key);

PreprocessResult preprocess_jsonl(const PreprocessOptions& opt);

}  // namespace mtnlg::data
