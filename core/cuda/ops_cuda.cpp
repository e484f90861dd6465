// Tensor-level CUDA ops (ops_cuda.hpp): dtype and shape checks, then the raw launchers
// of kernels.hpp. Shapes follow core/ops.cpp's checks so a bad call fails the same way
// on both devices.
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

// The activation dtype shared by every tensor in `ts` (nullptr / undefined skipped).
Dt act_dtype(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  const Tensor* first = nullptr;
  const char* first_name = "";
  for (auto& [name, t] : ts) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      first_name = name;
    } else if (t->dtype() != first->dtype()) {
      throw_runtime("{}: {} is {} but {} is {} (activations and weights must share one dtype on CUDA)", op, name,
                    to_string(t->dtype()), first_name, to_string(first->dtype()));
    }
  }
  MTNLG_CHECK(first != nullptr, "{}: no tensor given", op);
  return kdt(op, first_name, first->dtype());
}

void need_f32(const char* op, const char* name, const Tensor* t) {
  if (t && t->defined() && t->dtype() != DType::f32)
    throw_runtime("{}: {} must be f32 on CUDA (statistics and parameter gradients are fp32), got {}", op, name,
                  to_string(t->dtype()));
}

void need_i32(const char* op, const char* name, const Tensor& t) {
  if (t.dtype() != DType::i32) throw_runtime("{}: {} must be i32, got {}", op, name, to_string(t.dtype()));
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
  expect_numel("copy", "src", src, dst.numel());
  if (dst.dtype() != src.dtype())
    throw_runtime("copy: dtype {} -> {} needs ops::convert", to_string(src.dtype()), to_string(dst.dtype()));
  if (dst.nbytes() == 0 || dst.raw() == src.raw()) return;
  CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), static_cast<size_t>(dst.nbytes()), cudaMemcpyDeviceToDevice, stream()));
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  const Dt dt = act_dtype("add", {{"out", &out}, {"a", &a}, {"b", &b}});
  expect_numel("add", "a", a, out.numel());
  expect_numel("add", "b", b, out.numel());
  k::add(out.raw(), a.raw(), b.raw(), dt, out.numel());
}

void scale(Tensor& x, double s) { k::scale(x.raw(), kdt("scale", "x", x.dtype()), x.numel(), static_cast<float>(s)); }

double sum_squares(const Tensor& x) { return k::sum_squares(x.raw(), kdt("sum_squares", "x", x.dtype()), x.numel()); }

bool all_finite(const Tensor& x) { return std::isfinite(sum_squares(x)); }

namespace {
double* acc_ptr(const char* op, Tensor& acc, int64_t n) {
  if (acc.dtype() != DType::f64 || acc.numel() != n)
    throw_runtime("{}: acc must be f64 with {} elements, got {} {}", op, n, to_string(acc.dtype()), shape_str(acc.shape()));
  return static_cast<double*>(acc.raw());
}
}  // namespace

void sum_squares_accumulate(Tensor& acc, const Tensor& x) {
  k::sum_squares_accumulate(acc_ptr("sum_squares_accumulate", acc, 1), x.raw(), kdt("sum_squares_accumulate", "x", x.dtype()),
                            x.numel());
}

void xent_loss_accumulate(Tensor& acc, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit,
                          const Tensor* mask) {
  double* a = acc_ptr("xent_loss_accumulate", acc, 2);
  const int64_t N = rowmax.numel();
  need_f32("xent_loss_accumulate", "rowmax", &rowmax);
  need_f32("xent_loss_accumulate", "sumexp", &sumexp);
  need_f32("xent_loss_accumulate", "target_logit", &target_logit);
  need_f32("xent_loss_accumulate", "mask", mask);
  expect_numel("xent_loss_accumulate", "sumexp", sumexp, N);
  expect_numel("xent_loss_accumulate", "target_logit", target_logit, N);
  if (mask && mask->defined()) expect_numel("xent_loss_accumulate", "mask", *mask, N);
  k::xent_loss_accumulate(a, f(rowmax), f(sumexp), f(target_logit), p<const float>(mask), N);
}

void convert(Tensor& dst, const Tensor& src) {
  expect_numel("convert", "src", src, dst.numel());
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  k::convert(dst.raw(), kdt("convert", "dst", dst.dtype()), src.raw(), kdt("convert", "src", src.dtype()), dst.numel());
}

// ---- matmul ----------------------------------------------------------------------------

void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias) {
  const char* op = "matmul_forward";
  const Dt dt = act_dtype(op, {{"out", &out}, {"inp", &inp}, {"w", &w}, {"bias", bias}});
  const int64_t OC = w.dim(0), C = w.dim(1), N = C ? inp.numel() / C : 0;
  expect_numel(op, "inp", inp, N * C);
  expect_numel(op, "out", out, N * OC);
  if (bias && bias->defined()) expect_numel(op, "bias", *bias, OC);
  k::gemm_forward(out.raw(), inp.raw(), w.raw(), p(bias), dt, N, C, OC);
}

void matmul_backward(Tensor* dinp, Tensor* dw, Tensor* dbias, const Tensor& dout, const Tensor& inp, const Tensor& w,
                     bool accumulate_dinp) {
  const char* op = "matmul_backward";
  const Dt dt = act_dtype(op, {{"dout", &dout}, {"inp", &inp}, {"w", &w}, {"dinp", dinp}});
  need_f32(op, "dw", dw);
  need_f32(op, "dbias", dbias);
  const int64_t OC = w.dim(0), C = w.dim(1), N = C ? inp.numel() / C : 0;
  expect_numel(op, "dout", dout, N * OC);
  if (dinp) expect_numel(op, "dinp", *dinp, N * C);
  if (dw) expect_numel(op, "dw", *dw, OC * C);
  if (dbias) expect_numel(op, "dbias", *dbias, OC);
  if (dinp && dinp->defined()) k::gemm_dinp(dinp->raw(), dout.raw(), w.raw(), dt, N, C, OC, accumulate_dinp);
  if (dw && dw->defined()) k::gemm_dw(f(*dw), dout.raw(), inp.raw(), dt, N, C, OC);
  if (dbias && dbias->defined()) k::bias_add_backward(f(*dbias), dout.raw(), dt, N, OC);
}

// ---- layernorm / gelu / dropout -----------------------------------------------------------

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w, const Tensor& b,
                       double eps) {
  const char* op = "layernorm_forward";
  const Dt dt = act_dtype(op, {{"out", &out}, {"inp", &inp}, {"w", &w}, {"b", &b}});
  need_f32(op, "mean", &mean);
  need_f32(op, "rstd", &rstd);
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  expect_numel(op, "inp", inp, N * C);
  expect_numel(op, "b", b, C);
  expect_numel(op, "out", out, N * C);
  expect_numel(op, "mean", mean, N);
  expect_numel(op, "rstd", rstd, N);
  k::layernorm_forward(out.raw(), f(mean), f(rstd), inp.raw(), w.raw(), b.raw(), dt, N, C, eps);
}

void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dinp) {
  const char* op = "layernorm_backward";
  const Dt dt = act_dtype(op, {{"dinp", &dinp}, {"dout", &dout}, {"inp", &inp}, {"w", &w}});
  need_f32(op, "dw", &dw);
  need_f32(op, "db", &db);
  need_f32(op, "mean", &mean);
  need_f32(op, "rstd", &rstd);
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  expect_numel(op, "dinp", dinp, N * C);
  expect_numel(op, "dout", dout, N * C);
  expect_numel(op, "dw", dw, C);
  expect_numel(op, "db", db, C);
  expect_numel(op, "mean", mean, N);
  expect_numel(op, "rstd", rstd, N);
  k::layernorm_backward(dinp.raw(), f(dw), f(db), dout.raw(), inp.raw(), w.raw(), f(mean), f(rstd), dt, N, C,
                        accumulate_dinp);
}

void gelu_forward(Tensor& out, const Tensor& inp) {
  const Dt dt = act_dtype("gelu_forward", {{"out", &out}, {"inp", &inp}});
  expect_numel("gelu_forward", "out", out, inp.numel());
  k::gelu_forward(out.raw(), inp.raw(), dt, inp.numel());
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const Dt dt = act_dtype("gelu_backward", {{"dinp", &dinp}, {"inp", &inp}, {"dout", &dout}});
  expect_numel("gelu_backward", "dinp", dinp, inp.numel());
  expect_numel("gelu_backward", "dout", dout, inp.numel());
  k::gelu_backward(dinp.raw(), inp.raw(), dout.raw(), dt, inp.numel());
}

void dropout_forward(Tensor& out, const Tensor& inp, double p_drop, uint64_t key, uint64_t base_index) {
  const Dt dt = act_dtype("dropout_forward", {{"out", &out}, {"inp", &inp}});
  expect_numel("dropout_forward", "out", out, inp.numel());
  k::dropout(out.raw(), inp.raw(), dt, inp.numel(), p_drop, key, base_index);
}

// ---- attention ---------------------------------------------------------------------------

namespace {
k::AttnDropout attn_drop(const ops::AttentionDropout& d) {
  return k::AttnDropout{d.p, d.key, d.sample_offset, d.head_offset, d.heads_total};
}
void attn_shape(const char* op, const Tensor& qkv, int64_t heads, int64_t& B, int64_t& T, int64_t& D) {
  if (qkv.ndim() != 3) throw_runtime("{}: qkv must be [B,T,3C], got {}", op, shape_str(qkv.shape()));
  if (heads <= 0 || qkv.dim(2) % (3 * heads) != 0)
    throw_runtime("{}: qkv width {} is not 3 x heads ({}) x head size", op, qkv.dim(2), heads);
  B = qkv.dim(0);
  T = qkv.dim(1);
  D = qkv.dim(2) / (3 * heads);
  if (D > k::kAttnMaxHeadDim)
    throw_runtime("{}: head size {} exceeds the CUDA kernel's limit of {}", op, D, k::kAttnMaxHeadDim);
}
}  // namespace

void attention_forward_lse(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads, const ops::AttentionDropout& drop) {
  const char* op = "attention_forward_lse";
  const Dt dt = act_dtype(op, {{"out", &out}, {"qkv", &qkv}});
  need_f32(op, "lse", &lse);
  int64_t B, T, D;
  attn_shape(op, qkv, heads, B, T, D);
  expect_numel(op, "out", out, B * T * heads * D);
  expect_numel(op, "lse", lse, B * heads * T);
  k::attention_forward(out.raw(), f(lse), qkv.raw(), dt, B, T, heads, D, attn_drop(drop));
}

void attention_backward_lse(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t heads, const ops::AttentionDropout& drop) {
  const char* op = "attention_backward_lse";
  const Dt dt = act_dtype(op, {{"dqkv", &dqkv}, {"dout", &dout}, {"qkv", &qkv}, {"out", &out}});
  need_f32(op, "lse", &lse);
  int64_t B, T, D;
  attn_shape(op, qkv, heads, B, T, D);
  expect_numel(op, "dqkv", dqkv, qkv.numel());
  expect_numel(op, "dout", dout, B * T * heads * D);
  expect_numel(op, "out", out, B * T * heads * D);
  expect_numel(op, "lse", lse, B * heads * T);
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
  const Dt dt = act_dtype(op, {{"out", &out}, {"table", &table}});
  need_i32(op, "tokens", tokens);
  const int64_t C = table.dim(1), N = tokens.numel();
  expect_numel(op, "out", out, N * C);
  k::embedding_forward(out.raw(), ip(tokens), table.raw(), dt, N, C, vocab_start, table.dim(0));
}

void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout, int64_t vocab_start) {
  const char* op = "embedding_backward";
  const Dt dt = act_dtype(op, {{"dout", &dout}});
  need_f32(op, "dtable", &dtable);
  need_i32(op, "tokens", tokens);
  const int64_t C = dtable.dim(1), N = tokens.numel();
  expect_numel(op, "dout", dout, N * C);
  k::embedding_backward(f(dtable), ip(tokens), dout.raw(), dt, N, C, vocab_start, dtable.dim(0));
}

void position_forward(Tensor& x, const Tensor& pos, int64_t row_start, int64_t seq_len) {
  const char* op = "position_forward";
  const Dt dt = act_dtype(op, {{"x", &x}, {"pos", &pos}});
  const int64_t C = pos.dim(1), rows = C ? x.numel() / C : 0;
  if (seq_len <= 0 || seq_len > pos.dim(0))
    throw_runtime("{}: sequence {} outside the position table (1..{})", op, seq_len, pos.dim(0));
  k::position_forward(x.raw(), pos.raw(), dt, rows, C, row_start, seq_len);
}

void position_backward(Tensor& dpos, const Tensor& dx, int64_t row_start, int64_t seq_len) {
  const char* op = "position_backward";
  const Dt dt = act_dtype(op, {{"dx", &dx}});
  need_f32(op, "dpos", &dpos);
  const int64_t C = dpos.dim(1), rows = C ? dx.numel() / C : 0;
  if (seq_len <= 0 || seq_len > dpos.dim(0))
    throw_runtime("{}: sequence {} outside the position table (1..{})", op, seq_len, dpos.dim(0));
  k::position_backward(f(dpos), dx.raw(), dt, rows, C, row_start, seq_len);
}

void bias_add_forward(Tensor& x, const Tensor& b) {
  const Dt dt = act_dtype("bias_add_forward", {{"x", &x}, {"b", &b}});
  const int64_t C = b.numel(), N = C ? x.numel() / C : 0;
  expect_numel("bias_add_forward", "x", x, N * C);
  k::bias_add_forward(x.raw(), b.raw(), dt, N, C);
}

void bias_add_backward(Tensor& db, const Tensor& dout) {
  const Dt dt = act_dtype("bias_add_backward", {{"dout", &dout}});
  need_f32("bias_add_backward", "db", &db);
  const int64_t C = db.numel(), N = C ? dout.numel() / C : 0;
  expect_numel("bias_add_backward", "dout", dout, N * C);
  k::bias_add_backward(f(db), dout.raw(), dt, N, C);
}

// ---- cross-entropy ----------------------------------------------------------------------

void xent_rowmax(Tensor& rowmax, const Tensor& logits, int64_t valid_local) {
  const Dt dt = act_dtype("xent_rowmax", {{"logits", &logits}});
  need_f32("xent_rowmax", "rowmax", &rowmax);
  const int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  expect_numel("xent_rowmax", "logits", logits, N * V);
  k::xent_rowmax(f(rowmax), logits.raw(), dt, N, V, valid_local);
}

void xent_sumexp_target(Tensor& sumexp, Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                        const Tensor& rowmax, int64_t vocab_start, int64_t valid_local) {
  const char* op = "xent_sumexp_target";
  const Dt dt = act_dtype(op, {{"logits", &logits}});
  need_f32(op, "sumexp", &sumexp);
  need_f32(op, "target_logit", &target_logit);
  need_f32(op, "rowmax", &rowmax);
  need_i32(op, "targets", targets);
  const int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  expect_numel(op, "targets", targets, N);
  expect_numel(op, "sumexp", sumexp, N);
  expect_numel(op, "target_logit", target_logit, N);
  k::xent_sumexp_target(f(sumexp), f(target_logit), logits.raw(), ip(targets), f(rowmax), dt, N, V, vocab_start,
                        valid_local);
}

void xent_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& rowmax,
                   const Tensor& sumexp, const Tensor& dloss, int64_t vocab_start, int64_t valid_local) {
  const char* op = "xent_backward";
  const Dt dt = act_dtype(op, {{"dlogits", &dlogits}, {"logits", &logits}});
  need_f32(op, "rowmax", &rowmax);
  need_f32(op, "sumexp", &sumexp);
  need_f32(op, "dloss", &dloss);
  need_i32(op, "targets", targets);
  const int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  expect_numel(op, "dlogits", dlogits, N * V);
  expect_numel(op, "targets", targets, N);
  expect_numel(op, "dloss", dloss, N);
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
