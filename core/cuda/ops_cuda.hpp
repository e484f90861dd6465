// The CUDA backend of the op set: Tensor-level entry points that core/ops/<family>.cpp calls
// when its arguments live on Device::cuda (same names and argument meanings as
// core/ops.hpp), and the kernels' limits and switches. The kernels themselves and their
// raw launchers live in core/cuda/<family>.cu, each file ending with its family's entries.
//
// Dtypes on CUDA (checked here, RuntimeError naming the op and the argument):
//   activations, their gradients and the weights as used by the forward: f32, bf16 or
//     f16, all the same within one call;
//   parameter gradients (matmul dw/dbias, layernorm dw/db, bias_add db, embedding
//     dtable, position dpos): f32 (fp32 gradient accumulation);
//   statistics (layernorm mean/rstd, attention lse, xent rowmax/sumexp/target_logit/
//     dloss): f32;
//   optimizer param/grad/m/v: f32 (the master copy); f64 is CPU-only.
// In fp32 training all of these are f32, so the model's CPU allocations carry over.
// Attention comes in both forms: probs (unfused: batched GEMMs + softmax kernel, any head
// size) and lse (flash: one fused scalar kernel, head size <= kAttnMaxHeadDim).
#pragma once
#include <cstdint>
#include <vector>

#include "core/op_params.hpp"
#include "core/tensor.hpp"

namespace mtnlg::cuda {

void fill(Tensor& x, double value);
void copy(Tensor& dst, const Tensor& src);
void add(Tensor& out, const Tensor& a, const Tensor& b);
void scale(Tensor& x, double s);
double sum_squares(const Tensor& x);  // synchronises
void sum_squares_accumulate(Tensor& acc, const Tensor& x);
void xent_loss_accumulate(Tensor& acc, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit,
                          const Tensor* mask);
bool all_finite(const Tensor& x);     // synchronises
void convert(Tensor& dst, const Tensor& src);

void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias);
void matmul_backward(Tensor* dinp, Tensor* dw, Tensor* dbias, const Tensor& dout, const Tensor& inp, const Tensor& w,
                     bool accumulate_dinp);
void matmul_bias_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& w, const Tensor& bias);
void matmul_dgelu_backward(Tensor& dpre, Tensor& dbias, const Tensor& dout, const Tensor& w, const Tensor& pre);
void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w, const Tensor& b,
                       double eps);
void add_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                           const Tensor& w, const Tensor& bias, double eps);
void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dinp);
void gelu_forward(Tensor& out, const Tensor& inp);
void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout);
void dropout_forward(Tensor& out, const Tensor& inp, double p, uint64_t key, uint64_t base_index);

void attention_forward_lse(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads, const ops::AttentionDropout& drop);
void attention_backward_lse(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t heads, const ops::AttentionDropout& drop);
void attention_cached_forward(Tensor& out, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int64_t heads,
                              int64_t past);
void attention_forward_probs(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t heads,
                             const ops::AttentionDropout& drop);
void attention_backward_probs(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads,
                              const ops::AttentionDropout& drop);

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table, int64_t vocab_start);
void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout, int64_t vocab_start,
                        const ops::EmbeddingGradOrder* order);
void position_forward(Tensor& x, const Tensor& pos, int64_t row_start, int64_t seq_len);
void position_backward(Tensor& dpos, const Tensor& dx, int64_t row_start, int64_t seq_len);
void bias_add_forward(Tensor& x, const Tensor& b);
void bias_add_backward(Tensor& db, const Tensor& dout);

void xent_rowmax(Tensor& rowmax, const Tensor& logits, int64_t valid_local);
void xent_sumexp_target(Tensor& sumexp, Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                        const Tensor& rowmax, int64_t vocab_start, int64_t valid_local);
void xent_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& rowmax,
                   const Tensor& sumexp, const Tensor& dloss, int64_t vocab_start, int64_t valid_local);

// The flat multi-segment form of ops::adamw_flat: one launch over the whole fp32 master
// buffer; `copy_out` (bf16 or f16) receives the low-precision weights the next forward
// uses.
void adamw_flat(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& p,
                const std::vector<ops::AdamWSegment>& segments, Tensor* copy_out);

// ---- limits and switches of the kernels ---------------------------------------------
// Largest head size the flash and KV-cache attention kernels take.
constexpr int64_t kAttnMaxHeadDim = 256;
// Whether matmuls go through cuBLASLt (default true); off, every one takes the
// cublasGemmEx fallback. Returns the previous setting (tests run both paths).
bool set_gemm_lt(bool on);
// Whether the matmul forward fuses the bias into cuBLASLt's epilogue (default true);
// off, or when the heuristic offers no algorithm with the epilogue, the bias is added by
// a separate kernel after the GEMM. Returns the previous setting.
bool set_gemm_bias_epilogue(bool on);
// Whether matmul_bias_gelu_forward / matmul_dgelu_backward use cuBLASLt's GELU_AUX_BIAS
// and DGELU epilogues (then the bias-gradient kernel) for bf16/fp16 (default true); off,
// when refused, and always for f32 (core/cuda/gemm.cu says why), they run the GEMM and
// the separate GELU / bias-gradient kernels. Returns the previous setting.
bool set_gemm_gelu_epilogue(bool on);
// GEMMs that ran with a GELU epilogue (forward or backward) since start-up.
int64_t gemm_gelu_fused();
// Matmuls since start-up that did not run as asked: each call whose optional epilogue
// cuBLASLt refused (the GEMM and separate kernels ran instead; warned once per shape),
// and each matmul run by the cublasGemmEx fallback.
int64_t gemm_fallbacks();

}  // namespace mtnlg::cuda
