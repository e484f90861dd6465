// JSONL -> Megatron indexed dataset (see preprocess.hpp).
#include "data/preprocess.hpp"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.hpp"
#include "core/progress.hpp"
#include "data/indexed_dataset.hpp"
#include "data/text_tokenizer.hpp"

namespace mtnlg::data {

// ----- input sources --------------------------------------------------------------------
struct LineReader::Source {
  virtual ~Source() = default;
  virtual int64_t read(char* dst, int64_t n) = 0;  // 0 at end
  virtual int64_t consumed() const = 0;
};

namespace {

struct PlainSource : LineReader::Source {
  std::FILE* f;
  std::string path;
  int64_t done = 0;
  int64_t limit = -1;  // bytes left to read; -1 = to the end of the file
  PlainSource(std::FILE* file, std::string p) : f(file), path(std::move(p)) {}
  ~PlainSource() override {
    if (f) std::fclose(f);
  }
  int64_t read(char* dst, int64_t n) override {
    if (!f || limit == 0) return 0;
    if (limit > 0) n = std::min(n, limit);
    const size_t got = std::fread(dst, 1, static_cast<size_t>(n), f);
    if (limit > 0) limit -= static_cast<int64_t>(got);
    if (got == 0 && std::ferror(f)) throw_runtime("{}: read failed ({})", path, std::strerror(errno));
    done += static_cast<int64_t>(got);
    return static_cast<int64_t>(got);
  }
  int64_t consumed() const override { return done; }
};

struct GzipSource : LineReader::Source {
  gzFile g;
  std::string path;
  explicit GzipSource(const std::string& p) : path(p) {
    g = gzopen(p.c_str(), "rb");
    if (!g) throw_input("{}: cannot open ({})", p, std::strerror(errno));
    gzbuffer(g, 1 << 18);
  }
  ~GzipSource() override { gzclose(g); }
  int64_t read(char* dst, int64_t n) override {
    const int got = gzread(g, dst, static_cast<unsigned>(n));
    if (got < 0) {
      int err = 0;
      const char* msg = gzerror(g, &err);
      throw_input("{}: corrupt gzip data ({})", path, msg ? msg : "?");
    }
    if (got == 0 && !gzeof(g)) {
      int err = 0;
      const char* msg = gzerror(g, &err);
      if (err != Z_OK) throw_input("{}: corrupt gzip data ({})", path, msg ? msg : "?");
    }
    return got;
  }
  int64_t consumed() const override { return static_cast<int64_t>(gzoffset(g)); }
};

struct ZstdSource : LineReader::Source {
  std::FILE* f;
  std::string path;
  ZSTD_DStream* ds;
  std::vector<char> in;
  ZSTD_inBuffer ib{nullptr, 0, 0};
  int64_t done = 0;
  bool in_eof = false;
  size_t last_ret = 0;
  ZstdSource(std::FILE* file, std::string p) : f(file), path(std::move(p)) {
    ds = ZSTD_createDStream();
    ZSTD_initDStream(ds);
    in.resize(ZSTD_DStreamInSize());
    ib.src = in.data();
  }
  ~ZstdSource() override {
    ZSTD_freeDStream(ds);
    std::fclose(f);
  }
  int64_t read(char* dst, int64_t n) override {
    ZSTD_outBuffer ob{dst, static_cast<size_t>(n), 0};
    while (ob.pos == 0) {
      if (ib.pos == ib.size) {
        if (in_eof) {
          if (last_ret != 0) throw_input("{}: truncated zstd stream", path);
          return 0;
        }
        const size_t got = std::fread(in.data(), 1, in.size(), f);
        if (got == 0) {
          if (std::ferror(f)) throw_runtime("{}: read failed ({})", path, std::strerror(errno));
          in_eof = true;
          continue;
        }
        done += static_cast<int64_t>(got);
        ib.size = got;
        ib.pos = 0;
      }
      last_ret = ZSTD_decompressStream(ds, &ob, &ib);
      if (ZSTD_isError(last_ret)) throw_input("{}: corrupt zstd data ({})", path, ZSTD_getErrorName(last_ret));
    }
    return static_cast<int64_t>(ob.pos);
  }
  int64_t consumed() const override { return done; }
};

}  // namespace

bool input_is_compressed(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw_input("{}: cannot open ({})", path, std::strerror(errno));
  unsigned char m[4] = {0, 0, 0, 0};
  const size_t got = std::fread(m, 1, 4, f);
  std::fclose(f);
  return (got >= 2 && m[0] == 0x1f && m[1] == 0x8b) ||
         (got == 4 && m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd);
}

namespace {
// First p >= target of the open file f (of `size` bytes) with byte p-1 == '\n' (a line
// start); size when there is none.
int64_t next_line_start(std::FILE* f, const std::string& path, int64_t target, int64_t size) {
  if (target <= 0) return 0;
  if (target >= size) return size;
  if (::fseeko(f, target - 1, SEEK_SET) != 0) throw_runtime("{}: seek failed ({})", path, std::strerror(errno));
  char buf[1 << 16];
  int64_t pos = target - 1;
  while (true) {
    const size_t got = std::fread(buf, 1, sizeof buf, f);
    if (got == 0) return size;
    const void* nl = std::memchr(buf, '\n', got);
    if (nl) return pos + (static_cast<const char*>(nl) - buf) + 1;
    pos += static_cast<int64_t>(got);
  }
}

int64_t input_size(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw_input("{}: input file not found", path);
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw_input("{}: cannot read its size ({})", path, ec.message());
  return static_cast<int64_t>(size);
}
}  // namespace

std::pair<int64_t, int64_t> line_aligned_range(const std::string& path, int64_t parts, int64_t part) {
  MTNLG_CHECK(parts >= 1 && part >= 0 && part < parts, "part {} of {}", part, parts);
  const int64_t size = input_size(path);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw_input("{}: cannot open ({})", path, std::strerror(errno));
  auto cut = [&](int64_t k) -> int64_t {
    if (k == 0) return 0;
    if (k == parts) return size;
    return next_line_start(f, path, static_cast<int64_t>((static_cast<__int128>(k) * size) / parts), size);
  };
  std::pair<int64_t, int64_t> r;
  try {
    r = {cut(part), cut(part + 1)};
  } catch (...) {
    std::fclose(f);
    throw;
  }
  std::fclose(f);
  return r;
}

void check_preprocess_inputs(const std::vector<std::string>& inputs, const std::string& output_prefix,
                             const std::vector<std::string>& json_keys) {
  namespace fs = std::filesystem;
  if (inputs.empty()) throw_input("--input: at least one input file is needed");
  for (const auto& in : inputs) input_size(in);
  for (size_t a = 0; a < inputs.size(); ++a)
    for (size_t b = a + 1; b < inputs.size(); ++b) {
      std::error_code ec;
      if (inputs[a] == inputs[b] || fs::equivalent(inputs[a], inputs[b], ec))
        throw_input("--input: {} and {} are the same file (give each input once)", inputs[a], inputs[b]);
    }
  for (const auto& k : json_keys) {
    const std::string prefix = preprocess_output_prefix(output_prefix, k);
    for (const std::string& out : {bin_path(prefix), idx_path(prefix)}) {
      std::error_code ec;
      if (!fs::exists(out, ec)) continue;
      for (const auto& in : inputs)
        if (fs::equivalent(out, in, ec))
          throw_input("--output-prefix {}: the output {} is the input {}", output_prefix, out, in);
    }
  }
}

int64_t total_input_bytes(const std::vector<std::string>& inputs) {
  int64_t total = 0;
  for (const auto& in : inputs) total += input_size(in);
  return total;
}

std::vector<InputPiece> split_inputs(const std::vector<std::string>& inputs, int64_t parts, int64_t part) {
  MTNLG_CHECK(parts >= 1 && part >= 0 && part < parts, "part {} of {}", part, parts);
  const size_t n = inputs.size();
  std::vector<int64_t> start(n + 1, 0);
  std::vector<char> compressed(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t size = input_size(inputs[i]);
    start[i + 1] = start[i] + size;
    compressed[i] = size > 0 && input_is_compressed(inputs[i]);
  }
  const int64_t total = start[n];
  // Cut k in the concatenation; every cut lies on a file boundary or a line start of a
  // plain file, and cuts never decrease with k.
  auto cut = [&](int64_t k) -> int64_t {
    if (k == 0) return 0;
    if (k == parts) return total;
    const int64_t t = static_cast<int64_t>((static_cast<__int128>(k) * total) / parts);
    size_t f = 0;
    while (f < n && start[f + 1] <= t) ++f;  // the file holding byte t (t < total)
    const int64_t off = t - start[f], size = start[f + 1] - start[f];
    if (off == 0) return start[f];
    if (compressed[f]) return 2 * off < size ? start[f] : start[f + 1];
    std::FILE* fp = std::fopen(inputs[f].c_str(), "rb");
    if (!fp) throw_input("{}: cannot open ({})", inputs[f], std::strerror(errno));
    int64_t p = 0;
    try {
      p = next_line_start(fp, inputs[f], off, size);
    } catch (...) {
      std::fclose(fp);
      throw;
    }
    std::fclose(fp);
    return start[f] + p;
  };
  const int64_t lo = cut(part), hi = cut(part + 1);
  std::vector<InputPiece> pieces;
  for (size_t i = 0; i < n; ++i) {
    const int64_t b = std::max(lo, start[i]), e = std::min(hi, start[i + 1]);
    if (b >= e) continue;
    if (b == start[i] && e == start[i + 1]) {
      pieces.push_back({inputs[i], 0, -1});  // the whole file, any format
    } else {
      MTNLG_CHECK(!compressed[i], "{}: a compressed input was split", inputs[i]);
      pieces.push_back({inputs[i], b - start[i], e - start[i]});
    }
  }
  return pieces;
}

std::string inputs_label(const std::vector<std::string>& inputs) {
  if (inputs.empty()) return "";
  std::string s = std::filesystem::path(inputs[0]).filename().string();
  if (inputs.size() > 1) s += fmt::format(" +{} more", inputs.size() - 1);
  return s;
}

LineReader::LineReader(const std::string& path, int64_t begin, int64_t end) : path_(path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw_input("{}: input file not found", path);
  file_size_ = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  buf_.resize(1 << 20);
  if (end < 0) end = file_size_;
  MTNLG_CHECK(begin >= 0 && begin <= end && end <= file_size_, "byte range [{}, {}) of a {}-byte file", begin, end,
              file_size_);
  std::FILE* f = nullptr;
  if (begin < end) {
    if (input_is_compressed(path))
      throw_input("{}: a compressed file cannot be read from a byte offset (split plain JSONL files only)", path);
    f = std::fopen(path.c_str(), "rb");
    if (!f) throw_input("{}: cannot open ({})", path, std::strerror(errno));
    // Lines before the range, so that errors name the file's real line numbers.
    int64_t left = begin;
    while (left > 0) {
      const size_t got = std::fread(buf_.data(), 1, static_cast<size_t>(std::min<int64_t>(left, 1 << 20)), f);
      if (got == 0) throw_runtime("{}: read failed before byte {}", path, begin);
      line_no_ += std::count(buf_.data(), buf_.data() + got, '\n');
      left -= static_cast<int64_t>(got);
    }
  }
  auto src = std::make_unique<PlainSource>(f, path);
  src->limit = end - begin;
  src_ = std::move(src);
}

LineReader::LineReader(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw_input("{}: input file not found", path);
  file_size_ = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw_input("{}: cannot open ({})", path, std::strerror(errno));
  unsigned char magic[4] = {0, 0, 0, 0};
  const size_t got = std::fread(magic, 1, 4, f);
  std::rewind(f);
  if (got >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    std::fclose(f);
    src_ = std::make_unique<GzipSource>(path);
  } else if (got == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd) {
    src_ = std::make_unique<ZstdSource>(f, path);
  } else {
    src_ = std::make_unique<PlainSource>(f, path);
  }
  buf_.resize(1 << 20);
}

LineReader::~LineReader() = default;

int64_t LineReader::bytes_read() const { return src_->consumed(); }

bool LineReader::fill() {
  if (eof_) return false;
  if (pos_ > 0) {
    std::memmove(buf_.data(), buf_.data() + pos_, end_ - pos_);
    end_ -= pos_;
    pos_ = 0;
  }
  if (end_ == buf_.size()) buf_.resize(buf_.size() * 2);  // a line longer than the buffer
  const int64_t got = src_->read(buf_.data() + end_, static_cast<int64_t>(buf_.size() - end_));
  if (got == 0) {
    eof_ = true;
    return false;
  }
  end_ += static_cast<size_t>(got);
  return true;
}

bool LineReader::next(std::string& line) {
  size_t scan = pos_;
  while (true) {
    const void* nl = std::memchr(buf_.data() + scan, '\n', end_ - scan);
    if (nl) {
      const size_t e = static_cast<size_t>(static_cast<const char*>(nl) - buf_.data());
      size_t len = e - pos_;
      if (len > 0 && buf_[pos_ + len - 1] == '\r') --len;
      line.assign(buf_.data() + pos_, len);
      pos_ = e + 1;
      ++line_no_;
      return true;
    }
    const size_t seen = end_ - pos_;
    if (!fill()) {
      if (end_ == pos_) return false;
      size_t len = end_ - pos_;  // last line without a newline
      if (len > 0 && buf_[pos_ + len - 1] == '\r') --len;
      line.assign(buf_.data() + pos_, len);
      pos_ = end_;
      ++line_no_;
      return true;
    }
    scan = pos_ + seen;
  }
}

// ----- preprocess -----------------------------------------------------------------------
std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key) {
  return output_prefix + "_" + key + "_document";
}

namespace {

struct Batch {
  std::string file;  // the input the lines come from (for file:line in errors)
  int64_t first_line = 0;
  int64_t input_bytes = 0;  // bytes the reader consumed for these lines (for progress)
  std::vector<std::string> lines;
};

struct BatchResult {
  // Per key: token ids of all kept documents, and each document's length.
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<int64_t>> doc_lens;
  int64_t documents = 0, bad = 0;
  int64_t input_bytes = 0;  // the batch's
  std::string first_bad;    // "file:line: reason"
  std::string fatal;        // set when a bad line is fatal
};

// A fixed pool running std::function jobs.
class Pool {
 public:
  explicit Pool(int64_t n) {
    for (int64_t i = 0; i < n; ++i) threads_.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void submit(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [this] { return stop_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  std::vector<std::thread> threads_;
  std::deque<std::function<void()>> jobs_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

// The tokenizer of a run: GPT-2's two files or a tokenizer.json.
struct DocTokenizer {
  std::shared_ptr<const Tokenizer> gpt2;
  std::shared_ptr<const HfTokenizer> hf;
  int32_t eod = -1;
  int64_t vocab_size = 0;
  void encode(std::string_view text, std::vector<int32_t>& out, bool allow_special) const {
    if (hf)
      hf->encode(text, out, true);
    else
      gpt2->encode(text, out, allow_special);
  }
};

DocTokenizer load_doc_tokenizer(const PreprocessOptions& opt) {
  DocTokenizer t;
  if (opt.tokenizer_file.empty()) {
    t.gpt2 = Tokenizer::from_files(opt.vocab_file, opt.merge_file);
    t.eod = t.gpt2->eod();
    t.vocab_size = t.gpt2->vocab_size();
    return t;
  }
  t.hf = HfTokenizer::from_file(opt.tokenizer_file);
  t.vocab_size = t.hf->vocab_size();
  if (opt.append_eod || !opt.eod_token.empty()) t.eod = hf_eod_id(*t.hf, opt.eod_token);
  return t;
}

BatchResult process_batch(const Batch& b, const PreprocessOptions& opt, const DocTokenizer& tok) {
  const size_t nk = opt.json_keys.size();
  BatchResult r;
  r.input_bytes = b.input_bytes;
  r.ids.resize(nk);
  r.doc_lens.resize(nk);
  std::vector<std::string_view> texts(nk);
  for (size_t li = 0; li < b.lines.size(); ++li) {
    const std::string& line = b.lines[li];
    const int64_t lineno = b.first_line + static_cast<int64_t>(li);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
    std::string reason;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      reason = fmt::format("malformed JSON (byte {}: {})", e.byte,
                           std::string(e.what()).substr(std::string(e.what()).rfind(": ") + 2));
    } catch (const nlohmann::json::exception& e) {
      // e.g. out_of_range 406: a number beyond double's range, in any field, used or not
      const std::string what = e.what();
      reason = fmt::format("malformed JSON ({})",
                           what.substr(what.find("] ") == std::string::npos ? 0 : what.find("] ") + 2));
    }
    if (reason.empty() && !j.is_object()) reason = "expected a JSON object";
    std::vector<std::string> values(nk);
    for (size_t k = 0; reason.empty() && k < nk; ++k) {
      auto it = j.find(opt.json_keys[k]);
      if (it == j.end()) {
        std::string keys;
        for (auto kv = j.begin(); kv != j.end() && keys.size() < 80; ++kv)
          keys += (keys.empty() ? "" : ", ") + kv.key();
        reason = fmt::format("missing key '{}' (keys present: {}; choose with --json-keys)", opt.json_keys[k],
                             keys.empty() ? "none" : keys);
      } else if (!it->is_string()) {
        reason = fmt::format("key '{}' is not a string", opt.json_keys[k]);
      } else {
        values[k] = it->get<std::string>();
      }
    }
    if (!reason.empty()) {
      const std::string where = fmt::format("{}:{}: {}", b.file, lineno, reason);
      if (!opt.skip_bad_lines) {
        r.fatal = where + (reason.rfind("malformed", 0) == 0 ? " (or pass --skip-bad-lines)" : "");
        return r;
      }
      if (r.bad == 0) r.first_bad = where;
      ++r.bad;
      continue;
    }
    for (size_t k = 0; k < nk; ++k) {
      const size_t before = r.ids[k].size();
      tok.encode(values[k], r.ids[k], opt.allow_special_tokens);
      if (opt.append_eod && r.ids[k].size() > before) r.ids[k].push_back(tok.eod);
      r.doc_lens[k].push_back(static_cast<int64_t>(r.ids[k].size() - before));
    }
    ++r.documents;
  }
  return r;
}

}  // namespace

namespace {

// The options' own checks (the inputs are checked by check_preprocess_inputs).
void check_preprocess_options(const PreprocessOptions& opt) {
  if (opt.json_keys.empty()) throw_input("--json-keys: at least one key is needed");
  if (opt.workers < 1) throw_input("--workers: {} is not valid (expected >= 1)", opt.workers);
  {
    // Each worker is a thread with its own batch in flight: more than the machine can
    // run only costs memory (--workers 100000 would start that many threads).
    const int64_t hw = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
    const int64_t most = std::max<int64_t>(4, 4 * hw);
    if (opt.workers > most)
      throw_input("--workers: {} is more than this machine can use ({} hardware threads; at most {})", opt.workers, hw,
                  most);
  }
  if (opt.output_prefix.empty()) throw_input("--output-prefix: must not be empty");
  if (opt.tokenizer_file.empty()) {
    if (opt.vocab_file.empty() || opt.merge_file.empty())
      throw_input("no tokenizer: give --tokenizer tokenizer.json, or GPT-2's --vocab-file and --merge-file");
    if (!opt.eod_token.empty()) throw_input("--eod-token: only with --tokenizer (GPT-2's is <|endoftext|>)");
  } else {
    if (!opt.vocab_file.empty() || !opt.merge_file.empty())
      throw_input("--tokenizer {}: give either --tokenizer or --vocab-file/--merge-file, not both", opt.tokenizer_file);
    if (opt.allow_special_tokens)
      throw_input(
          "--allow-special-tokens: only for GPT-2's files; a tokenizer.json's added tokens are always matched in "
          "the text, as Hugging Face's library does");
  }
  for (size_t a = 0; a < opt.json_keys.size(); ++a)
    for (size_t b = a + 1; b < opt.json_keys.size(); ++b)
      if (opt.json_keys[a] == opt.json_keys[b]) throw_input("--json-keys: '{}' given twice", opt.json_keys[a]);
  {
    const auto parent = std::filesystem::path(opt.output_prefix).parent_path();
    std::error_code ec;
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
      throw_input("--output-prefix {}: directory {} does not exist", opt.output_prefix, parent.string());
  }
}

// Reads the pieces one after the other into batches of at most batch_lines lines; a
// batch holds lines of one piece only and carries the input bytes read for it.
class BatchReader {
 public:
  BatchReader(const std::vector<InputPiece>& pieces, int64_t batch_lines)
      : pieces_(pieces), batch_lines_(batch_lines) {}
  bool next(Batch& b) {
    b.lines.clear();
    while (true) {
      if (!reader_) {
        if (next_piece_ == pieces_.size()) return false;
        const InputPiece& p = pieces_[next_piece_++];
        reader_ = (p.begin == 0 && p.end < 0) ? std::make_unique<LineReader>(p.path)
                                              : std::make_unique<LineReader>(p.path, p.begin, p.end);
        reader_file_ = p.path;
        bytes_batched_ = 0;
      }
      b.file = reader_file_;
      b.first_line = reader_->line_number() + 1;
      std::string line;
      while (static_cast<int64_t>(b.lines.size()) < batch_lines_ && reader_->next(line))
        b.lines.push_back(std::move(line));
      bytes_pending_ += reader_->bytes_read() - bytes_batched_;
      bytes_batched_ = reader_->bytes_read();
      if (!b.lines.empty()) {
        b.input_bytes = bytes_pending_;
        bytes_pending_ = 0;
        return true;
      }
      reader_.reset();  // this piece is done
    }
  }
  // Bytes read after the last batch's lines (the end of the last piece).
  int64_t pending_bytes() const { return bytes_pending_; }

 private:
  const std::vector<InputPiece>& pieces_;
  int64_t batch_lines_;
  size_t next_piece_ = 0;
  std::unique_ptr<LineReader> reader_;
  std::string reader_file_;
  int64_t bytes_batched_ = 0;  // reader_->bytes_read() at the end of the last batch
  int64_t bytes_pending_ = 0;  // read by a reader after its last line (counted with the next batch)
};

// Tokenizes every batch (on opt.workers threads) and hands the results to `consume`
// in reading order, so the output does not depend on scheduling.
template <typename Consume>
void tokenize_batches(BatchReader& reader, const PreprocessOptions& opt, const DocTokenizer& tok, Consume&& consume) {
  if (opt.workers == 1) {
    Batch b;
    while (reader.next(b)) consume(process_batch(b, opt, tok));
  } else {
    // In-order pipeline: at most 2*workers batches in flight; results are consumed in
    // submission order, so the output does not depend on scheduling.
    std::deque<std::future<BatchResult>> inflight;
    std::exception_ptr failure;
    {
      Pool pool(opt.workers);
      try {
        while (true) {
          auto b = std::make_shared<Batch>();
          if (!reader.next(*b)) break;
          auto promise = std::make_shared<std::promise<BatchResult>>();
          inflight.push_back(promise->get_future());
          pool.submit([b, promise, &opt, &tok] {
            try {
              promise->set_value(process_batch(*b, opt, tok));
            } catch (...) {
              promise->set_exception(std::current_exception());
            }
          });
          while (static_cast<int64_t>(inflight.size()) >= 2 * opt.workers) {
            consume(inflight.front().get());
            inflight.pop_front();
          }
        }
        while (!inflight.empty()) {
          consume(inflight.front().get());
          inflight.pop_front();
        }
      } catch (...) {
        failure = std::current_exception();
        for (auto& f : inflight)  // jobs reference locals: let them finish first
          if (f.valid()) f.wait();
      }
    }
    if (failure) std::rethrow_exception(failure);
  }
}

}  // namespace

PreprocessResult preprocess_jsonl(const PreprocessOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  check_preprocess_options(opt);
  check_preprocess_inputs(opt.inputs, opt.output_prefix, opt.json_keys);
  std::vector<InputPiece> pieces;
  if (opt.pieces) {
    pieces = *opt.pieces;
  } else {
    for (const auto& in : opt.inputs) pieces.push_back({in, 0, -1});
  }
  const DocTokenizer tok = load_doc_tokenizer(opt);
  const auto t_loaded = std::chrono::steady_clock::now();

  PreprocessResult res;
  const DType dtype = dtype_for_vocab(tok.vocab_size);
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const auto& k : opt.json_keys) {
    res.prefixes.push_back(preprocess_output_prefix(opt.output_prefix, k));
    writers.push_back(std::make_unique<IndexedDatasetWriter>(res.prefixes.back(), dtype));
  }
  res.tokens.assign(opt.json_keys.size(), 0);

  Progress progress("preprocess " + inputs_label(opt.inputs), -1, "docs", opt.progress);
  progress.set_secondary_unit("tokens");

  auto consume = [&](BatchResult&& r) {
    if (!r.fatal.empty()) throw InputError(r.fatal);
    if (r.bad > 0 && res.bad_lines == 0) res.first_bad = r.first_bad;
    res.bad_lines += r.bad;
    res.documents += r.documents;
    int64_t toks = 0;
    for (size_t k = 0; k < writers.size(); ++k) {
      const auto& ids = r.ids[k];
      int64_t off = 0;
      for (int64_t len : r.doc_lens[k]) {
        writers[k]->add_document(std::span<const int32_t>(ids.data() + off, static_cast<size_t>(len)));
        off += len;
      }
      res.tokens[k] += static_cast<int64_t>(ids.size());
      toks += static_cast<int64_t>(ids.size());
    }
    progress.add(r.documents, toks);
    if (opt.on_progress) opt.on_progress(r.documents, toks, r.input_bytes);
  };

  BatchReader reader(pieces, opt.batch_lines);
  tokenize_batches(reader, opt, tok, consume);
  if (reader.pending_bytes() > 0 && opt.on_progress) opt.on_progress(0, 0, reader.pending_bytes());
  progress.finish();
  // All pairs complete under temporary names before any is renamed into place.
  const auto t_flush = std::chrono::steady_clock::now();
  for (auto& w : writers) w->close_files();
  for (auto& w : writers) w->commit();
  const auto t_end = std::chrono::steady_clock::now();
  res.seconds = std::chrono::duration<double>(t_end - t0).count();
  res.load_seconds = std::chrono::duration<double>(t_loaded - t0).count();
  res.flush_seconds = std::chrono::duration<double>(t_end - t_flush).count();
  return res;
}

}  // namespace mtnlg::data
