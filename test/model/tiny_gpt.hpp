// A GPT small enough for inference and oracle tests (test/model, test/model/mpi): 2 layers, hidden 32,
// 4 heads, a 50-token vocabulary padded to 64 (so tp = 2 leaves one shard with padding
// rows), weights large enough that greedy tokens depend on the context.
#pragma once
#include "model/gpt.hpp"

namespace mtnlg::test {

inline model::GptConfig tiny_gpt_config() {
  model::GptConfig cfg;
  cfg.vocab_size = 50;
  cfg.padded_vocab_size = 64;
  cfg.hidden = 32;
  cfg.heads = 4;
  cfg.ffn = 128;
  cfg.seq_length = 16;
  cfg.max_positions = 24;
  cfg.num_layers_total = 2;
  cfg.init_std = 0.2;
  return cfg;
}

// The Llama family's parts on a test config (heads divisible by 2). Variant 0 is Llama 3's
// form: rotary positions, RMSNorm, SwiGLU, heads / 2 key/value groups, an untied output
// layer, no biases. Variant 1 takes the other forms: one group (MQA), a head size of its
// own (2 hidden / heads), half of each head rotating in interleaved pairs with Llama 3.1's
// frequency scaling (at an original context of 16, so the scaling bites at test sizes),
// q/k/v biases alone (Qwen2) and the output tied to the word embedding. Variant 2 is
// variant 0 with Qwen3's RMSNorm of each query and key head (qk_norm).
inline void make_llama(model::GptConfig& c, int variant) {
  c.rope = true;
  c.rmsnorm = true;
  c.swiglu = true;
  c.bias_linear = false;
  if (variant == 0 || variant == 2) {
    c.groups = c.heads / 2;
    c.untied = true;
    c.qkv_bias = false;
    c.qk_norm = variant == 2;
    return;
  }
  c.groups = 1;
  c.head_size = 2 * c.hidden / c.heads;
  c.rope_params.percent = 0.5;
  c.rope_params.interleaved = true;
  c.rope_params.scaling = true;
  c.rope_params.factor = 8.0;
  c.rope_params.original_max_positions = 16.0;
  c.qkv_bias = true;
  c.untied = false;
}

}  // namespace mtnlg::test
