// The argument structs of the op set (core/ops.hpp), in a header of their own so that
// the CUDA backend (core/cuda/ops_cuda.hpp) takes the same types without including the
// op set it serves.
#pragma once
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

// AdamW hyperparameters of one update.
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
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
