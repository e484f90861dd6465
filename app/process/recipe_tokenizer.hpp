// The tokenizer a recipe names (docs/RECIPES.md, data section): data.tokenizer_type
// GPT2BPETokenizer (GPT-2's vocab.json + merges.txt, data.vocab_file and
// data.merge_file) or HuggingFaceTokenizer (a tokenizer.json, data.tokenizer_model: the
// file, or a directory holding one), Megatron's --tokenizer-type / --tokenizer-model.
// Training takes its end-of-document token (data.eod_mask_loss) and checks its
// vocabulary against the model's at start; eval and generate use it when no tokenizer
// is given on the command line (a checkpoint carries its recipe).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "config/recipe.hpp"

namespace mtnlg::app {

// HuggingFaceTokenizer: the path of the tokenizer.json data.tokenizer_model names
// (itself, or DIR/tokenizer.json); "" for GPT2BPETokenizer. InputError naming
// data.tokenizer_model when it is neither a file nor a directory holding tokenizer.json.
std::string recipe_tokenizer_json(const Recipe& r);

// HuggingFaceTokenizer's end-of-document id (data.eod_mask_loss masks it): eos_token of
// the tokenizer_config.json beside the tokenizer.json. InputError naming
// data.tokenizer_model (and data.eod_mask_loss) when there is none or it is not a token.
int32_t recipe_hf_eod_token(const Recipe& r);

// Training's start-up check: the vocabulary of the recipe's tokenizer (the tokenizer.json's
// ids, added tokens included, as Megatron counts it; GPT-2's: data.vocab_file's entries,
// when it is set and the data is not mock) fits model.vocab_size. InputError naming both
// keys when it does not, or naming the tokenizer's key when its file cannot be read.
void check_recipe_tokenizer(const Recipe& r);

// For eval and generate: the tokenizer.json of the recipe of `checkpoint` (or of the
// --random-init recipe), with `overrides` (--set) applied, when its data.tokenizer_type
// is HuggingFaceTokenizer; "" otherwise (GPT-2's files, found as before).
std::string recipe_tokenizer_for(const std::string& checkpoint, const std::string& random_recipe,
                                 const std::vector<std::string>& overrides);

}  // namespace mtnlg::app
