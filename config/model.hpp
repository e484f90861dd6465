// The model section of a recipe (Megatron argument names): what model/ builds.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtnlg {

// How the attention core (softmax(Q K^T / sqrt(d)) V, causal) is computed:
//   flash    the log-sum-exp form: the [s, s] probabilities never reach memory; the
//            backward recomputes them (CPU row kernel; on CUDA cuDNN's fused attention,
//            bf16/fp16, head sizes that are multiples of 8 up to 128);
//   unfused  Megatron's form: Q K^T and P V as batched GEMMs (tensor cores on CUDA) with a
//            fused scale + causal mask + softmax kernel between; the [b, a, s, s]
//            probabilities are kept for the backward unless selective recompute redoes them;
//   auto     flash on the CPU; on CUDA flash where cuDNN loads and takes the shape, else
//            unfused (the banner says which and why).
enum class AttentionBackend { automatic, flash, unfused };
std::string to_string(AttentionBackend a);

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
  AttentionBackend attention_backend = AttentionBackend::automatic;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Vocabulary padded to a multiple of make_vocab_size_divisible_by * tp (Megatron).
  int64_t padded_vocab_size(int64_t tp) const;
};

}  // namespace mtnlg
