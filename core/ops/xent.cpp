// Vocab-parallel softmax cross-entropy pieces (between the tensor-parallel reductions
// of the row max and the sum of exponentials) and the per-step loss accumulator:
// checks once, one CUDA dispatch line (core/cuda/xent.cu), the CPU implementation.
#include "core/ops.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/ops/common.hpp"

namespace mtnlg::cpu {
namespace {

template <typename T>
void xent_rowmax(T* rowmax, const T* logits, int64_t N, int64_t V, int64_t valid) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    T m = -std::numeric_limits<T>::infinity();
    const T* l = logits + i * V;
    for (int64_t v = 0; v < valid; ++v) m = std::max(m, l[v]);
    rowmax[i] = m;
  }
}

template <typename T>
void xent_sumexp_target(T* sumexp, T* target_logit, const T* logits, const int32_t* targets, const T* rowmax, int64_t N,
                        int64_t V, int64_t vstart, int64_t valid) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* l = logits + i * V;
    const T m = rowmax[i];
    // exp in T (vectorised), summed in blocks of 1024 into a double: accurate and fast.
    double s = 0;
    for (int64_t v0 = 0; v0 < valid; v0 += 1024) {
      const int64_t v1 = std::min(valid, v0 + 1024);
      T part = 0;
#pragma omp simd reduction(+ : part)
      for (int64_t v = v0; v < v1; ++v) part += std::exp(l[v] - m);
      s += part;
    }
    sumexp[i] = static_cast<T>(s);
    int64_t t = static_cast<int64_t>(targets[i]) - vstart;
    target_logit[i] = (t >= 0 && t < valid) ? l[t] : T(0);
  }
}

template <typename T>
void xent_backward(T* dlogits, const T* logits, const int32_t* targets, const T* rowmax, const T* sumexp,
                   const T* dloss, int64_t N, int64_t V, int64_t vstart, int64_t valid) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* l = logits + i * V;
    T* dl = dlogits + i * V;
    T m = rowmax[i], inv = T(1) / sumexp[i], g = dloss[i];
    int64_t t = static_cast<int64_t>(targets[i]) - vstart;
#pragma omp simd
    for (int64_t v = 0; v < valid; ++v) dl[v] = std::exp(l[v] - m) * inv * g;
    for (int64_t v = valid; v < V; ++v) dl[v] = 0;
    if (t >= 0 && t < valid) dl[t] -= g;
  }
}

}  // namespace
}  // namespace mtnlg::cpu

namespace mtnlg::ops {

using namespace detail;

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
    if (mask->dtype() != DType::f32)
      throw_runtime("xent_loss_accumulate: mask must be f32, got {}", to_string(mask->dtype()));
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
  MTNLG_CUDA_DISPATCH(cuda,
                      xent_sumexp_target(sumexp, target_logit, logits, targets, rowmax, vocab_start, valid_local));
  if (is_low(dt)) {
    Widened wd;
    return xent_sumexp_target(sumexp, target_logit, wd.in(logits), targets, rowmax, vocab_start, valid_local);
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::xent_sumexp_target<T>(sumexp.kernel_data<T>(), target_logit.kernel_data<T>(), logits.kernel_data<T>(),
                               targets.kernel_data<int32_t>(), rowmax.kernel_data<T>(), N, V, vocab_start, valid_local);
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
    cpu::xent_backward<T>(dlogits.kernel_data<T>(), logits.kernel_data<T>(), targets.kernel_data<int32_t>(),
                          rowmax.kernel_data<T>(), sumexp.kernel_data<T>(), dloss.kernel_data<T>(), N, V, vocab_start,
                          valid_local);
  });
}

}  // namespace mtnlg::ops
