// Per-head query/key RMSNorm (Qwen3's q_norm and k_norm) on the attention's packed qkv:
// checks once, one CUDA dispatch line (core/cuda/qk_norm.cu), the CPU implementation.
//
// Each query head vector x (D values) of a row becomes x * r * wq and each key head
// x * r * wk, r = 1/sqrt(mean(x^2) + eps) of that head; wq and wk [D] are shared by all
// the query (key) heads; the values pass through. r is saved per normalised head (the
// row's order: a group's query heads, then its key). The backward of a head, with
// xhat = x r and g = w * dy:
//   dx = r (g - xhat mean(g xhat)),   dw += sum over rows and heads of dy xhat.
// The mean of squares is summed in double (as rmsnorm_forward's rows); dw's sums run in
// row order then head order, so they do not depend on the thread count.
// Gradient contract: dqkv is WRITTEN (may alias dout), dwq and dwk ACCUMULATE.
#include "core/ops.hpp"

#include <cmath>
#include <vector>

#include "core/ops/common.hpp"

namespace mtnlg::cpu {
namespace {

// The head `blk` (< Q: a query head, Q: the key) of group g in row r.
inline int64_t head_at(const op_checks::QkvShape& s, int64_t r, int64_t g, int64_t blk) {
  return r * s.row() + (g * (s.per_group() + 2) + blk) * s.D;
}

// out may be x: each head is read whole before it is written.
template <typename T>
void qk_norm_forward(T* out, T* rstd, const T* x, const T* wq, const T* wk, const op_checks::QkvShape& s, double eps) {
  const int64_t Q = s.per_group(), D = s.D, heads = s.normed_heads();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < s.B * s.T; ++r)
    for (int64_t g = 0; g < s.G; ++g)
      for (int64_t blk = 0; blk <= Q; ++blk) {
        const int64_t e = head_at(s, r, g, blk);
        const T* w = blk < Q ? wq : wk;
        double v = 0;
        for (int64_t d = 0; d < D; ++d) v += static_cast<double>(x[e + d]) * x[e + d];
        const T rs = static_cast<T>(1.0 / std::sqrt(v / static_cast<double>(D) + eps));
        for (int64_t d = 0; d < D; ++d) out[e + d] = x[e + d] * rs * w[d];
        rstd[r * heads + g * (Q + 1) + blk] = rs;
      }
}

// dw first (it reads dout, which dx may overwrite), then dx head by head.
template <typename T>
void qk_norm_backward(T* dx, T* dwq, T* dwk, const T* dout, const T* x, const T* wq, const T* wk, const T* rstd,
                      const op_checks::QkvShape& s) {
  const int64_t Q = s.per_group(), D = s.D, heads = s.normed_heads(), N = s.B * s.T;
  // One pass in memory order, a double per column (each column's sum in row, then head order).
  std::vector<double> aq(static_cast<size_t>(D)), ak(static_cast<size_t>(D));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < s.G; ++g)
      for (int64_t blk = 0; blk <= Q; ++blk) {
        const int64_t e = head_at(s, r, g, blk);
        const double rs = rstd[r * heads + g * (Q + 1) + blk];
        double* acc = blk < Q ? aq.data() : ak.data();
        for (int64_t d = 0; d < D; ++d) acc[d] += static_cast<double>(dout[e + d]) * x[e + d] * rs;
      }
  for (int64_t d = 0; d < D; ++d) {
    dwq[d] += static_cast<T>(aq[static_cast<size_t>(d)]);
    dwk[d] += static_cast<T>(ak[static_cast<size_t>(d)]);
  }
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < s.G; ++g)
      for (int64_t blk = 0; blk < Q + 2; ++blk) {
        const int64_t e = head_at(s, r, g, blk);
        if (blk == Q + 1) {  // the value passes through
          if (dx != dout)
            for (int64_t d = 0; d < D; ++d) dx[e + d] = dout[e + d];
          continue;
        }
        const T* w = blk < Q ? wq : wk;
        const double rs = rstd[r * heads + g * (Q + 1) + blk];
        double m = 0;
        for (int64_t d = 0; d < D; ++d) m += static_cast<double>(w[d]) * dout[e + d] * x[e + d] * rs;
        m /= static_cast<double>(D);
        for (int64_t d = 0; d < D; ++d)
          dx[e + d] = static_cast<T>(rs * (static_cast<double>(w[d]) * dout[e + d] - x[e + d] * rs * m));
      }
}

}  // namespace
}  // namespace mtnlg::cpu

namespace mtnlg::ops {

using namespace detail;

namespace {

// The checks of both directions: the qkv geometry, the weights [D], the saved rstd, and no
// partial overlap between the written tensor and the one it is computed from.
op_checks::QkvShape qk_norm_checks(const char* op, const Tensor& out, const Tensor& in, const Tensor& wq,
                                   const Tensor& wk, const Tensor& rstd, int64_t heads, int64_t groups) {
  const op_checks::QkvShape s = op_checks::qkv_shape(op, in, heads, groups);
  expect_numel(op, "out", out, in.numel());
  expect_numel(op, "wq", wq, s.D);
  expect_numel(op, "wk", wk, s.D);
  expect_numel(op, "rstd", rstd, s.B * s.T * s.normed_heads());
  const char *o = static_cast<const char*>(out.raw()), *i = static_cast<const char*>(in.raw());
  if (o != i && o < i + in.nbytes() && i < o + out.nbytes())
    throw_runtime("{}: the output overlaps the input without being it", op);
  return s;
}

}  // namespace

void qk_norm_forward(Tensor& out, Tensor& rstd, const Tensor& qkv, const Tensor& wq, const Tensor& wk, int64_t heads,
                     int64_t groups, double eps) {
  const char* op = "qk_norm_forward";
  const bool cuda = same_device(op, {&out, &rstd, &qkv, &wq, &wk});
  const DType dt = act_dtype(op, {{"out", &out}, {"qkv", &qkv}, {"wq", &wq}, {"wk", &wk}}, {{"rstd", &rstd}});
  const op_checks::QkvShape s = qk_norm_checks(op, out, qkv, wq, wk, rstd, heads, groups);
  MTNLG_CUDA_DISPATCH(cuda, qk_norm_forward(out, rstd, qkv, wq, wk, heads, groups, eps));
  Widened wd;  // passes f32/f64 through; bf16/f16 run on f32 copies, rounded once at the store
  Tensor& o = wd.out(out);
  const Tensor &x = wd.in(qkv), &q = wd.in(wq), &k = wd.in(wk);
  if (o.raw() != x.raw()) copy(o, x);  // the values; the heads are overwritten below
  by_dtype(is_low(dt) ? DType::f32 : dt, [&](auto z) {
    using T = decltype(z);
    cpu::qk_norm_forward<T>(o.kernel_data<T>(), rstd.kernel_data<T>(), x.kernel_data<T>(), q.kernel_data<T>(),
                            k.kernel_data<T>(), s, eps);
  });
  wd.store();
}

void qk_norm_backward(Tensor& dqkv, Tensor& dwq, Tensor& dwk, const Tensor& dout, const Tensor& qkv, const Tensor& wq,
                      const Tensor& wk, const Tensor& rstd, int64_t heads, int64_t groups) {
  const char* op = "qk_norm_backward";
  const bool cuda = same_device(op, {&dqkv, &dwq, &dwk, &dout, &qkv, &wq, &wk, &rstd});
  const DType dt = act_dtype(op, {{"dqkv", &dqkv}, {"dout", &dout}, {"qkv", &qkv}, {"wq", &wq}, {"wk", &wk}},
                             {{"dwq", &dwq}, {"dwk", &dwk}, {"rstd", &rstd}});
  const op_checks::QkvShape s = qk_norm_checks(op, dqkv, dout, wq, wk, rstd, heads, groups);
  expect_numel(op, "qkv", qkv, dout.numel());
  expect_numel(op, "dwq", dwq, s.D);
  expect_numel(op, "dwk", dwk, s.D);
  MTNLG_CUDA_DISPATCH(cuda, qk_norm_backward(dqkv, dwq, dwk, dout, qkv, wq, wk, rstd, heads, groups));
  Widened wd;
  const Tensor &dy = wd.in(dout), &x = wd.in(qkv), &q = wd.in(wq), &k = wd.in(wk);
  Tensor& dx = wd.out(dqkv);
  by_dtype(is_low(dt) ? DType::f32 : dt, [&](auto z) {
    using T = decltype(z);
    cpu::qk_norm_backward<T>(dx.kernel_data<T>(), dwq.kernel_data<T>(), dwk.kernel_data<T>(), dy.kernel_data<T>(),
                             x.kernel_data<T>(), q.kernel_data<T>(), k.kernel_data<T>(), rstd.kernel_data<T>(), s);
  });
  wd.store();
}

}  // namespace mtnlg::ops
