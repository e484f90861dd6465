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

// Where positions enter (Megatron-Core's position_embedding_type): a learned table added
// to the word embedding (GPT-2, MT-NLG), or rotary embedding of q and k in every layer
// (the Llama family).
enum class PositionEmbedding { learned_absolute, rope };
std::string to_string(PositionEmbedding p);
// The norm before each sublayer and at the end: LayerNorm (mean, variance, weight and bias)
// or RMSNorm (root mean square, weight only).
enum class Normalization { LayerNorm, RMSNorm };
std::string to_string(Normalization n);

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
  double layernorm_epsilon = 1e-5;  // the norms' epsilon (recipe key norm_epsilon, or layernorm_epsilon)
  AttentionBackend attention_backend = AttentionBackend::automatic;

  // The architecture family's switches (defaults: GPT-2 / MT-NLG). A Llama 3 model is
  // rope + RMSNorm + swiglu + num_query_groups + untied output + no linear biases.
  PositionEmbedding position_embedding_type = PositionEmbedding::learned_absolute;
  double rotary_base = 10000.0;
  double rotary_percent = 1.0;      // fraction of each head's dims that rotate
  bool rotary_interleaved = false;  // pairs (2i, 2i+1); false: rotate-half (Megatron-Core, Hugging Face)
  bool use_rope_scaling = false;    // Llama 3.1's frequency scaling
  double rope_scaling_factor = 8.0;
  Normalization normalization = Normalization::LayerNorm;
  bool swiglu = false;           // gated MLP: silu(x W_gate) * (x W_up), each ffn_hidden_size wide
  int64_t num_query_groups = 0;  // key/value heads (grouped-query attention); 0 -> num_attention_heads
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;  // biases of every linear layer (false: Megatron's --disable-bias-linear)
  bool add_qkv_bias = false;    // the query/key/value biases alone (Qwen2), with add_bias_linear false
  bool qk_layernorm = false;    // Qwen3's RMSNorm of each query and key head, before the rotary embedding
  int64_t kv_channels = 0;      // head size; 0 -> hidden_size / num_attention_heads

  int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  int64_t query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  bool rope() const { return position_embedding_type == PositionEmbedding::rope; }
  bool rmsnorm() const { return normalization == Normalization::RMSNorm; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  // Vocabulary padded to a multiple of make_vocab_size_divisible_by * tp (Megatron).
  int64_t padded_vocab_size(int64_t tp) const;
};

}  // namespace mtnlg
