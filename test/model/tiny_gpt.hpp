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

}  // namespace mtnlg::test
