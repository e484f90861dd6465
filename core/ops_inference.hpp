// Inference-only ops (no backward): causal self-attention of new positions over a
// key/value cache. Used by model/inference for generation (one new token per step)
// and for scoring (a whole prompt at once, past = 0), so that prefill and decode share
// one code path and never materialise the [T,T] probability matrix of training.
//
// Cache layout: k_cache/v_cache are [B, H, capacity, D]. The op first writes the new
// keys/values of positions [past, past+T_new) into the cache, then position past+i
// attends to cache positions [0, past+i] (causal). Rows b of a batch share `past`;
// rows of different true lengths are right-padded by the caller (padding only ever
// influences padding positions, because attention is causal).
#pragma once
#include <cstdint>

#include "core/tensor.hpp"

namespace mtnlg::ops {

// qkv[B,T_new,H*3*D] in Megatron's per-head [q|k|v] layout (as attention_forward);
// out[B,T_new,H*D] (written). Requires past + T_new <= capacity.
void attention_cached_forward(Tensor& out, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int64_t heads,
                              int64_t past);

}  // namespace mtnlg::ops
