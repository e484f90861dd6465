// The tokenizer options `eval` and `generate` share (--vocab-file, --merge-file,
// --tokenizer, --eod-token) and the tokenizer they settle on: the command line's, else
// the recipe's (of the checkpoint, or of --random-init), else a tokenizer.json in the
// checkpoint root, else GPT-2's files.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "data/text_tokenizer.hpp"

namespace mtnlg::app {

struct TokenizerOptions {
  std::string vocab, merges, tokenizer, eod_token;

  // `tokenizer_use` ends --tokenizer's help (what the command does with the file);
  // `eod_help` is --eod-token's.
  void add_to(CLI::App* cmd, const std::string& tokenizer_use, const std::string& eod_help);

  // `add_special_tokens`: whether a tokenizer.json's template (BOS) applies to each encode.
  std::shared_ptr<const data::TextTokenizer> load(const std::string& checkpoint, const std::string& random_init,
                                                  const std::vector<std::string>& sets, bool add_special_tokens) const;
};

}  // namespace mtnlg::app
