// LayerNorm and RMSNorm forward/backward and their residual-stream forms (the branch's
// bias, dropout and residual add fused into the norm's row pass; the residual gradient
// added in the norm backward's): checks once, one CUDA dispatch line per op
// (core/cuda/layernorm.cu), the CPU implementation (LayerNorm: two passes per row, the
// mean, then the variance of the deviations; RMSNorm: the mean of the squares).
// mean/rstd are wide (f32, f64 for f64 activations).
//
// RMSNorm is the LayerNorm's kernels with the mean taken as 0 and no bias:
//   y = x * rstd * w,  rstd = 1/sqrt(mean(x^2) + eps);
//   dx = rstd * (w*dy - norm * mean(w*dy*norm)),  norm = x * rstd,  dw += sum_rows norm*dy.
// Gradient contract (both norms): dinp WRITTEN (or dres + the norm's gradient, or
// accumulated when asked), dw and db ACCUMULATE.
#include "core/ops.hpp"

#include <cmath>
#include <utility>

#include "core/half.hpp"
#include "core/ops/common.hpp"

namespace mtnlg::cpu {
namespace {

// One row: mean, then the variance of the deviations, then the normalised output.
template <typename T>
inline void layernorm_row(T* y, T* mean, T* rstd, const T* x, const T* w, const T* b, int64_t C, double eps) {
  double m = 0;
  for (int64_t c = 0; c < C; ++c) m += x[c];
  m /= C;
  double v = 0;
  for (int64_t c = 0; c < C; ++c) {
    double d = x[c] - m;
    v += d * d;
  }
  v /= C;
  T s = static_cast<T>(1.0 / std::sqrt(v + eps));
  T mt = static_cast<T>(m);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - mt) * s * w[c] + b[c];
  *mean = mt;
  *rstd = s;
}

// One row of an RMSNorm: the mean of the squares, then the scaled output.
template <typename T>
inline void rmsnorm_row(T* y, T* rstd, const T* x, const T* w, int64_t C, double eps) {
  double v = 0;
  for (int64_t c = 0; c < C; ++c) v += static_cast<double>(x[c]) * x[c];
  v /= C;
  T s = static_cast<T>(1.0 / std::sqrt(v + eps));
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) y[c] = x[c] * s * w[c];
  *rstd = s;
}

// mean null: an RMSNorm (b unused).
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C,
                       double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    if (mean)
      layernorm_row(out + i * C, mean + i, rstd + i, inp + i * C, w, b, C, eps);
    else
      rmsnorm_row(out + i * C, rstd + i, inp + i * C, w, C, eps);
  }
}

// What the activation dtype keeps of a value: bf16/f16 run the f32 kernels on widened
// copies, and each value the unfused ops would have stored (the branch after its bias,
// after dropout, the residual sum) is rounded to the activation dtype here, where they
// would have rounded it.
struct Round {
  DType dt;
  float operator()(float v) const {
    if (dt == DType::bf16) return half::bf16_to_f32(half::f32_to_bf16(v));
    if (dt == DType::f16) return half::f16_to_f32(half::f32_to_f16(v));
    return v;
  }
  double operator()(double v) const { return v; }
};

// sum = x + dropout(branch + bias) row by row, then (with `out`) the row's LayerNorm (an
// RMSNorm when mean is null) read from the stored sum while it is in cache. sum may alias
// x or branch (each element is read before it is written).
template <typename T>
void residual_forward(T* sum, T* out, T* mean, T* rstd, const T* x, const T* branch, const T* bias, double p,
                      uint64_t key, uint64_t base, const T* w, const T* b, int64_t N, int64_t C, double eps, Round q) {
  const T s = static_cast<T>(1.0 / (1.0 - p));  // as dropout_forward rounds it
  const bool drop = p > 0;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* xr = x + i * C;
    const T* br = branch + i * C;
    T* sr = sum + i * C;
    const uint64_t e0 = base + static_cast<uint64_t>(i * C);
    for (int64_t c = 0; c < C; ++c) {
      T v = bias ? q(br[c] + bias[c]) : br[c];
      if (drop) v = keep(key, e0 + static_cast<uint64_t>(c), p) ? q(v * s) : T(0);
      sr[c] = q(xr[c] + v);
    }
    if (out && mean) layernorm_row(out + i * C, mean + i, rstd + i, sr, w, b, C, eps);
    if (out && !mean) rmsnorm_row(out + i * C, rstd + i, sr, w, C, eps);
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dres, const T* dout, const T* inp, const T* w, const T* mean,
                        const T* rstd, int64_t N, int64_t C) {
  // dinp (+ dres when given; it may be dinp itself): per row. dw/db: per column (ordered
  // sum over rows, thread-count independent). mean null: an RMSNorm (the mean taken as 0,
  // no dnorm_mean term, no db).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = inp + i * C;
    const T* dy = dout + i * C;
    T m = mean ? mean[i] : T(0), s = rstd[i];
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      double norm = (x[c] - m) * s;
      double dnorm = static_cast<double>(w[c]) * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean = mean ? dnorm_mean / C : 0.0;
    dnorm_norm_mean /= C;
    T* dx = dinp + i * C;
    const T* dr = dres ? dres + i * C : nullptr;
    for (int64_t c = 0; c < C; ++c) {
      double norm = (x[c] - m) * s;
      double dnorm = static_cast<double>(w[c]) * dy[c];
      T g = static_cast<T>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
      dx[c] = dr ? dr[c] + g : g;
    }
  }
  constexpr int64_t kCols = 64;
  int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < blocks; ++bk) {
    int64_t c0 = bk * kCols, c1 = std::min(C, c0 + kCols);
    T accw[kCols] = {}, accb[kCols] = {};
    for (int64_t i = 0; i < N; ++i) {
      const T* x = inp + i * C;
      const T* dy = dout + i * C;
      T m = mean ? mean[i] : T(0), s = rstd[i];
      for (int64_t c = c0; c < c1; ++c) {
        accw[c - c0] += (x[c] - m) * s * dy[c];
        accb[c - c0] += dy[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dw[c] += accw[c - c0];
      if (db) db[c] += accb[c - c0];
    }
  }
}

}  // namespace
}  // namespace mtnlg::cpu

namespace mtnlg::ops {

using namespace detail;

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
    cpu::layernorm_forward<T>(out.kernel_data<T>(), mean.kernel_data<T>(), rstd.kernel_data<T>(), inp.kernel_data<T>(),
                              w.kernel_data<T>(), b.kernel_data<T>(), N, C, eps);
  });
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& w, double eps) {
  const char* op = "rmsnorm_forward";
  const bool cuda = same_device(op, {&out, &rstd, &inp, &w});
  const DType dt = act_dtype(op, {{"out", &out}, {"inp", &inp}, {"w", &w}}, {{"rstd", &rstd}});
  int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  expect_numel(op, "inp", inp, N * C);
  expect_numel(op, "out", out, N * C);
  expect_numel(op, "rstd", rstd, N);
  MTNLG_CUDA_DISPATCH(cuda, rmsnorm_forward(out, rstd, inp, w, eps));
  if (is_low(dt)) {
    Widened wd;
    rmsnorm_forward(wd.out(out), rstd, wd.in(inp), wd.in(w), eps);
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::layernorm_forward<T>(out.kernel_data<T>(), nullptr, rstd.kernel_data<T>(), inp.kernel_data<T>(),
                              w.kernel_data<T>(), nullptr, N, C, eps);
  });
}

namespace {

// The residual forms' CPU path on tensors that are f32 or f64 (bf16/f16 arrive widened;
// `act` is the activation dtype the intermediates are rounded to). out null: no norm;
// mean null: an RMSNorm.
void residual_cpu(Tensor& sum, Tensor* out, Tensor* mean, Tensor* rstd, const Tensor& x, const Tensor& branch,
                  const Tensor* bias, const ResidualBranch& br, const Tensor* w, const Tensor* b, double eps,
                  DType act) {
  const int64_t C = sum.dim(-1), N = C ? sum.numel() / C : 0;
  by_dtype(sum.dtype(), [&](auto z) {
    using T = decltype(z);
    cpu::residual_forward<T>(sum.kernel_data<T>(), ptr<T>(out), ptr<T>(mean), ptr<T>(rstd), x.kernel_data<T>(),
                             branch.kernel_data<T>(), ptr<T>(bias), br.p, br.key, br.base_index, ptr<T>(w), ptr<T>(b),
                             N, C, eps, cpu::Round{act});
  });
}

// The checks of the residual forms (out null: residual_add_forward; mean and b null: the
// RMSNorm's); the activation dtype.
DType residual_checks(const char* op, Tensor& sum, Tensor* out, Tensor* mean, Tensor* rstd, const Tensor& x,
                      const Tensor& branch, const ResidualBranch& br, const Tensor* w, const Tensor* b, bool& cuda) {
  const Tensor* bias = br.bias;
  cuda = same_device(op, {&sum, out, mean, rstd, &x, &branch, bias, w, b});
  const DType dt =
      act_dtype(op, {{"sum", &sum}, {"out", out}, {"x", &x}, {"branch", &branch}, {"bias", bias}, {"w", w}, {"b", b}},
                {{"mean", mean}, {"rstd", rstd}});
  MTNLG_CHECK(sum.ndim() >= 1, "{}: sum must have a channel dimension", op);
  const int64_t C = sum.dim(-1), N = C ? sum.numel() / C : 0;
  expect_numel(op, "x", x, N * C);
  expect_numel(op, "branch", branch, N * C);
  if (bias) expect_numel(op, "bias", *bias, C);
  if (out) {
    expect_numel(op, "out", *out, N * C);
    expect_numel(op, "w", *w, C);
    if (b) expect_numel(op, "b", *b, C);
    if (mean) expect_numel(op, "mean", *mean, N);
    expect_numel(op, "rstd", *rstd, N);
  }
  return dt;
}

}  // namespace

void residual_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                                const Tensor& branch, const ResidualBranch& br, const Tensor& w, const Tensor& b,
                                double eps) {
  const char* op = "residual_layernorm_forward";
  bool cuda = false;
  const DType dt = residual_checks(op, sum, &out, &mean, &rstd, x, branch, br, &w, &b, cuda);
  MTNLG_CUDA_DISPATCH(cuda, residual_layernorm_forward(sum, out, mean, rstd, x, branch, br, w, b, eps));
  Widened wd;  // passes f32/f64 through
  residual_cpu(wd.out(sum), &wd.out(out), &mean, &rstd, wd.in(x), wd.in(branch), wd.in(br.bias), br, &wd.in(w),
               &wd.in(b), eps, dt);
  wd.store();
}

void residual_rmsnorm_forward(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& branch,
                              const ResidualBranch& br, const Tensor& w, double eps) {
  const char* op = "residual_rmsnorm_forward";
  bool cuda = false;
  const DType dt = residual_checks(op, sum, &out, nullptr, &rstd, x, branch, br, &w, nullptr, cuda);
  MTNLG_CUDA_DISPATCH(cuda, residual_rmsnorm_forward(sum, out, rstd, x, branch, br, w, eps));
  Widened wd;  // passes f32/f64 through
  residual_cpu(wd.out(sum), &wd.out(out), nullptr, &rstd, wd.in(x), wd.in(branch), wd.in(br.bias), br, &wd.in(w),
               nullptr, eps, dt);
  wd.store();
}

void residual_add_forward(Tensor& sum, const Tensor& x, const Tensor& branch, const ResidualBranch& br) {
  const char* op = "residual_add_forward";
  bool cuda = false;
  const DType dt = residual_checks(op, sum, nullptr, nullptr, nullptr, x, branch, br, nullptr, nullptr, cuda);
  MTNLG_CUDA_DISPATCH(cuda, residual_add_forward(sum, x, branch, br));
  Widened wd;
  residual_cpu(wd.out(sum), nullptr, nullptr, nullptr, wd.in(x), wd.in(branch), wd.in(br.bias), br, nullptr, nullptr,
               0.0, dt);
  wd.store();
}

void add_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                           const Tensor& w, const Tensor& bias, double eps) {
  residual_layernorm_forward(sum, out, mean, rstd, a, b, ResidualBranch{}, w, bias, eps);
}

namespace {

// The norm backwards' checks and CPU path; dres null: dinp written, else dinp = dres +
// the norm's gradient (dres may be dinp). db and mean null: the RMSNorm's. Returns false
// (nothing done) when the tensors are on CUDA: the caller dispatches.
bool ln_backward(const char* op, Tensor& dinp, Tensor& dw, Tensor* db, const Tensor* dres, const Tensor& dout,
                 const Tensor& inp, const Tensor& w, const Tensor* mean, const Tensor& rstd) {
  const bool cuda = same_device(op, {&dinp, &dw, db, dres, &dout, &inp, &w, mean, &rstd});
  const DType dt = act_dtype(op, {{"dinp", &dinp}, {"dresidual", dres}, {"dout", &dout}, {"inp", &inp}, {"w", &w}},
                             {{"dw", &dw}, {"db", db}, {"mean", mean}, {"rstd", &rstd}});
  int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  expect_numel(op, "inp", inp, N * C);
  expect_numel(op, "dinp", dinp, N * C);
  if (dres) expect_numel(op, "dresidual", *dres, N * C);
  expect_numel(op, "dout", dout, N * C);
  expect_numel(op, "dw", dw, C);
  if (db) expect_numel(op, "db", *db, C);
  if (mean) expect_numel(op, "mean", *mean, N);
  expect_numel(op, "rstd", rstd, N);
  if (cuda) return false;
  Widened wd;  // passes f32/f64 through; dres (which dinp may alias) is copied before dinp is written back
  const Tensor* r = wd.in(dres);
  Tensor& dx = wd.out(dinp);
  by_dtype(is_low(dt) ? DType::f32 : dt, [&](auto z) {
    using T = decltype(z);
    cpu::layernorm_backward<T>(dx.kernel_data<T>(), dw.kernel_data<T>(), ptr<T>(db), ptr<T>(r),
                               wd.in(dout).kernel_data<T>(), wd.in(inp).kernel_data<T>(), wd.in(w).kernel_data<T>(),
                               ptr<T>(mean), rstd.kernel_data<T>(), N, C);
  });
  wd.store();
  return true;
}

}  // namespace

void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dinp) {
  const bool cpu =
      ln_backward("layernorm_backward", dinp, dw, &db, accumulate_dinp ? &dinp : nullptr, dout, inp, w, &mean, rstd);
  MTNLG_CUDA_DISPATCH(!cpu, layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, accumulate_dinp));
}

void residual_layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dresidual, const Tensor& dout,
                                 const Tensor& inp, const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  const bool cpu = ln_backward("residual_layernorm_backward", dinp, dw, &db, &dresidual, dout, inp, w, &mean, rstd);
  MTNLG_CUDA_DISPATCH(!cpu, residual_layernorm_backward(dinp, dw, db, dresidual, dout, inp, w, mean, rstd));
}

void rmsnorm_backward(Tensor& dinp, Tensor& dw, const Tensor& dout, const Tensor& inp, const Tensor& w,
                      const Tensor& rstd, bool accumulate_dinp) {
  const bool cpu = ln_backward("rmsnorm_backward", dinp, dw, nullptr, accumulate_dinp ? &dinp : nullptr, dout, inp, w,
                               nullptr, rstd);
  MTNLG_CUDA_DISPATCH(!cpu, rmsnorm_backward(dinp, dw, dout, inp, w, rstd, accumulate_dinp));
}

void residual_rmsnorm_backward(Tensor& dinp, Tensor& dw, const Tensor& dresidual, const Tensor& dout, const Tensor& inp,
                               const Tensor& w, const Tensor& rstd) {
  const bool cpu = ln_backward("residual_rmsnorm_backward", dinp, dw, nullptr, &dresidual, dout, inp, w, nullptr, rstd);
  MTNLG_CUDA_DISPATCH(!cpu, residual_rmsnorm_backward(dinp, dw, dresidual, dout, inp, w, rstd));
}

}  // namespace mtnlg::ops
