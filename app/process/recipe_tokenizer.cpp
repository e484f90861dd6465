#include "app/process/recipe_tokenizer.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "data/hf_tokenizer.hpp"
#include "model/checkpoint.hpp"

namespace mtnlg::app {

namespace fs = std::filesystem;

std::string recipe_tokenizer_json(const Recipe& r) {
  if (r.data.tokenizer_type != TokenizerType::huggingface) return "";
  const std::string& m = r.data.tokenizer_model;
  std::error_code ec;
  if (fs::is_directory(m, ec)) {
    const fs::path f = fs::path(m) / "tokenizer.json";
    if (!fs::is_regular_file(f, ec)) throw_input("data.tokenizer_model {}: a directory without a tokenizer.json", m);
    return f.string();
  }
  if (!fs::is_regular_file(m, ec))
    throw_input("data.tokenizer_model {}: no such file or directory (a tokenizer.json, or a directory holding one)", m);
  return m;
}

int32_t recipe_hf_eod_token(const Recipe& r) {
  const auto t = data::HfTokenizer::from_file(recipe_tokenizer_json(r));
  const auto eos = data::hf_config_eos_token(t->path());
  if (!eos)
    throw_input(
        "data.eod_mask_loss: data.tokenizer_model {} has no end-of-document token: put a tokenizer_config.json "
        "with eos_token beside the tokenizer.json, or turn data.eod_mask_loss off",
        t->path());
  const auto id = t->token_to_id(*eos);
  if (!id)
    throw_input(
        "data.eod_mask_loss: the eos_token '{}' of the tokenizer_config.json beside data.tokenizer_model {} is not "
        "a token of that file",
        *eos, t->path());
  return *id;
}

namespace {
// GPT-2's vocabulary size: the entries of vocab.json.
int64_t gpt2_vocab_entries(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_input("data.vocab_file {}: cannot read", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw_input("data.vocab_file {}: not a JSON vocabulary ({})", path, e.what());
  }
  if (!j.is_object()) throw_input("data.vocab_file {}: not a JSON vocabulary (expected an object of token: id)", path);
  return static_cast<int64_t>(j.size());
}
}  // namespace

void check_recipe_tokenizer(const Recipe& r) {
  int64_t n = 0;
  std::string key;
  if (r.data.tokenizer_type == TokenizerType::huggingface) {
    n = data::HfTokenizer::from_file(recipe_tokenizer_json(r))->vocab_size();
    key = fmt::format("data.tokenizer_model {}", recipe_tokenizer_json(r));
  } else if (!r.data.vocab_file.empty() && !r.data.mock) {
    n = gpt2_vocab_entries(r.data.vocab_file);
    key = fmt::format("data.vocab_file {}", r.data.vocab_file);
  } else {
    return;
  }
  if (n > r.model.vocab_size)
    throw_input(
        "{} has {} tokens, more than model.vocab_size ({}): its ids would index past the embedding; set "
        "model.vocab_size to at least {}",
        key, n, r.model.vocab_size, n);
}

std::string recipe_tokenizer_for(const std::string& checkpoint, const std::string& random_recipe,
                                 const std::vector<std::string>& overrides) {
  Recipe r;
  if (!checkpoint.empty()) {
    const std::string dir = model::ckpt::resolve(checkpoint);
    r = parse_recipe(model::ckpt::read_metadata(dir).recipe_yaml, dir + "/metadata.json", overrides);
  } else if (!random_recipe.empty()) {
    r = load_recipe(random_recipe, overrides);
  } else {
    return "";
  }
  try {
    return recipe_tokenizer_json(r);
  } catch (const InputError& e) {  // e.g. a checkpoint trained on another machine
    throw_input("{} (the recipe of {}; pass --tokenizer to name the file here)", e.what(),
                checkpoint.empty() ? random_recipe : checkpoint);
  }
}

}  // namespace mtnlg::app
