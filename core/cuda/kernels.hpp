// Raw launchers of the CUDA kernels, one op family per .cu file (the CPU reference of
// each is core/ops/<family>.cpp, named in the file's header comment). Plain pointers and
// sizes only; the Tensor-level entry of each family (core/cuda/ops_cuda.hpp) sits at the
// end of the same .cu file and calls these.
//
// Every launcher enqueues on cuda::stream() and returns without synchronising, except
// the ones that return a value to the host (sum_squares). Storage dtype `Dt` is the
// dtype of activations and of the weights as used in the forward (fp32, or the bf16 /
// fp16 copy); arithmetic is fp32. Statistics (mean, rstd, log-sum-exp, row max, sum of
// exp, dloss) and parameter gradients are always fp32 (DESIGN.md "Precision": fp32
// gradient accumulation).
//
// Gradient contract (DESIGN.md invariant 4): parameter gradients (dw, db, dtable,
// dpos) ACCUMULATE (+=); activation gradients are WRITTEN (=) unless `accumulate`.
#pragma once
#include <cstdint>

namespace mtnlg::cuda::k {

enum class Dt : int { f32 = 0, bf16 = 1, f16 = 2 };

// ---- elementwise.cu ----------------------------------------------------------------
void fill(void* x, Dt dt, int64_t n, float value);
void fill_i32(int32_t* x, int64_t n, int32_t value);
void fill_f64(double* x, int64_t n, double value);
void add(void* out, const void* a, const void* b, Dt dt, int64_t n);
void scale(void* x, Dt dt, int64_t n, float s);
void convert(void* dst, Dt ddt, const void* src, Dt sdt, int64_t n);
void gelu_forward(void* out, const void* inp, Dt dt, int64_t n);
void gelu_backward(void* dinp, const void* inp, const void* dout, Dt dt, int64_t n);
void dropout(void* out, const void* inp, Dt dt, int64_t n, double p, uint64_t key, uint64_t base);

// ---- reduce.cu -----------------------------------------------------------------------
// Sum of x^2 in double; deterministic (fixed grid, ordered second pass). Synchronises.
double sum_squares(const void* x, Dt dt, int64_t n);
// The same sum added to acc[0] on the device (no synchronisation).
void sum_squares_accumulate(double* acc, const void* x, Dt dt, int64_t n);

// ---- embedding.cu (backwards deterministic, atomic-free) -----------------------------
void position_forward(void* x, const void* pos, Dt dt, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len);
void position_backward(float* dpos, const void* dx, Dt dt, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len);
void embedding_forward(void* out, const int32_t* tok, const void* table, Dt dt, int64_t N, int64_t C, int64_t vstart,
                       int64_t vlocal);
void embedding_backward(float* dtable, const int32_t* tok, const void* dout, Dt dt, int64_t N, int64_t C, int64_t vstart,
                        int64_t vlocal);

// ---- layernorm.cu ------------------------------------------------------------------
void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b, Dt dt, int64_t N,
                       int64_t C, double eps);
void layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const void* w,
                        const float* mean, const float* rstd, Dt dt, int64_t N, int64_t C, bool accumulate_dinp);

// ---- attention.cu ------------------------------------------------------------------
constexpr int64_t kAttnMaxHeadDim = 256;
struct AttnDropout {
  double p = 0;
  uint64_t key = 0;
  int64_t sample_offset = 0, head_offset = 0, heads_total = 0;
};
// qkv [B,T,H*3*D] (per head [q|k|v]), out [B,T,H*D], lse [B,H,T] (natural log of the
// softmax denominator, scores scaled by 1/sqrt(D)). D <= kAttnMaxHeadDim.
void attention_forward(void* out, float* lse, const void* qkv, Dt dt, int64_t B, int64_t T, int64_t H, int64_t D,
                       const AttnDropout& drop);
// Generation over a key/value cache [B, H, capacity, D] (forward only): appends the new
// positions' keys/values at [past, past + T), then query past + i attends to [0, past + i].
void attention_cached_forward(void* out, void* k_cache, void* v_cache, const void* qkv, Dt dt, int64_t B, int64_t T,
                              int64_t H, int64_t D, int64_t capacity, int64_t past);
// dqkv written; `out` and `lse` are the forward's.
void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, Dt dt, int64_t B,
                        int64_t T, int64_t H, int64_t D, const AttnDropout& drop);

// ---- xent.cu -----------------------------------------------------------------------
void xent_rowmax(float* rowmax, const void* logits, Dt dt, int64_t N, int64_t V, int64_t valid);
void xent_sumexp_target(float* sumexp, float* target_logit, const void* logits, const int32_t* targets,
                        const float* rowmax, Dt dt, int64_t N, int64_t V, int64_t vstart, int64_t valid);
void xent_backward(void* dlogits, const void* logits, const int32_t* targets, const float* rowmax, const float* sumexp,
                   const float* dloss, Dt dt, int64_t N, int64_t V, int64_t vstart, int64_t valid);

// acc[0] += sum_i w_i (log sumexp_i + rowmax_i - target_i), acc[1] += sum_i w_i, with
// w_i = mask[i] or 1 (mask may be null); doubles, one block, fixed order.
void xent_loss_accumulate(double* acc, const float* rowmax, const float* sumexp, const float* target, const float* mask,
                          int64_t N);

// ---- adamw.cu ----------------------------------------------------------------------
struct AdamArgs {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;
  double grad_scale;
};
struct AdamSegment {  // [offset, offset+numel) of the flat buffer
  int64_t offset = 0, numel = 0;
  bool weight_decay = true;
};
// One launch over the whole flat buffer [0, n): each element finds its segment in a
// small device-side table (binary search), elements outside every segment are left
// alone. copy_out (optional, dtype copy_dt) receives the updated parameters, e.g. the
// bf16 weights the forward uses.
void adamw(float* param, const float* grad, float* m, float* v, int64_t n, const AdamArgs& a, const AdamSegment* segs,
           int64_t nseg, void* copy_out, Dt copy_dt);

// ---- gemm.cu (cuBLASLt, fp32 accumulate; never TF32) ---------------------------------
void bias_add_forward(void* x, const void* b, Dt dt, int64_t N, int64_t C);
// db += column sums of dout (fixed 256-row chunks, then an ordered sum of the chunks).
void bias_add_backward(float* db, const void* dout, Dt dt, int64_t N, int64_t C);
// out[N,OC] = inp[N,C] @ w[OC,C]^T (+ bias[OC]); all of dtype dt.
void gemm_forward(void* out, const void* inp, const void* w, const void* bias, Dt dt, int64_t N, int64_t C, int64_t OC);
// dinp[N,C] (= or +=) dout[N,OC] @ w[OC,C]
void gemm_dinp(void* dinp, const void* dout, const void* w, Dt dt, int64_t N, int64_t C, int64_t OC, bool accumulate);
// dw[OC,C] (fp32) += dout[N,OC]^T @ inp[N,C]
void gemm_dw(float* dw, const void* dout, const void* inp, Dt dt, int64_t N, int64_t C, int64_t OC);
// Whether gemm_forward fuses the bias into cuBLASLt's epilogue (default true); off, or
// when the heuristic offers no algorithm with the epilogue, the bias is added by
// bias_add_forward after the GEMM. Returns the previous setting (tests use it to run
// both branches).
bool set_gemm_bias_epilogue(bool on);
// Whether matmuls go through cuBLASLt (default true); off, every one takes the
// cublasGemmEx fallback. Returns the previous setting (tests run both paths).
bool set_gemm_lt(bool on);
// Matmuls run by the cublasGemmEx fallback since start-up.
int64_t gemm_fallbacks();

}  // namespace mtnlg::cuda::k
