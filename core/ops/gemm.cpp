// The linear layer's ops: matmul forward/backward (OpenBLAS on the CPU, cuBLASLt in
// core/cuda/gemm.cu) and the bias add with its column-sum backward. Checks once, one
// CUDA dispatch line per op.
#include "core/ops.hpp"

#include <cblas.h>

#include <algorithm>
#include <type_traits>

#include "core/ops/common.hpp"

namespace mtnlg::cpu {
namespace {

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
          T beta, T* Cm, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
                B, ldb, beta, Cm, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda,
                B, ldb, beta, Cm, ldc);
  }
}

template <typename T>
void bias_add_forward(T* x, const T* b, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) x[i * C + c] += b[c];
}

template <typename T>
void bias_add_backward(T* db, const T* dout, int64_t N, int64_t C) {
  constexpr int64_t kCols = 64;
  int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < blocks; ++bk) {
    int64_t c0 = bk * kCols, c1 = std::min(C, c0 + kCols);
    T acc[kCols] = {};
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += dout[i * C + c];
    for (int64_t c = c0; c < c1; ++c) db[c] += acc[c - c0];
  }
}

template <typename T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int64_t N, int64_t C, int64_t OC) {
  T beta = 0;
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t o = 0; o < OC; ++o) out[i * OC + o] = bias[o];
    beta = 1;
  }
  gemm<T>(false, true, N, OC, C, T(1), inp, C, w, C, beta, out, OC);
}

template <typename T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int64_t N, int64_t C,
                     int64_t OC, bool accumulate_dinp) {
  if (dinp) gemm<T>(false, false, N, C, OC, T(1), dout, OC, w, C, accumulate_dinp ? T(1) : T(0), dinp, C);
  if (dw) gemm<T>(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dw, C);
  if (dbias) bias_add_backward<T>(dbias, dout, N, OC);
}

}  // namespace
}  // namespace mtnlg::cpu

namespace mtnlg::ops {

using namespace detail;

namespace {
// A linear layer's sizes from its weight [OC, C]: N rows of the input `in` ([N, C]) and
// of the output side `out` ([N, OC]), both element counts checked.
struct LinearShape {
  int64_t N, C, OC;
};
LinearShape linear_shape(const char* op, const Tensor& w, const char* in_name, const Tensor& in, const char* out_name,
                         const Tensor& out) {
  expect_ndim(op, "w", w, 2);
  const int64_t OC = w.dim(0), C = w.dim(1), N = C ? in.numel() / C : 0;
  expect_numel(op, in_name, in, N * C);
  expect_numel(op, out_name, out, N * OC);
  return {N, C, OC};
}
}  // namespace

void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias) {
  const bool cuda = same_device("matmul_forward", {&out, &inp, &w, bias});
  const DType dt = act_dtype("matmul_forward", {{"out", &out}, {"inp", &inp}, {"w", &w}, {"bias", bias}});
  const auto [N, C, OC] = linear_shape("matmul_forward", w, "inp", inp, "out", out);
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
  const auto [N, C, OC] = linear_shape("matmul_backward", w, "inp", inp, "dout", dout);
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
    cpu::matmul_backward<T>(ptr<T>(dinp), ptr<T>(dw), ptr<T>(dbias), dout.kernel_data<T>(), inp.kernel_data<T>(),
                            w.kernel_data<T>(), N, C, OC, accumulate_dinp);
  });
}

void matmul_bias_gelu_forward(Tensor& out, Tensor& pre, const Tensor& inp, const Tensor& w, const Tensor& bias) {
  const char* op = "matmul_bias_gelu_forward";
  const bool cuda = same_device(op, {&out, &pre, &inp, &w, &bias});
  act_dtype(op, {{"out", &out}, {"pre", &pre}, {"inp", &inp}, {"w", &w}, {"bias", &bias}});
  expect_numel(op, "bias", bias, linear_shape(op, w, "inp", inp, "pre", pre).OC);
  expect_numel(op, "out", out, pre.numel());
  MTNLG_CUDA_DISPATCH(cuda, matmul_bias_gelu_forward(out, pre, inp, w, bias));
  matmul_forward(pre, inp, w, &bias);
  gelu_forward(out, pre);
}

void matmul_dgelu_backward(Tensor& dpre, Tensor& dbias, const Tensor& dout, const Tensor& w, const Tensor& pre) {
  const char* op = "matmul_dgelu_backward";
  const bool cuda = same_device(op, {&dpre, &dbias, &dout, &w, &pre});
  act_dtype(op, {{"dout", &dout}, {"w", &w}, {"pre", &pre}, {"dpre", &dpre}}, {{"dbias", &dbias}});
  expect_numel(op, "dbias", dbias, linear_shape(op, w, "pre", pre, "dout", dout).C);
  expect_numel(op, "dpre", dpre, pre.numel());
  MTNLG_CUDA_DISPATCH(cuda, matmul_dgelu_backward(dpre, dbias, dout, w, pre));
  matmul_backward(&dpre, nullptr, nullptr, dout, pre, w, false);
  gelu_backward(dpre, pre, dpre);
  bias_add_backward(dbias, dpre);
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

}  // namespace mtnlg::ops
