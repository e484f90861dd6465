// Tensor-level CUDA ops (ops_cuda.hpp): the raw launchers of kernels.hpp for tensors
// whose shapes and dtype roles core/ops.cpp has already checked (once, for both
// devices, before its dispatch line). What stays here is what only CUDA limits: the
// dtypes its kernels take (no f64) and kernel limits such as the attention head size.
#include "core/cuda/ops_cuda.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <initializer_list>

#include "core/cuda/cuda_check.hpp"
#include "core/cuda/device.hpp"
#include "core/cuda/kernels.hpp"
#include "core/error.hpp"

namespace mtnlg::cuda {

namespace {

using k::Dt;

Dt kdt(const char* op, const char* name, DType d) {
  switch (d) {
    case DType::f32: return Dt::f32;
    case DType::bf16: return Dt::bf16;
    case DType::f16: return Dt::f16;
    default: break;
  }
  throw_runtime("{}: {} has dtype {}, which the CUDA backend does not support (f32, bf16, f16)", op, name, to_string(d));
}

void need_f32(const char* op, const char* name, const Tensor* t) {
  if (t && t->defined() && t->dtype() != DType::f32)
    throw_runtime("{}: {} must be f32 on CUDA (statistics and parameter gradients are fp32), got {}", op, name,
                  to_string(t->dtype()));
}

void expect_numel(const char* op, const char* name, const Tensor& t, int64_t n) {
  if (t.numel() != n)
    throw_runtime("{}: {} has {} elements, expected {} (shape {})", op, name, t.numel(), n, shape_str(t.shape()));
}

template <typename T = void>
T* p(const Tensor* t) {
  return (t && t->defined()) ? static_cast<T*>(t->raw()) : nullptr;
}
float* f(const Tensor& t) { return static_cast<float*>(t.raw()); }
const int32_t* ip(const Tensor& t) { return static_cast<const int32_t*>(t.raw()); }

}  // namespace

// ---- elementwise / utility --------------------------------------------------------------

void fill(Tensor& x, double value) {
  if (x.dtype() == DType::i32) return k::fill_i32(static_cast<int32_t*>(x.raw()), x.numel(), static_cast<int32_t>(value));
  if (x.dtype() == DType::f64) return k::fill_f64(static_cast<double*>(x.raw()), x.numel(), value);  // step statistics
  k::fill(x.raw(), kdt("fill", "x", x.dtype()), x.numel(), static_cast<float>(value));
}

void copy(Tensor& dst, const Tensor& src) {
  if (dst.nbytes() == 0 || dst.raw() == src.raw()) return;
  CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), static_cast<size_t>(dst.nbytes()), cudaMemcpyDeviceToDevice, stream()));
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  const Dt dt = kdt("add", "out", out.dtype());
  k::add(out.raw(), a.raw(), b.raw(), dt, out.numel());
}

void scale(Tensor& x, double s) { k::scale(x.raw(), kdt("scale", "x", x.dtype()), x.numel(), static_cast<float>(s)); }

double sum_squares(const Tensor& x) { return k::sum_squares(x.raw(), kdt("sum_squares", "x", x.dtype()), x.numel()); }

bool all_finite(const Tensor& x) { return std::isfinite(sum_squares(x)); }

void sum_squares_accumulate(Tensor& acc, const Tensor& x) {
  k::sum_squares_accumulate(static_cast<double*>(acc.raw()), x.raw(), kdt("sum_squares_accumulate", "x", x.dtype()),
                            x.numel());
}

void xent_loss_accumulate(Tensor& acc, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit,
                          const Tensor* mask) {
  need_f32("xent_loss_accumulate", "rowmax", &rowmax);  // f64 statistics are CPU-only
  k::xent_loss_accumulate(static_cast<double*>(acc.raw()), f(rowmax), f(sumexp), f(target_logit), p<const float>(mask),
                          rowmax.numel());
}

void convert(Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  k::convert(dst.raw(), kdt("convert", "dst", dst.dtype()), src.raw(), kdt("convert", "src", src.dtype()), dst.numel());
}

// ---- matmul ----------------------------------------------------------------------------

void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias) {
  const char* op = "matmul_forward";
  const Dt dt = kdt(op, "out", out.dtype());
  const int64_t OC = w.dim(0), C = w.dim(1), N = C ? inp.numel() / C : 0;
  k::gemm_forward(out.raw(), inp.raw(), w.raw(), p(bias), dt, N, C, OC);
}

void matmul_backward(Tensor* dinp, Tensor* dw, Tensor* dbias, const Tensor& dout, const Tensor& inp, const Tensor& w,
                     bool accumulate_dinp) {
  const char* op = "matmul_backward";
  const Dt dt = kdt(op, "dout", dout.dtype());
  const int64_t OC = w.dim(0), C = w.dim(1), N = C ? inp.numel() / C : 0;
  if (dinp && dinp->defined()) k::gemm_dinp(dinp->raw(), dout.raw(), w.raw(), dt, N, C, OC, accumulate_dinp);
  if (dw && dw->defined()) k::gemm_dw(f(*dw), dout.raw(), inp.raw(), dt, N, C, OC);
  if (dbias && dbias->defined()) k::bias_add_backward(f(*dbias), dout.raw(), dt, N, OC);
}

// ---- layernorm / gelu / dropout -----------------------------------------------------------

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w, const Tensor& b,
                       double eps) {
  const char* op = "layernorm_forward";
  const Dt dt = kdt(op, "out", out.dtype());
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  k::layernorm_forward(out.raw(), f(mean), f(rstd), inp.raw(), w.raw(), b.raw(), dt, N, C, eps);
}

void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dinp) {
  const char* op = "layernorm_backward";
  const Dt dt = kdt(op, "dinp", dinp.dtype());
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  k::layernorm_backward(dinp.raw(), f(dw), f(db), dout.raw(), inp.raw(), w.raw(), f(mean), f(rstd), dt, N, C,
                        accumulate_dinp);
}

void gelu_forward(Tensor& out, const Tensor& inp) {
  const Dt dt = kdt("gelu_forward", "out", out.dtype());
  k::gelu_forward(out.raw(), inp.raw(), dt, inp.numel());
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const Dt dt = kdt("gelu_backward", "dinp", dinp.dtype());
  k::gelu_backward(dinp.raw(), inp.raw(), dout.raw(), dt, inp.numel());
}

void dropout_forward(Tensor& out, const Tensor& inp, double p_drop, uint64_t key, uint64_t base_index) {
  const Dt dt = kdt("dropout_forward", "out", out.dtype());
  k::dropout(out.raw(), inp.raw(), dt, inp.numel(), p_drop, key, base_index);
}

// ---- attention ---------------------------------------------------------------------------

namespace {
k::AttnDropout attn_drop(const ops::AttentionDropout& d) {
  return k::AttnDropout{d.p, d.key, d.sample_offset, d.head_offset, d.heads_total};
}
void attn_shape(const char* op, const Tensor& qkv, int64_t heads, int64_t& B, int64_t& T, int64_t& D) {
  B = qkv.dim(0);
  T = qkv.dim(1);
  D = qkv.dim(2) / (3 * heads);
  if (D > k::kAttnMaxHeadDim)
    throw_runtime("{}: head size {} exceeds the CUDA kernel's limit of {}", op, D, k::kAttnMaxHeadDim);
}
}  // namespace

void attention_forward_lse(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads, const ops::AttentionDropout& drop) {
  const char* op = "attention_forward_lse";
  const Dt dt = kdt(op, "qkv", qkv.dtype());
  int64_t B, T, D;
  attn_shape(op, qkv, heads, B, T, D);
  k::attention_forward(out.raw(), f(lse), qkv.raw(), dt, B, T, heads, D, attn_drop(drop));
}

void attention_backward_lse(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t heads, const ops::AttentionDropout& drop) {
  const char* op = "attention_backward_lse";
  const Dt dt = kdt(op, "qkv", qkv.dtype());
  if (!out.defined()) throw_runtime("{}: the CUDA backward needs the forward's out", op);
  int64_t B, T, D;
  attn_shape(op, qkv, heads, B, T, D);
  k::attention_backward(dqkv.raw(), dout.raw(), qkv.raw(), out.raw(), f(lse), dt, B, T, heads, D, attn_drop(drop));
}

void attention_forward_probs(Tensor&, Tensor&, const Tensor&, int64_t, const ops::AttentionDropout&) {
  throw_runtime("attention_forward: the probs [B,H,T,T] form is CPU-only; on CUDA call ops::attention_forward_lse");
}
void attention_backward_probs(Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, const ops::AttentionDropout&) {
  throw_runtime("attention_backward: the probs [B,H,T,T] form is CPU-only; on CUDA call ops::attention_backward_lse");
}

// ---- embeddings, positions, biases ------------------------------------------------------------

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table, int64_t vocab_start) {
  const char* op = "embedding_forward";
  const Dt dt = kdt(op, "out", out.dtype());
  const int64_t C = table.dim(1), N = tokens.numel();
  k::embedding_forward(out.raw(), ip(tokens), table.raw(), dt, N, C, vocab_start, table.dim(0));
}

void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout, int64_t vocab_start) {
  const char* op = "embedding_backward";
  const Dt dt = kdt(op, "dout", dout.dtype());
  const int64_t C = dtable.dim(1), N = tokens.numel();
  k::embedding_backward(f(dtable), ip(tokens), dout.raw(), dt, N, C, vocab_start, dtable.dim(0));
}

void position_forward(Tensor& x, const Tensor& pos, int64_t row_start, int64_t seq_len) {
  const char* op = "position_forward";
  const Dt dt = kdt(op, "x", x.dtype());
  const int64_t C = pos.dim(1), rows = C ? x.numel() / C : 0;
  k::position_forward(x.raw(), pos.raw(), dt, rows, C, row_start, seq_len);
}

void position_backward(Tensor& dpos, const Tensor& dx, int64_t row_start, int64_t seq_len) {
  const char* op = "position_backward";
  const Dt dt = kdt(op, "dx", dx.dtype());
  const int64_t C = dpos.dim(1), rows = C ? dx.numel() / C : 0;
  k::position_backward(f(dpos), dx.raw(), dt, rows, C, row_start, seq_len);
}

void bias_add_forward(Tensor& x, const Tensor& b) {
  const Dt dt = kdt("bias_add_forward", "x", x.dtype());
  const int64_t C = b.numel(), N = C ? x.numel() / C : 0;
  k::bias_add_forward(x.raw(), b.raw(), dt, N, C);
}

void bias_add_backward(Tensor& db, const Tensor& dout) {
  const Dt dt = kdt("bias_add_backward", "dout", dout.dtype());
  const int64_t C = db.numel(), N = C ? dout.numel() / C : 0;
  k::bias_add_backward(f(db), dout.raw(), dt, N, C);
}

// ---- cross-entropy ----------------------------------------------------------------------

void xent_rowmax(Tensor& rowmax, const Tensor& logits, int64_t valid_local) {
  const Dt dt = kdt("xent_rowmax", "logits", logits.dtype());
  const int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  k::xent_rowmax(f(rowmax), logits.raw(), dt, N, V, valid_local);
}

void xent_sumexp_target(Tensor& sumexp, Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                        const Tensor& rowmax, int64_t vocab_start, int64_t valid_local) {
  const char* op = "xent_sumexp_target";
  const Dt dt = kdt(op, "logits", logits.dtype());
  const int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  k::xent_sumexp_target(f(sumexp), f(target_logit), logits.raw(), ip(targets), f(rowmax), dt, N, V, vocab_start,
                        valid_local);
}

void xent_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& rowmax,
                   const Tensor& sumexp, const Tensor& dloss, int64_t vocab_start, int64_t valid_local) {
  const char* op = "xent_backward";
  const Dt dt = kdt(op, "dlogits", dlogits.dtype());
  const int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  k::xent_backward(dlogits.raw(), logits.raw(), ip(targets), f(rowmax), f(sumexp), f(dloss), dt, N, V, vocab_start,
                   valid_local);
}

// ---- optimizer ---------------------------------------------------------------------------

void adamw_flat(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& ap,
                const std::vector<AdamWSegment>& segments, Tensor* copy_out) {
  const char* op = "adamw";
  const std::pair<const char*, const Tensor*> args[] = {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}};
  for (const auto& [name, t] : args) {
    if (t->dtype() != DType::f32) throw_runtime("{}: {} must be f32 (the master copy) on CUDA, got {}", op, name,
                                                to_string(t->dtype()));
    if (t->device() != Device::cuda) throw_runtime("{}: {} is not on the CUDA device", op, name);
  }
  const int64_t n = param.numel();
  expect_numel(op, "grad", grad, n);
  expect_numel(op, "m", m, n);
  expect_numel(op, "v", v, n);
  Dt copy_dt = Dt::bf16;
  void* out = nullptr;
  if (copy_out && copy_out->defined()) {
    if (copy_out->device() != Device::cuda) throw_runtime("{}: copy_out is not on the CUDA device", op);
    expect_numel(op, "copy_out", *copy_out, n);
    copy_dt = kdt(op, "copy_out", copy_out->dtype());
    out = copy_out->raw();
  }
  std::vector<k::AdamSegment> segs;
  segs.reserve(segments.size());
  for (const auto& s : segments) segs.push_back(k::AdamSegment{s.offset, s.numel, s.weight_decay});
  const k::AdamArgs a{ap.lr, ap.beta1, ap.beta2, ap.eps, ap.weight_decay, ap.step, ap.grad_scale};
  if (ap.step < 1) throw_runtime("{}: step must be >= 1 (bias correction), got {}", op, ap.step);
  k::adamw(f(param), f(grad), f(m), f(v), n, a, segs.data(), static_cast<int64_t>(segs.size()), out, copy_dt);
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& p, Tensor* copy_out) {
  if (copy_out && copy_out->defined() && copy_out->raw() == param.raw()) copy_out = nullptr;  // fp32: the master is the copy
  adamw_flat(param, grad, m, v, p, {AdamWSegment{0, param.numel(), true}}, copy_out);
}

}  // namespace mtnlg::cuda
