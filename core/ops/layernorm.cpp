// LayerNorm forward/backward: checks once, one CUDA dispatch line
// (core/cuda/layernorm.cu), the CPU implementation (two passes per row: mean, then the
// variance of the deviations). mean/rstd are wide (f32, f64 for f64 activations).
#include "core/ops.hpp"

#include <cmath>
#include <utility>

#include "core/ops/common.hpp"

namespace mtnlg::cpu {
namespace {

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = inp + i * C;
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
    T* y = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - mt) * s * w[c] + b[c];
    mean[i] = mt;
    rstd[i] = s;
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean, const T* rstd,
                        int64_t N, int64_t C, bool accumulate_dinp) {
  // dinp: per row. dw/db: per column (ordered sum over rows, thread-count independent).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = inp + i * C;
    const T* dy = dout + i * C;
    T m = mean[i], s = rstd[i];
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      double norm = (x[c] - m) * s;
      double dnorm = static_cast<double>(w[c]) * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    T* dx = dinp + i * C;
    for (int64_t c = 0; c < C; ++c) {
      double norm = (x[c] - m) * s;
      double dnorm = static_cast<double>(w[c]) * dy[c];
      T g = static_cast<T>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
      dx[c] = accumulate_dinp ? dx[c] + g : g;
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
      T m = mean[i], s = rstd[i];
      for (int64_t c = c0; c < c1; ++c) {
        accw[c - c0] += (x[c] - m) * s * dy[c];
        accb[c - c0] += dy[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dw[c] += accw[c - c0];
      db[c] += accb[c - c0];
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
    cpu::layernorm_forward<T>(out.kernel_data<T>(), mean.kernel_data<T>(), rstd.kernel_data<T>(), inp.kernel_data<T>(), w.kernel_data<T>(), b.kernel_data<T>(), N, C,
                              eps);
  });
}

void add_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                           const Tensor& w, const Tensor& bias, double eps) {
  const char* op = "add_layernorm_forward";
  const bool cuda = same_device(op, {&sum, &out, &mean, &rstd, &a, &b, &w, &bias});
  act_dtype(op, {{"out", &out}, {"sum", &sum}, {"a", &a}, {"b", &b}, {"w", &w}, {"bias", &bias}},
            {{"mean", &mean}, {"rstd", &rstd}});
  const int64_t C = w.numel(), N = C ? sum.numel() / C : 0;
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"sum", &sum}, {"a", &a}, {"b", &b}, {"out", &out}})
    expect_numel(op, name, *t, N * C);
  expect_numel(op, "bias", bias, C);
  expect_numel(op, "mean", mean, N);
  expect_numel(op, "rstd", rstd, N);
  MTNLG_CUDA_DISPATCH(cuda, add_layernorm_forward(sum, out, mean, rstd, a, b, w, bias, eps));
  add(sum, a, b);
  layernorm_forward(out, mean, rstd, sum, w, bias, eps);
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

}  // namespace mtnlg::ops
