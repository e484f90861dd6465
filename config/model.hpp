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

// Mixture of experts (Megatron-Core's names and defaults; docs/specs/moe.md). How the
// router scores experts, balances their load and bounds their work.
enum class MoeLoadBalancing { aux_loss, seq_aux_loss, global_aux_loss, none, sinkhorn };
std::string to_string(MoeLoadBalancing b);
enum class MoeScoreFunction { softmax, sigmoid };
std::string to_string(MoeScoreFunction f);
// With a capacity, which of an expert's tokens past it are dropped: the lowest routing
// probabilities, or the latest positions.
enum class MoeDropPolicy { probs, position };
std::string to_string(MoeDropPolicy p);
// The router's logits and scores: `none` in the activation dtype (as Megatron-Core's
// default), else fp32 or fp64.
enum class MoeRouterDtype { none, fp32, fp64 };
std::string to_string(MoeRouterDtype d);
enum class MoeDispatcher { allgather, alltoall };
std::string to_string(MoeDispatcher d);

struct MoeConfig {
  int64_t num_experts = 0;  // 0: a dense model (every other key here then keeps its default)
  int64_t moe_router_topk = 2;
  int64_t moe_ffn_hidden_size = 0;                  // each routed expert's width; 0 -> ffn_hidden_size
  int64_t moe_shared_expert_intermediate_size = 0;  // the shared expert's width; 0 = none
  bool moe_shared_expert_gate = false;              // shared output *= sigmoid(x . w), w [1, hidden]
  // Which layers are MoE: every moe_layer_freq-th from layer 0 (i % freq == 0), or, when
  // moe_layer_pattern is not empty, pattern[i] == 1 (one 0/1 entry per layer).
  int64_t moe_layer_freq = 1;
  std::vector<int64_t> moe_layer_pattern;
  MoeLoadBalancing moe_router_load_balancing_type = MoeLoadBalancing::aux_loss;
  double moe_aux_loss_coeff = 0.0;
  double moe_z_loss_coeff = 0.0;  // 0 = no z-loss
  MoeScoreFunction moe_router_score_function = MoeScoreFunction::softmax;
  bool moe_router_pre_softmax = false;
  double moe_router_topk_scaling_factor = 0.0;  // 0 = none (1)
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  int64_t moe_router_num_groups = 0;  // group-limited routing when moe_router_group_topk > 0
  int64_t moe_router_group_topk = 0;
  std::optional<double> moe_expert_capacity_factor;  // absent: dropless
  bool moe_pad_expert_input_to_capacity = false;
  MoeDropPolicy moe_token_drop_policy = MoeDropPolicy::probs;
  MoeRouterDtype moe_router_dtype = MoeRouterDtype::none;
  double moe_input_jitter_eps = 0.0;  // 0 = no jitter
  MoeDispatcher moe_token_dispatcher_type = MoeDispatcher::allgather;

  bool enabled() const { return num_experts > 0; }
  // Whether layer i (0-based, of the whole model) holds routed experts.
  bool is_moe_layer(int64_t i) const {
    if (!enabled()) return false;
    if (!moe_layer_pattern.empty()) return moe_layer_pattern[static_cast<size_t>(i)] == 1;
    return i % moe_layer_freq == 0;
  }
};

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
  MoeConfig moe;                // the MoE keys (model section, Megatron-Core's names)

  int64_t head_dim() const { return kv_channels > 0 ? kv_channels : hidden_size / num_attention_heads; }
  int64_t query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
  bool rope() const { return position_embedding_type == PositionEmbedding::rope; }
  bool rmsnorm() const { return normalization == Normalization::RMSNorm; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  // Vocabulary padded to a multiple of make_vocab_size_divisible_by * tp (Megatron).
  int64_t padded_vocab_size(int64_t tp) const;
};

}  // namespace mtnlg
