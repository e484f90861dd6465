#include "app/eval/tokenizer_options.hpp"

#include "app/eval/eval_runner.hpp"
#include "app/process/recipe_tokenizer.hpp"

namespace mtnlg::app {

void TokenizerOptions::add_to(CLI::App* cmd, const std::string& tokenizer_use, const std::string& eod_help) {
  cmd->add_option("--vocab-file", vocab, "GPT-2 vocab.json (default third_party/gpt2/vocab.json)");
  cmd->add_option("--merge-file", merges, "GPT-2 merges.txt (default third_party/gpt2/merges.txt)");
  cmd->add_option("--tokenizer", tokenizer,
                  "A Hugging Face tokenizer.json instead of GPT-2's files (docs/specs/hf-tokenizer.md; default: the "
                  "recipe's, i.e. data.tokenizer_model of the checkpoint's (or --random-init's) recipe when its "
                  "data.tokenizer_type is HuggingFaceTokenizer, else the checkpoint root's tokenizer.json, which "
                  "`checkpoint import` copies there, else GPT-2's files)" +
                      tokenizer_use);
  cmd->add_option("--eod-token", eod_token, eod_help);
}

std::shared_ptr<const data::TextTokenizer> TokenizerOptions::load(const std::string& checkpoint,
                                                                  const std::string& random_init,
                                                                  const std::vector<std::string>& sets,
                                                                  bool add_special_tokens) const {
  // No tokenizer on the command line: the recipe's (the checkpoint's, or --random-init's).
  const std::string file = tokenizer.empty() && vocab.empty() && merges.empty()
                               ? recipe_tokenizer_for(checkpoint, random_init, sets)
                               : tokenizer;
  return load_text_tokenizer(vocab, merges, file, eod_token, add_special_tokens, checkpoint);
}

}  // namespace mtnlg::app
