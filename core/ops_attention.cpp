// ops::attention_forward_lse / attention_backward_lse (core/ops.hpp): the log-sum-exp
// form of causal attention. CUDA tensors go to the fused kernels (core/cuda/attention.cu);
// on the CPU both are built from the probs reference in core/cpu/ops_cpu.cpp, so the
// CPU path is the test oracle for the CUDA one and a drop-in for model code that wants
// one call on every device:
//   forward:  probs = softmax(scores) via cpu::attention_forward, plus
//             lse_i = m_i + log sum_j exp(s_ij - m_i) recomputed in double;
//   backward: probs_ij = exp(s_ij - lse_i) (j <= i), then cpu::attention_backward.
// The CPU forward therefore costs one extra score pass and a [T,T] scratch per (b,h)
// batch; it exists for correctness, not speed.
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/ops_cpu.hpp"
#include "core/ops.hpp"
#include "core/ops_checks.hpp"
#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/ops_cuda.hpp"
#endif

namespace mtnlg::ops {

namespace {

// s_ij = q_i . k_j / sqrt(D) for j <= i, in double. Calls f(b, h, i, row_of_scores).
template <typename V, typename F>
void for_each_score_row(const V* qkv, int64_t B, int64_t T, int64_t H, int64_t D, F&& f) {
  const int64_t row = H * 3 * D;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> s(static_cast<size_t>(T));
      const V* base = qkv + b * T * row + h * 3 * D;
      for (int64_t i = 0; i < T; ++i) {
        const V* q = base + i * row;
        for (int64_t j = 0; j <= i; ++j) {
          const V* k = base + j * row + D;
          double acc = 0;
          for (int64_t d = 0; d < D; ++d) acc += static_cast<double>(q[d]) * k[d];
          s[static_cast<size_t>(j)] = acc * scale;
        }
        f(b, h, i, s.data());
      }
    }
}

}  // namespace

void attention_forward_lse(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads, const AttentionDropout& drop) {
#ifdef MTNLG_HAVE_CUDA
  if (detail::same_device("attention_forward_lse", {&out, &lse, &qkv})) return cuda::attention_forward_lse(out, lse, qkv, heads, drop);
#else
  (void)detail::same_device("attention_forward_lse", {&out, &lse, &qkv});
#endif
  detail::same_float_dtype("attention_forward_lse", {&out, &lse, &qkv});
  MTNLG_CHECK(qkv.ndim() == 3, "attention qkv must be [B,T,3C], got {}", shape_str(qkv.shape()));
  const int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / (3 * heads);
  MTNLG_CHECK(lse.numel() == B * heads * T, "attention_forward_lse: lse has {} elements, expected {}", lse.numel(),
              B * heads * T);
  Tensor probs = Tensor::empty({B, heads, T, T}, qkv.dtype());
  attention_forward(out, probs, qkv, heads, drop);
  auto run = [&](auto z) {
    using V = decltype(z);
    V* L = lse.data<V>();
    for_each_score_row(qkv.data<V>(), B, T, heads, D, [&](int64_t b, int64_t h, int64_t i, const double* s) {
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= i; ++j) m = std::max(m, s[j]);
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
      L[(b * heads + h) * T + i] = static_cast<V>(m + std::log(sum));
    });
  };
  if (qkv.dtype() == DType::f32)
    run(float{});
  else
    run(double{});
}

void attention_backward_lse(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t heads, const AttentionDropout& drop) {
#ifdef MTNLG_HAVE_CUDA
  if (detail::same_device("attention_backward_lse", {&dqkv, &dout, &qkv, &out, &lse}))
    return cuda::attention_backward_lse(dqkv, dout, qkv, out, lse, heads, drop);
#else
  (void)detail::same_device("attention_backward_lse", {&dqkv, &dout, &qkv, &out, &lse});
#endif
  detail::same_float_dtype("attention_backward_lse", {&dqkv, &dout, &qkv, &out, &lse});
  const int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / (3 * heads);
  MTNLG_CHECK(lse.numel() == B * heads * T, "attention_backward_lse: lse has {} elements, expected {}", lse.numel(),
              B * heads * T);
  Tensor probs = Tensor::empty({B, heads, T, T}, qkv.dtype());
  auto run = [&](auto z) {
    using V = decltype(z);
    V* P = probs.data<V>();
    const V* L = lse.data<V>();
    for_each_score_row(qkv.data<V>(), B, T, heads, D, [&](int64_t b, int64_t h, int64_t i, const double* s) {
      V* Pi = P + ((b * heads + h) * T + i) * T;
      const double l = L[(b * heads + h) * T + i];
      for (int64_t j = 0; j <= i; ++j) Pi[j] = static_cast<V>(std::exp(s[j] - l));
      for (int64_t j = i + 1; j < T; ++j) Pi[j] = V(0);
    });
  };
  if (qkv.dtype() == DType::f32)
    run(float{});
  else
    run(double{});
  attention_backward(dqkv, dout, qkv, probs, heads, drop);
}

}  // namespace mtnlg::ops
