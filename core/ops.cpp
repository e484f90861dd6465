// Dispatch of core/ops.hpp: checks shapes and dtypes once, then calls the backend for
// the tensors' device (core/cpu/ops_cpu.cpp; the CUDA backend registers itself in
// core/cuda/ when built with MTNLG_CUDA) instantiated for their dtype.
#include "core/ops.hpp"

#include <cmath>
#include <cstring>

#include "core/cpu/ops_cpu.hpp"
#include "core/half.hpp"
#include "core/ops_checks.hpp"
#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/ops_cuda.hpp"
// The one dispatch line of an op, after its shape and dtype checks (written once, here,
// for both devices): `if (tensors are on CUDA) return cuda::<call>;`.
#define MTNLG_CUDA_DISPATCH(on_cuda, call) \
  if (on_cuda) return ::mtnlg::cuda::call
#else
// same_device() throws for CUDA tensors in a CPU-only build.
#define MTNLG_CUDA_DISPATCH(on_cuda, call) (void)(on_cuda)
#endif

namespace mtnlg::ops {

namespace detail {

// True when the tensors live on the CUDA device (then the caller hands the op to the
// CUDA backend, core/cuda/ops_cuda.hpp); without the backend that is an error.
bool same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  Device d = Device::cpu;
  bool first = true;
  for (auto* t : ts) {
    if (!t || !t->defined()) continue;
    if (first) {
      d = t->device();
      first = false;
    } else if (t->device() != d) {
      throw_runtime("{}: tensors on different devices ({} and {}): place every tensor of an op on one device", op,
                    to_string(d), to_string(t->device()));
    }
  }
#ifndef MTNLG_HAVE_CUDA
  if (d == Device::cuda)
    throw_runtime("{}: this build has no CUDA implementation of the op (the CUDA backend is enabled with MTNLG_CUDA)", op);
#endif
  return d == Device::cuda;
}

void same_float_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  DType d = DType::f32;
  bool first = true;
  for (auto* t : ts) {
    if (!t || !t->defined()) continue;
    if (first) {
      d = t->dtype();
      first = false;
    } else if (t->dtype() != d) {
      throw_runtime("{}: mixed dtypes {} and {}", op, to_string(d), to_string(t->dtype()));
    }
  }
  if (d != DType::f32 && d != DType::f64) throw_runtime("{}: dtype {} not supported on the CPU", op, to_string(d));
}

DType act_dtype(const char* op, std::initializer_list<Named> acts, std::initializer_list<Named> wide) {
  const Tensor* first = nullptr;
  const char* first_name = "";
  for (auto& [name, t] : acts) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      first_name = name;
    } else if (t->dtype() != first->dtype()) {
      throw_runtime("{}: {} is {} but {} is {} (activations and forward weights share one dtype)", op, name,
                    to_string(t->dtype()), first_name, to_string(first->dtype()));
    }
  }
  MTNLG_CHECK(first != nullptr, "{}: no activation tensor given", op);
  const DType act = first->dtype();
  if (act == DType::i32) throw_runtime("{}: {} is i32, expected a floating dtype", op, first_name);
  const DType w = wide_dtype(act);
  for (auto& [name, t] : wide)
    if (t && t->defined() && t->dtype() != w)
      throw_runtime("{}: {} must be {} with {} activations (statistics and parameter gradients are wide), got {}", op,
                    name, to_string(w), to_string(act), to_string(t->dtype()));
  return act;
}

const Tensor& Widened::in(const Tensor& t) {
  if (!is_low(t.dtype())) return t;
  Tensor& w = keep_.emplace_back(Tensor::empty(t.shape(), DType::f32, t.device()));
  ops::convert(w, t);
  return w;
}

Tensor& Widened::out(Tensor& t, bool read) {
  if (!is_low(t.dtype())) return t;
  Tensor& w = keep_.emplace_back(Tensor::empty(t.shape(), DType::f32, t.device()));
  if (read) ops::convert(w, t);
  outs_.emplace_back(&t, &w);
  return w;
}

void Widened::store() {
  for (auto& [low, wide] : outs_) ops::convert(*low, *wide);
  outs_.clear();
}

}  // namespace detail

using detail::same_device;
using detail::same_float_dtype;
using detail::act_dtype;
using detail::is_low;
using detail::Widened;

namespace {

void expect_numel(const char* op, const char* name, const Tensor& t, int64_t n) {
  if (t.numel() != n) throw_runtime("{}: {} has {} elements, expected {} (shape {})", op, name, t.numel(), n, shape_str(t.shape()));
}
void expect_ndim(const char* op, const char* name, const Tensor& t, int64_t nd) {
  if (t.ndim() != nd) throw_runtime("{}: {} must have {} dimensions, got shape {}", op, name, nd, shape_str(t.shape()));
}
void expect_i32(const char* op, const char* name, const Tensor& t) {
  if (t.dtype() != DType::i32) throw_runtime("{}: {} must be i32, got {}", op, name, to_string(t.dtype()));
}
void expect_positions(const char* op, int64_t seq_len, int64_t table_rows) {
  if (seq_len <= 0 || seq_len > table_rows)
    throw_runtime("{}: sequence {} outside the position table (1..{})", op, seq_len, table_rows);
}

template <typename F>
void by_dtype(DType d, F&& f) {
  if (d == DType::f32)
    f(float{});
  else
    f(double{});
}

template <typename T>
T* ptr(const Tensor* t) {
  return (t && t->defined()) ? t->kernel_data<T>() : nullptr;
}

}  // namespace

void fill(Tensor& x, double value) {
  MTNLG_CUDA_DISPATCH(same_device("fill", {&x}), fill(x, value));
  switch (x.dtype()) {
    case DType::f32: {
      float* p = x.kernel_data<float>();
      float v = static_cast<float>(value);
      for (int64_t i = 0; i < x.numel(); ++i) p[i] = v;
      break;
    }
    case DType::f64: {
      double* p = x.kernel_data<double>();
      for (int64_t i = 0; i < x.numel(); ++i) p[i] = value;
      break;
    }
    case DType::i32: {
      int32_t* p = x.kernel_data<int32_t>();
      for (int64_t i = 0; i < x.numel(); ++i) p[i] = static_cast<int32_t>(value);
      break;
    }
    case DType::bf16:
    case DType::f16: {
      const float f = static_cast<float>(value);
      const uint16_t h = x.dtype() == DType::bf16 ? half::f32_to_bf16(f) : half::f32_to_f16(f);
      uint16_t* p = x.kernel_data<uint16_t>();
      for (int64_t i = 0; i < x.numel(); ++i) p[i] = h;
      break;
    }
  }
}

void copy(Tensor& dst, const Tensor& src) {
  const bool cuda = same_device("copy", {&dst, &src});
  expect_numel("copy", "src", src, dst.numel());
  if (dst.dtype() != src.dtype()) throw_runtime("copy: dtype {} -> {} needs ops::convert", to_string(src.dtype()), to_string(dst.dtype()));
  MTNLG_CUDA_DISPATCH(cuda, copy(dst, src));
  std::memmove(dst.raw(), src.raw(), static_cast<size_t>(dst.nbytes()));
}
namespace {
double load_as_double(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.kernel_data<float>()[i];
    case DType::f64: return t.kernel_data<double>()[i];
    case DType::bf16: return half::bf16_to_f32(t.kernel_data<uint16_t>()[i]);
    case DType::f16: return half::f16_to_f32(t.kernel_data<uint16_t>()[i]);
    case DType::i32: return t.kernel_data<int32_t>()[i];
  }
  return 0;
}
void store_double(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32: t.kernel_data<float>()[i] = static_cast<float>(v); break;
    case DType::f64: t.kernel_data<double>()[i] = v; break;
    case DType::bf16: t.kernel_data<uint16_t>()[i] = half::f32_to_bf16(static_cast<float>(v)); break;
    case DType::f16: t.kernel_data<uint16_t>()[i] = half::f32_to_f16(static_cast<float>(v)); break;
    case DType::i32: t.kernel_data<int32_t>()[i] = static_cast<int32_t>(v); break;
  }
}
}  // namespace

void convert(Tensor& dst, const Tensor& src) {
  const bool cuda = same_device("convert", {&dst, &src});
  expect_numel("convert", "src", src, dst.numel());
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  MTNLG_CUDA_DISPATCH(cuda, convert(dst, src));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < dst.numel(); ++i) store_double(dst, i, load_as_double(src, i));
}

// Every op below: CUDA tensors go to the CUDA backend; on the CPU the dtype roles are
// checked once (act_dtype), bf16/f16 activations run the f32 kernel through Widened,
// and f32/f64 run the kernel instantiated for their type.

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  const bool cuda = same_device("add", {&out, &a, &b});
  const DType dt = act_dtype("add", {{"out", &out}, {"a", &a}, {"b", &b}});
  expect_numel("add", "a", a, out.numel());
  expect_numel("add", "b", b, out.numel());
  MTNLG_CUDA_DISPATCH(cuda, add(out, a, b));
  if (is_low(dt)) {
    Widened w;
    add(w.out(out), w.in(a), w.in(b));
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    T* o = out.kernel_data<T>();
    const T *x = a.kernel_data<T>(), *y = b.kernel_data<T>();
    int64_t n = out.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  });
}

void add_inplace(Tensor& acc, const Tensor& x) { add(acc, acc, x); }

void scale(Tensor& x, double s) {
  MTNLG_CUDA_DISPATCH(same_device("scale", {&x}), scale(x, s));
  const DType dt = act_dtype("scale", {{"x", &x}});
  if (is_low(dt)) {
    Widened w;
    scale(w.out(x, true), s);
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    T* p = x.kernel_data<T>();
    T ts = static_cast<T>(s);
    int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] *= ts;
  });
}

double sum_squares(const Tensor& x) {
  MTNLG_CUDA_DISPATCH(same_device("sum_squares", {&x}), sum_squares(x));
  const DType dt = act_dtype("sum_squares", {{"x", &x}});
  if (is_low(dt)) {
    Widened w;
    return sum_squares(w.in(x));
  }
  double total = 0;
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    const T* p = x.kernel_data<T>();
    int64_t n = x.numel();
    // Fixed-size chunks summed in order: the result does not depend on the thread count.
    constexpr int64_t kChunk = 1 << 16;
    int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> part(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double s = 0;
      int64_t e = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < e; ++i) s += static_cast<double>(p[i]) * p[i];
      part[c] = s;
    }
    for (double s : part) total += s;
  });
  return total;
}

bool all_finite(const Tensor& x) { return std::isfinite(sum_squares(x)); }

namespace {
void expect_acc(const char* op, const Tensor& acc, int64_t n) {
  if (acc.dtype() != DType::f64 || acc.numel() != n)
    throw_runtime("{}: acc must be f64 with {} elements, got {} {}", op, n, to_string(acc.dtype()), shape_str(acc.shape()));
}
}  // namespace

void sum_squares_accumulate(Tensor& acc, const Tensor& x) {
  const bool cuda = same_device("sum_squares_accumulate", {&acc, &x});
  expect_acc("sum_squares_accumulate", acc, 1);
  MTNLG_CUDA_DISPATCH(cuda, sum_squares_accumulate(acc, x));
  acc.kernel_data<double>()[0] += sum_squares(x);
}

void xent_loss_accumulate(Tensor& acc, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit,
                          const Tensor* mask) {
  const bool cuda = same_device("xent_loss_accumulate", {&acc, &rowmax, &sumexp, &target_logit, mask});
  expect_acc("xent_loss_accumulate", acc, 2);
  const int64_t N = rowmax.numel();
  expect_numel("xent_loss_accumulate", "sumexp", sumexp, N);
  expect_numel("xent_loss_accumulate", "target_logit", target_logit, N);
  if (sumexp.dtype() != rowmax.dtype() || target_logit.dtype() != rowmax.dtype() ||
      (rowmax.dtype() != DType::f32 && rowmax.dtype() != DType::f64))
    throw_runtime("xent_loss_accumulate: rowmax, sumexp and target_logit must share one wide dtype (f32 or f64)");
  if (mask && mask->defined()) {
    expect_numel("xent_loss_accumulate", "mask", *mask, N);
    if (mask->dtype() != DType::f32) throw_runtime("xent_loss_accumulate: mask must be f32, got {}", to_string(mask->dtype()));
  }
  MTNLG_CUDA_DISPATCH(cuda, xent_loss_accumulate(acc, rowmax, sumexp, target_logit, mask));
  const float* m = mask && mask->defined() ? mask->kernel_data<float>() : nullptr;
  double loss = 0, count = 0;
  by_dtype(rowmax.dtype(), [&](auto z) {
    using T = decltype(z);
    const T *mx = rowmax.kernel_data<T>(), *se = sumexp.kernel_data<T>(), *tl = target_logit.kernel_data<T>();
    for (int64_t i = 0; i < N; ++i) {
      const double w = m ? m[i] : 1.0;
      loss += w * (std::log(static_cast<double>(se[i])) + static_cast<double>(mx[i]) - static_cast<double>(tl[i]));
      count += w;
    }
  });
  double* a = acc.kernel_data<double>();
  a[0] += loss;
  a[1] += count;
}

void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias) {
  const bool cuda = same_device("matmul_forward", {&out, &inp, &w, bias});
  const DType dt = act_dtype("matmul_forward", {{"out", &out}, {"inp", &inp}, {"w", &w}, {"bias", bias}});
  expect_ndim("matmul_forward", "w", w, 2);
  int64_t OC = w.dim(0), C = w.dim(1), N = C ? inp.numel() / C : 0;
  expect_numel("matmul_forward", "inp", inp, N * C);
  expect_numel("matmul_forward", "out", out, N * OC);
  if (bias && bias->defined()) expect_numel("matmul_forward", "bias", *bias, OC);
  MTNLG_CUDA_DISPATCH(cuda, matmul_forward(out, inp, w, bias));
  if (is_low(dt)) {
    Widened wd;
    matmul_forward(wd.out(out), wd.in(inp), wd.in(w), wd.in(bias));
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::matmul_forward<T>(out.kernel_data<T>(), inp.kernel_data<T>(), w.kernel_data<T>(), ptr<T>(bias), N, C, OC);
  });
}

void matmul_backward(Tensor* dinp, Tensor* dw, Tensor* dbias, const Tensor& dout, const Tensor& inp, const Tensor& w,
                     bool accumulate_dinp) {
  const bool cuda = same_device("matmul_backward", {dinp, dw, dbias, &dout, &inp, &w});
  const DType dt = act_dtype("matmul_backward", {{"dout", &dout}, {"inp", &inp}, {"w", &w}, {"dinp", dinp}},
                             {{"dw", dw}, {"dbias", dbias}});
  expect_ndim("matmul_backward", "w", w, 2);
  int64_t OC = w.dim(0), C = w.dim(1), N = C ? inp.numel() / C : 0;
  expect_numel("matmul_backward", "inp", inp, N * C);
  expect_numel("matmul_backward", "dout", dout, N * OC);
  if (dinp && dinp->defined()) expect_numel("matmul_backward", "dinp", *dinp, N * C);
  if (dw && dw->defined()) expect_numel("matmul_backward", "dw", *dw, OC * C);
  if (dbias && dbias->defined()) expect_numel("matmul_backward", "dbias", *dbias, OC);
  MTNLG_CUDA_DISPATCH(cuda, matmul_backward(dinp, dw, dbias, dout, inp, w, accumulate_dinp));
  if (is_low(dt)) {
    Widened wd;
    matmul_backward(wd.out(dinp, accumulate_dinp), dw, dbias, wd.in(dout), wd.in(inp), wd.in(w), accumulate_dinp);
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::matmul_backward<T>(ptr<T>(dinp), ptr<T>(dw), ptr<T>(dbias), dout.kernel_data<T>(), inp.kernel_data<T>(), w.kernel_data<T>(), N, C, OC,
                            accumulate_dinp);
  });
}

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w, const Tensor& b,
                       double eps) {
  const bool cuda = same_device("layernorm_forward", {&out, &mean, &rstd, &inp, &w, &b});
  const DType dt = act_dtype("layernorm_forward", {{"out", &out}, {"inp", &inp}, {"w", &w}, {"b", &b}},
                             {{"mean", &mean}, {"rstd", &rstd}});
  int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  expect_numel("layernorm_forward", "inp", inp, N * C);
  expect_numel("layernorm_forward", "b", b, C);
  expect_numel("layernorm_forward", "out", out, N * C);
  expect_numel("layernorm_forward", "mean", mean, N);
  expect_numel("layernorm_forward", "rstd", rstd, N);
  MTNLG_CUDA_DISPATCH(cuda, layernorm_forward(out, mean, rstd, inp, w, b, eps));
  if (is_low(dt)) {
    Widened wd;
    layernorm_forward(wd.out(out), mean, rstd, wd.in(inp), wd.in(w), wd.in(b), eps);
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::layernorm_forward<T>(out.kernel_data<T>(), mean.kernel_data<T>(), rstd.kernel_data<T>(), inp.kernel_data<T>(), w.kernel_data<T>(), b.kernel_data<T>(), N, C,
                              eps);
  });
}

void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dinp) {
  const bool cuda = same_device("layernorm_backward", {&dinp, &dw, &db, &dout, &inp, &w, &mean, &rstd});
  const DType dt = act_dtype("layernorm_backward", {{"dinp", &dinp}, {"dout", &dout}, {"inp", &inp}, {"w", &w}},
                             {{"dw", &dw}, {"db", &db}, {"mean", &mean}, {"rstd", &rstd}});
  int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  expect_numel("layernorm_backward", "inp", inp, N * C);
  expect_numel("layernorm_backward", "dinp", dinp, N * C);
  expect_numel("layernorm_backward", "dout", dout, N * C);
  expect_numel("layernorm_backward", "dw", dw, C);
  expect_numel("layernorm_backward", "db", db, C);
  expect_numel("layernorm_backward", "mean", mean, N);
  expect_numel("layernorm_backward", "rstd", rstd, N);
  MTNLG_CUDA_DISPATCH(cuda, layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, accumulate_dinp));
  if (is_low(dt)) {
    Widened wd;
    layernorm_backward(wd.out(dinp, accumulate_dinp), dw, db, wd.in(dout), wd.in(inp), wd.in(w), mean, rstd,
                       accumulate_dinp);
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::layernorm_backward<T>(dinp.kernel_data<T>(), dw.kernel_data<T>(), db.kernel_data<T>(), dout.kernel_data<T>(), inp.kernel_data<T>(), w.kernel_data<T>(),
                               mean.kernel_data<T>(), rstd.kernel_data<T>(), N, C, accumulate_dinp);
  });
}

void gelu_forward(Tensor& out, const Tensor& inp) {
  const bool cuda = same_device("gelu_forward", {&out, &inp});
  const DType dt = act_dtype("gelu_forward", {{"out", &out}, {"inp", &inp}});
  expect_numel("gelu_forward", "out", out, inp.numel());
  MTNLG_CUDA_DISPATCH(cuda, gelu_forward(out, inp));
  if (is_low(dt)) {
    Widened wd;
    gelu_forward(wd.out(out), wd.in(inp));
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::gelu_forward<T>(out.kernel_data<T>(), inp.kernel_data<T>(), inp.numel());
  });
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const bool cuda = same_device("gelu_backward", {&dinp, &inp, &dout});
  const DType dt = act_dtype("gelu_backward", {{"dinp", &dinp}, {"inp", &inp}, {"dout", &dout}});
  expect_numel("gelu_backward", "dinp", dinp, inp.numel());
  expect_numel("gelu_backward", "dout", dout, inp.numel());
  MTNLG_CUDA_DISPATCH(cuda, gelu_backward(dinp, inp, dout));
  if (is_low(dt)) {
    Widened wd;
    gelu_backward(wd.out(dinp), wd.in(inp), wd.in(dout));
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::gelu_backward<T>(dinp.kernel_data<T>(), inp.kernel_data<T>(), dout.kernel_data<T>(), inp.numel());
  });
}

void dropout_forward(Tensor& out, const Tensor& inp, double p, uint64_t key, uint64_t base_index) {
  const bool cuda = same_device("dropout_forward", {&out, &inp});
  const DType dt = act_dtype("dropout_forward", {{"out", &out}, {"inp", &inp}});
  expect_numel("dropout_forward", "out", out, inp.numel());
  if (p <= 0) {  // identity: no widening, no copy when in place
    if (out.raw() != inp.raw()) copy(out, inp);
    return;
  }
  MTNLG_CUDA_DISPATCH(cuda, dropout_forward(out, inp, p, key, base_index));
  if (is_low(dt)) {
    Widened wd;
    dropout_forward(wd.out(out), wd.in(inp), p, key, base_index);
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::dropout<T>(out.kernel_data<T>(), inp.kernel_data<T>(), inp.numel(), p, key, base_index);
  });
}

void dropout_backward(Tensor& dinp, const Tensor& dout, double p, uint64_t key, uint64_t base_index) {
  // The mask and scale are the same as forward: dinp = dout * mask / (1-p).
  dropout_forward(dinp, dout, p, key, base_index);
}

void attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t heads, const AttentionDropout& drop) {
  MTNLG_CUDA_DISPATCH(same_device("attention_forward", {&out, &probs, &qkv}), attention_forward_probs(out, probs, qkv, heads, drop));
  same_float_dtype("attention_forward", {&out, &probs, &qkv});
  MTNLG_CHECK(qkv.ndim() == 3, "attention qkv must be [B,T,3C], got {}", shape_str(qkv.shape()));
  int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / (3 * heads);
  expect_numel("attention_forward", "out", out, B * T * heads * D);
  expect_numel("attention_forward", "probs", probs, B * heads * T * T);
  by_dtype(out.dtype(), [&](auto z) {
    using V = decltype(z);
    cpu::attention_forward<V>(out.kernel_data<V>(), probs.kernel_data<V>(), qkv.kernel_data<V>(), B, T, heads, D, drop.p, drop.key,
                              drop.sample_offset, drop.head_offset, drop.heads_total ? drop.heads_total : heads);
  });
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads,
                        const AttentionDropout& drop) {
  MTNLG_CUDA_DISPATCH(same_device("attention_backward", {&dqkv, &dout, &qkv, &probs}), attention_backward_probs(dqkv, dout, qkv, probs, heads, drop));
  same_float_dtype("attention_backward", {&dqkv, &dout, &qkv, &probs});
  int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / (3 * heads);
  expect_numel("attention_backward", "dqkv", dqkv, qkv.numel());
  by_dtype(dqkv.dtype(), [&](auto z) {
    using V = decltype(z);
    cpu::attention_backward<V>(dqkv.kernel_data<V>(), dout.kernel_data<V>(), qkv.kernel_data<V>(), probs.kernel_data<V>(), B, T, heads, D, drop.p,
                               drop.key, drop.sample_offset, drop.head_offset, drop.heads_total ? drop.heads_total : heads);
  });
}

void embedding_forward(Tensor& out, const Tensor& tokens, const Tensor& table, int64_t vocab_start) {
  const bool cuda = same_device("embedding_forward", {&out, &tokens, &table});
  const DType dt = act_dtype("embedding_forward", {{"out", &out}, {"table", &table}});
  expect_i32("embedding_forward", "tokens", tokens);
  expect_ndim("embedding_forward", "table", table, 2);
  int64_t C = table.dim(1), N = tokens.numel();
  expect_numel("embedding_forward", "out", out, N * C);
  MTNLG_CUDA_DISPATCH(cuda, embedding_forward(out, tokens, table, vocab_start));
  if (is_low(dt)) {  // a row copy: exact in any dtype
    const auto* tab = table.kernel_data<uint16_t>();
    auto* o = out.kernel_data<uint16_t>();
    const int32_t* tok = tokens.kernel_data<int32_t>();
    const int64_t V = table.dim(0);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t id = static_cast<int64_t>(tok[i]) - vocab_start;
      for (int64_t c = 0; c < C; ++c) o[i * C + c] = (id >= 0 && id < V) ? tab[id * C + c] : uint16_t{0};
    }
    return;
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::embedding_forward<T>(out.kernel_data<T>(), tokens.kernel_data<int32_t>(), table.kernel_data<T>(), N, C, vocab_start, table.dim(0));
  });
}

void embedding_backward(Tensor& dtable, const Tensor& tokens, const Tensor& dout, int64_t vocab_start) {
  const bool cuda = same_device("embedding_backward", {&dtable, &tokens, &dout});
  const DType dt = act_dtype("embedding_backward", {{"dout", &dout}}, {{"dtable", &dtable}});
  expect_i32("embedding_backward", "tokens", tokens);
  expect_ndim("embedding_backward", "dtable", dtable, 2);
  int64_t C = dtable.dim(1), N = tokens.numel();
  expect_numel("embedding_backward", "dout", dout, N * C);
  MTNLG_CUDA_DISPATCH(cuda, embedding_backward(dtable, tokens, dout, vocab_start));
  if (is_low(dt)) {
    Widened wd;
    return embedding_backward(dtable, tokens, wd.in(dout), vocab_start);
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::embedding_backward<T>(dtable.kernel_data<T>(), tokens.kernel_data<int32_t>(), dout.kernel_data<T>(), N, C, vocab_start, dtable.dim(0));
  });
}

void position_forward(Tensor& x, const Tensor& pos, int64_t row_start, int64_t seq_len) {
  const bool cuda = same_device("position_forward", {&x, &pos});
  const DType dt = act_dtype("position_forward", {{"x", &x}, {"pos", &pos}});
  expect_ndim("position_forward", "pos", pos, 2);
  int64_t C = pos.dim(1), rows = C ? x.numel() / C : 0;
  expect_numel("position_forward", "x", x, rows * C);
  expect_positions("position_forward", seq_len, pos.dim(0));
  MTNLG_CUDA_DISPATCH(cuda, position_forward(x, pos, row_start, seq_len));
  if (is_low(dt)) {
    Widened wd;
    position_forward(wd.out(x, true), wd.in(pos), row_start, seq_len);
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::position_forward<V>(x.kernel_data<V>(), pos.kernel_data<V>(), rows, C, row_start, seq_len);
  });
}

void position_backward(Tensor& dpos, const Tensor& dx, int64_t row_start, int64_t seq_len) {
  const bool cuda = same_device("position_backward", {&dpos, &dx});
  const DType dt = act_dtype("position_backward", {{"dx", &dx}}, {{"dpos", &dpos}});
  expect_ndim("position_backward", "dpos", dpos, 2);
  int64_t C = dpos.dim(1), rows = C ? dx.numel() / C : 0;
  expect_numel("position_backward", "dx", dx, rows * C);
  expect_positions("position_backward", seq_len, dpos.dim(0));
  MTNLG_CUDA_DISPATCH(cuda, position_backward(dpos, dx, row_start, seq_len));
  if (is_low(dt)) {
    Widened wd;
    return position_backward(dpos, wd.in(dx), row_start, seq_len);
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::position_backward<V>(dpos.kernel_data<V>(), dx.kernel_data<V>(), rows, C, row_start, seq_len);
  });
}

void bias_add_forward(Tensor& x, const Tensor& b) {
  const bool cuda = same_device("bias_add_forward", {&x, &b});
  const DType dt = act_dtype("bias_add_forward", {{"x", &x}, {"b", &b}});
  int64_t C = b.numel(), N = C ? x.numel() / C : 0;
  expect_numel("bias_add_forward", "x", x, N * C);
  MTNLG_CUDA_DISPATCH(cuda, bias_add_forward(x, b));
  if (is_low(dt)) {
    Widened wd;
    bias_add_forward(wd.out(x, true), wd.in(b));
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::bias_add_forward<V>(x.kernel_data<V>(), b.kernel_data<V>(), N, C);
  });
}

void bias_add_backward(Tensor& db, const Tensor& dout) {
  const bool cuda = same_device("bias_add_backward", {&db, &dout});
  const DType dt = act_dtype("bias_add_backward", {{"dout", &dout}}, {{"db", &db}});
  int64_t C = db.numel(), N = C ? dout.numel() / C : 0;
  expect_numel("bias_add_backward", "dout", dout, N * C);
  MTNLG_CUDA_DISPATCH(cuda, bias_add_backward(db, dout));
  if (is_low(dt)) {
    Widened wd;
    return bias_add_backward(db, wd.in(dout));
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::bias_add_backward<V>(db.kernel_data<V>(), dout.kernel_data<V>(), N, C);
  });
}

void xent_rowmax(Tensor& rowmax, const Tensor& logits, int64_t valid_local) {
  const bool cuda = same_device("xent_rowmax", {&rowmax, &logits});
  const DType dt = act_dtype("xent_rowmax", {{"logits", &logits}}, {{"rowmax", &rowmax}});
  int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  expect_numel("xent_rowmax", "logits", logits, N * V);
  MTNLG_CUDA_DISPATCH(cuda, xent_rowmax(rowmax, logits, valid_local));
  if (is_low(dt)) {
    Widened wd;
    return xent_rowmax(rowmax, wd.in(logits), valid_local);
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::xent_rowmax<T>(rowmax.kernel_data<T>(), logits.kernel_data<T>(), N, V, valid_local);
  });
}

void xent_sumexp_target(Tensor& sumexp, Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                        const Tensor& rowmax, int64_t vocab_start, int64_t valid_local) {
  const bool cuda = same_device("xent_sumexp_target", {&sumexp, &target_logit, &logits, &targets, &rowmax});
  const DType dt = act_dtype("xent_sumexp_target", {{"logits", &logits}},
                             {{"sumexp", &sumexp}, {"target_logit", &target_logit}, {"rowmax", &rowmax}});
  expect_i32("xent_sumexp_target", "targets", targets);
  int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  expect_numel("xent_sumexp_target", "logits", logits, N * V);
  expect_numel("xent_sumexp_target", "targets", targets, N);
  expect_numel("xent_sumexp_target", "sumexp", sumexp, N);
  expect_numel("xent_sumexp_target", "target_logit", target_logit, N);
  MTNLG_CUDA_DISPATCH(cuda, xent_sumexp_target(sumexp, target_logit, logits, targets, rowmax, vocab_start, valid_local));
  if (is_low(dt)) {
    Widened wd;
    return xent_sumexp_target(sumexp, target_logit, wd.in(logits), targets, rowmax, vocab_start, valid_local);
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::xent_sumexp_target<T>(sumexp.kernel_data<T>(), target_logit.kernel_data<T>(), logits.kernel_data<T>(), targets.kernel_data<int32_t>(),
                               rowmax.kernel_data<T>(), N, V, vocab_start, valid_local);
  });
}

void xent_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& rowmax,
                   const Tensor& sumexp, const Tensor& dloss, int64_t vocab_start, int64_t valid_local) {
  const bool cuda = same_device("xent_backward", {&dlogits, &logits, &targets, &rowmax, &sumexp, &dloss});
  const DType dt = act_dtype("xent_backward", {{"dlogits", &dlogits}, {"logits", &logits}},
                             {{"rowmax", &rowmax}, {"sumexp", &sumexp}, {"dloss", &dloss}});
  expect_i32("xent_backward", "targets", targets);
  int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  expect_numel("xent_backward", "logits", logits, N * V);
  expect_numel("xent_backward", "dlogits", dlogits, N * V);
  expect_numel("xent_backward", "targets", targets, N);
  expect_numel("xent_backward", "sumexp", sumexp, N);
  expect_numel("xent_backward", "dloss", dloss, N);
  MTNLG_CUDA_DISPATCH(cuda, xent_backward(dlogits, logits, targets, rowmax, sumexp, dloss, vocab_start, valid_local));
  if (is_low(dt)) {
    Widened wd;
    xent_backward(wd.out(dlogits), wd.in(logits), targets, rowmax, sumexp, dloss, vocab_start, valid_local);
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::xent_backward<T>(dlogits.kernel_data<T>(), logits.kernel_data<T>(), targets.kernel_data<int32_t>(), rowmax.kernel_data<T>(), sumexp.kernel_data<T>(),
                          dloss.kernel_data<T>(), N, V, vocab_start, valid_local);
  });
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p, Tensor* copy_out) {
  MTNLG_CUDA_DISPATCH(same_device("adamw_step", {&param, &grad, &m, &v, copy_out}), adamw_step(param, grad, m, v, p, copy_out));
  same_float_dtype("adamw_step", {&param, &grad, &m, &v});
  int64_t n = param.numel();
  expect_numel("adamw_step", "grad", grad, n);
  expect_numel("adamw_step", "m", m, n);
  expect_numel("adamw_step", "v", v, n);
  by_dtype(param.dtype(), [&](auto z) {
    using T = decltype(z);
    cpu::adamw<T>(param.kernel_data<T>(), grad.kernel_data<T>(), m.kernel_data<T>(), v.kernel_data<T>(), n, p.lr, p.beta1, p.beta2, p.eps,
                  p.weight_decay, p.step, p.grad_scale);
  });
  if (copy_out && copy_out->defined() && copy_out->raw() != param.raw()) {
    expect_numel("adamw_step", "copy_out", *copy_out, n);
    convert(*copy_out, param);  // the compute copy of the weights, rounded to nearest even
  }
}

}  // namespace mtnlg::ops
