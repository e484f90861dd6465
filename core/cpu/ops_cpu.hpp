// CPU reference implementations of core/ops.hpp, templated on float/double. They are
// the oracle every CUDA kernel is tested against (keep them obvious) and the CPU
// training path (so the loops are threaded with OpenMP and matmuls go to OpenBLAS).
#pragma once
#include <cstdint>

namespace mtnlg::cpu {

template <typename T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int64_t N, int64_t C, int64_t OC);
template <typename T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int64_t N, int64_t C, int64_t OC,
                     bool accumulate_dinp);
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C, double eps);
template <typename T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean, const T* rstd,
                        int64_t N, int64_t C, bool accumulate_dinp);
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);
template <typename T>
void dropout(T* out, const T* inp, int64_t n, double p, uint64_t key, uint64_t base);
template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D, double p,
                       uint64_t key, int64_t sample_offset, int64_t head_offset, int64_t heads_total);
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs, int64_t B, int64_t Tn, int64_t H, int64_t D,
                        double p, uint64_t key, int64_t sample_offset, int64_t head_offset, int64_t heads_total);
// Log-sum-exp form (what the CUDA kernels compute): the forward saves lse[B,H,T] instead
// of the probabilities, the backward recomputes p_ij = exp(s_ij - lse_i) row by row.
// O(T) scratch per (b, h) instead of O(T^2). dqkv is written (=).
template <typename T>
void attention_forward_lse(T* out, T* lse, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D, double p,
                           uint64_t key, int64_t sample_offset, int64_t head_offset, int64_t heads_total);
template <typename T>
void attention_backward_lse(T* dqkv, const T* dout, const T* qkv, const T* lse, int64_t B, int64_t Tn, int64_t H,
                            int64_t D, double p, uint64_t key, int64_t sample_offset, int64_t head_offset,
                            int64_t heads_total);
// Forward only, over a key/value cache [B, H, capacity, D]: writes the new keys/values
// of positions [past, past + Tn) into the cache, then query past + i attends to cache
// positions [0, past + i]. out[B, Tn, H*D] is written.
template <typename T>
void attention_cached_forward(T* out, T* k_cache, T* v_cache, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D,
                              int64_t capacity, int64_t past);
template <typename T>
void embedding_forward(T* out, const int32_t* tok, const T* table, int64_t N, int64_t C, int64_t vstart, int64_t vlocal);
template <typename T>
void embedding_backward(T* dtable, const int32_t* tok, const T* dout, int64_t N, int64_t C, int64_t vstart, int64_t vlocal);
template <typename T>
void position_forward(T* x, const T* pos, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len);
template <typename T>
void position_backward(T* dpos, const T* dx, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len);
template <typename T>
void bias_add_forward(T* x, const T* b, int64_t N, int64_t C);
template <typename T>
void bias_add_backward(T* db, const T* dout, int64_t N, int64_t C);
template <typename T>
void xent_rowmax(T* rowmax, const T* logits, int64_t N, int64_t V, int64_t valid);
template <typename T>
void xent_sumexp_target(T* sumexp, T* target_logit, const T* logits, const int32_t* targets, const T* rowmax, int64_t N,
                        int64_t V, int64_t vstart, int64_t valid);
template <typename T>
void xent_backward(T* dlogits, const T* logits, const int32_t* targets, const T* rowmax, const T* sumexp, const T* dloss,
                   int64_t N, int64_t V, int64_t vstart, int64_t valid);
template <typename T>
void adamw(T* param, const T* grad, T* m, T* v, int64_t n, double lr, double b1, double b2, double eps, double wd,
           int64_t step, double grad_scale);

}  // namespace mtnlg::cpu
