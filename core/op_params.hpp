// The argument structs of the op set (core/ops.hpp), in a header of their own so that
// the CUDA backend (core/cuda/ops_cuda.hpp) takes the same types without including the
// op set it serves.
#pragma once
#include <math.h>

#include <cstdint>

#include "core/rng.hpp"
#include "core/tensor.hpp"

namespace mtnlg::ops {

// Dropout on the attention probabilities.
struct AttentionDropout {
  double p = 0.0;
  uint64_t key = 0;
  // Mask element (sample, head, i, j) has index ((sample_offset+b)*heads_total + head_offset+h)*T*T + i*T + j,
  // so the mask does not depend on how heads or samples are split across ranks.
  int64_t sample_offset = 0;
  int64_t head_offset = 0;
  int64_t heads_total = 0;
  // On CUDA, where key and sample_offset come from when set: key = dkey.key(key),
  // sample_offset = dkey.offset(sample_offset) (a CUDA graph's replay).
  DeviceKey dkey{};
};

// One block of a context-parallel attention (ops::attention_block_forward /
// attention_block_backward): the query rows [q_begin, q_begin + q_count) of the local qkv
// against the key/value rows [k_begin, k_begin + k_count) of a K/V buffer (a count of -1:
// to the end). Causal: the block's query i (0 at q_begin) sees the block's key j (0 at
// k_begin) when j <= i + causal_offset: 0 for a sequence against itself, the first
// query's global position minus the first key's otherwise. Not causal: every key.
//
// Attention dropout (drop.p > 0) draws the one-rank op's mask (attention_forward_lse over
// the whole sequence of seq_len positions): element (sample, head, query, key) at the rows'
// GLOBAL positions, which q_rows (qkv's rows) and kv_rows (the K/V buffer's rows) give.
struct SeqRows {
  // 0: row i is position i; else rows [0, chunk) are positions first * chunk + i and rows
  // [chunk, 2 chunk) second * chunk + (i - chunk) (a rank's two chunks of the split).
  int64_t chunk = 0, first = 0, second = 0;
  MTNLG_HD int64_t at(int64_t i) const {  // host and device code (the CUDA block kernels' dropout)
    return chunk == 0 ? i : i < chunk ? first * chunk + i : second * chunk + i - chunk;
  }
};
struct AttentionBlock {
  int64_t q_begin = 0, q_count = -1;
  int64_t k_begin = 0, k_count = -1;
  bool causal = false;
  int64_t causal_offset = 0;
  AttentionDropout drop{};
  int64_t seq_len = 0;  // the whole sequence's length (with dropout)
  SeqRows q_rows{}, kv_rows{};
};

// What happens to a residual branch before it joins the residual stream
// (ops::residual_layernorm_forward): its bias added (when `bias` is given), then hidden
// dropout with probability p (none when p <= 0), the mask drawn as dropout_forward's:
// element e of the branch uses key and base_index + e.
struct ResidualBranch {
  const Tensor* bias = nullptr;  // [C], the activation dtype
  double p = 0.0;
  uint64_t key = 0;
  uint64_t base_index = 0;
  DeviceKey dkey{};  // on CUDA, key and base_index from device memory when set
};

// Rotary position embedding (ops::rope_forward / rope_backward; docs/specs/llama-ops.md):
// Megatron-Core's rotary_base, rotary_percent, rotary_interleaved and Llama 3.1's
// frequency scaling (use_rope_scaling, rope_scaling_factor; the low/high frequency
// factors and the original context length at Llama 3.1's values unless set).
struct RopeParams {
  double base = 10000.0;     // theta
  double percent = 1.0;      // rotate the first head_dim * percent dims of each head (even)
  bool interleaved = false;  // pairs (2i, 2i+1); false: rotate-half, pairs (i, i + rot_dim/2)
  bool scaling = false;      // Llama 3.1's frequency scaling
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_positions = 8192.0;

  // inv_freq[i] = base^(-2i / rot_dim), i < rot_dim / 2, in double; with `scaling`, the
  // wavelength w = 2 pi / f decides: w < original / high_freq_factor keeps f, w > original
  // / low_freq_factor takes f / factor, and between them s = (original / w -
  // low_freq_factor) / (high_freq_factor - low_freq_factor) blends (1 - s) f / factor + s f.
  // Host and device code (the kernels compute it per pair; the model through
  // ops::rope_inv_freq).
  MTNLG_HD double inv_freq(int64_t i, int64_t rot_dim) const {
    const double f = 1.0 / ::pow(base, static_cast<double>(2 * i) / static_cast<double>(rot_dim));
    if (!scaling) return f;
    const double wavelen = 2.0 * 3.14159265358979323846 / f;
    const double low_wavelen = original_max_positions / low_freq_factor;
    const double high_wavelen = original_max_positions / high_freq_factor;
    if (wavelen < high_wavelen) return f;
    if (wavelen > low_wavelen) return f / factor;
    const double s = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    return (1.0 - s) * f / factor + s * f;
  }
};

// AdamW hyperparameters of one update.
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;             // 1-based, for bias correction
  double grad_scale = 1.0;  // gradients are multiplied by this first (clipping, loss-scale)
};

// A run [offset, offset + numel) of a flat parameter buffer and whether weight decay
// applies to it (not to biases and norm weights).
struct AdamWSegment {
  int64_t offset = 0, numel = 0;
  bool weight_decay = true;
};

// The rows of a batch grouped by token for embedding_backward: `rows` i32 [N], the row
// indices sorted by (token, row); `starts` i32 [N + 1], where each distinct token's run
// begins in `rows` (starts[runs] = N, and so is every entry after it); `count` i32 [1],
// the number of runs. Host-built (ops::embedding_grad_order) as one buffer
// [runs, starts..., rows...] of 2N + 2 ids whatever the ids are, so a buffer placed once
// serves every batch of N ids (a replayed CUDA graph reads the run count where the
// capture did); the CUDA kernel is launched for N runs and the blocks past `count` return.
struct EmbeddingGradOrder {
  Tensor count, rows, starts;
  int64_t max_runs = 0;  // N: the launch's bound on the runs
  // Views into a placed buffer of ops::embedding_grad_order for n ids.
  static EmbeddingGradOrder from(const Tensor& placed, int64_t n) {
    EmbeddingGradOrder o;
    o.max_runs = n;
    o.count = placed.flat(0, 1);
    o.starts = placed.flat(1, n + 1);
    o.rows = placed.flat(n + 2, n);
    return o;
  }
};

}  // namespace mtnlg::ops
