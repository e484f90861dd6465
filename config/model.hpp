// The model section of a recipe (Megatron argument names): what model/ builds.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtnlg {

struct ModelConfig {
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t num_attention_heads = 0;
  int64_t ffn_hidden_size = 0;  // 0 -> 4 * hidden_size
  int64_t seq_length = 0;
  int64_t max_position_embeddings = 0;  // 0 -> seq_length
  int64_t vocab_size = 50257;
  int64_t make_vocab_size_divisible_by = 128;
  double init_method_std = 0.02;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double layernorm_epsilon = 1e-5;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Vocabulary padded to a multiple of make_vocab_size_divisible_by * tp (Megatron).
  int64_t padded_vocab_size(int64_t tp) const;
};

}  // namespace mtnlg
