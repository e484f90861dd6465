// The data section of a recipe: the blend of sources, the split, the tokenizer.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtnlg {

struct BlendSource {
  double weight = 1.0;
  std::string prefix;
  // false: the entry has no weight. One such source alone is Megatron's unweighted
  // `--data-path PREFIX` (its own sample order, no blend surplus); data.path sets it.
  bool weighted = true;
};

// Megatron's --tokenizer-type values that mtnlg reads: GPT-2's byte-level BPE from
// vocab.json + merges.txt (data.vocab_file, data.merge_file), or a Hugging Face
// tokenizer.json (data.tokenizer_model).
enum class TokenizerType { gpt2_bpe, huggingface };
// "GPT2BPETokenizer", "HuggingFaceTokenizer" (the recipe's spelling, Megatron's).
std::string to_string(TokenizerType t);

struct DataConfig {
  std::vector<BlendSource> blend;
  std::string split = "969,30,1";
  std::string vocab_file;
  std::string merge_file;
  TokenizerType tokenizer_type = TokenizerType::gpt2_bpe;
  std::string tokenizer_model;  // HuggingFaceTokenizer: a tokenizer.json, or a directory holding one
  std::string cache_dir;        // "" -> <logging.dir>/index-cache
  bool mock = false;
  bool eod_mask_loss = false;
};

}  // namespace mtnlg
