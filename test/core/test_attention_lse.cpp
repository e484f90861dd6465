// The log-sum-exp form of attention on the CPU (core/ops_attention.cpp), which is the
// oracle of the CUDA kernels: same output as the probs form, lse = log of each row's
// softmax denominator, and the same gradients (with and without dropout).
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "core/ops.hpp"

using namespace mtnlg;

namespace {
Tensor randn(const Shape& s, std::mt19937_64& g) {
  Tensor t = Tensor::empty(s, DType::f64);
  std::normal_distribution<double> d(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = d(g);
  return t;
}
double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.data<double>()[i] - b.data<double>()[i]));
  return m;
}
}  // namespace

TEST_CASE("attention lse form matches the probs form on the CPU", "[attention]") {
  std::mt19937_64 g(42);
  const int64_t B = 2, T = 7, H = 3, D = 5;
  for (double p : {0.0, 0.3}) {
    INFO("dropout " << p);
    ops::AttentionDropout drop{p, 77, 1, 3, 6};
    Tensor qkv = randn({B, T, 3 * H * D}, g), dout = randn({B, T, H * D}, g);
    Tensor out1 = Tensor::empty({B, T, H * D}, DType::f64), probs = Tensor::empty({B, H, T, T}, DType::f64);
    ops::attention_forward(out1, probs, qkv, H, drop);
    Tensor out2 = Tensor::empty({B, T, H * D}, DType::f64), lse = Tensor::empty({B, H, T}, DType::f64);
    ops::attention_forward_lse(out2, lse, qkv, H, drop);
    CHECK(max_diff(out1, out2) == 0.0);
    // lse: recompute one row by hand
    const int64_t b = 1, h = 2, i = 4, row = H * 3 * D;
    double m = -INFINITY, s[T];
    for (int64_t j = 0; j <= i; ++j) {
      double acc = 0;
      for (int64_t d = 0; d < D; ++d)
        acc += qkv.data<double>()[(b * T + i) * row + h * 3 * D + d] * qkv.data<double>()[(b * T + j) * row + h * 3 * D + D + d];
      s[j] = acc / std::sqrt(double(D));
      m = std::max(m, s[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
    CHECK(lse.data<double>()[(b * H + h) * T + i] == Approx(m + std::log(sum)).epsilon(1e-12));
    Tensor d1 = Tensor::empty(qkv.shape(), DType::f64), d2 = Tensor::empty(qkv.shape(), DType::f64);
    ops::attention_backward(d1, dout, qkv, probs, H, drop);
    ops::attention_backward_lse(d2, dout, qkv, out2, lse, H, drop);
    CHECK(max_diff(d1, d2) < 1e-12);
  }
}
