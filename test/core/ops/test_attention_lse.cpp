// The log-sum-exp form of attention on the CPU (core/ops/attention.cpp), which is the
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
        acc += qkv.data<double>()[(b * T + i) * row + h * 3 * D + d] *
               qkv.data<double>()[(b * T + j) * row + h * 3 * D + D + d];
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

namespace {
// Rows [t0, t0 + n) of every sample of x [B, T, W].
Tensor time_slice(const Tensor& x, int64_t t0, int64_t n) {
  const int64_t B = x.dim(0), T = x.dim(1), W = x.dim(2);
  Tensor out = Tensor::empty({B, n, W}, x.dtype());
  for (int64_t b = 0; b < B; ++b) {
    Tensor dst = out.view({B * n, W}).rows(b * n, n);
    ops::copy(dst, x.view({B * T, W}).rows(b * T + t0, n));
  }
  return out;
}
}  // namespace

// The forward-only cached op is checked against the full-sequence op: a prefill of the
// whole block, and the same positions fed in pieces (3, 1, 3) over one cache, give the
// outputs of attention_forward_lse over the whole sequence; with grouped-query attention
// (G < H groups, MQA at 1) too, the caches [B, G, capacity, D] holding the groups' keys.
TEST_CASE("attention_cached_forward: prefill and pieces over a cache equal the full-sequence op", "[attention]") {
  const auto hg = GENERATE(values<std::pair<int64_t, int64_t>>({{3, 3}, {4, 2}, {3, 1}}));
  const int64_t H = hg.first, G = hg.second;
  INFO("heads " << H << " groups " << G);
  std::mt19937_64 g(7);
  const int64_t B = 2, T = 7, D = 4, W = G * (H / G + 2) * D;
  Tensor qkv = randn({B, T, W}, g);
  Tensor ref = Tensor::empty({B, T, H * D}, DType::f64), lse = Tensor::empty({B, H, T}, DType::f64);
  ops::attention_forward_lse(ref, lse, qkv, H, ops::AttentionDropout{}, G);

  Tensor k = Tensor::zeros({B, G, T + 2, D}, DType::f64), v = Tensor::zeros({B, G, T + 2, D}, DType::f64);
  Tensor out = Tensor::empty({B, T, H * D}, DType::f64);
  ops::attention_cached_forward(out, k, v, qkv, H, 0, G);
  CHECK(max_diff(out, ref) < 1e-14);

  Tensor k2 = Tensor::zeros({B, G, T, D}, DType::f64), v2 = Tensor::zeros({B, G, T, D}, DType::f64);
  int64_t past = 0;
  for (int64_t n : {3, 1, 3}) {
    Tensor o = Tensor::empty({B, n, H * D}, DType::f64);
    ops::attention_cached_forward(o, k2, v2, time_slice(qkv, past, n), H, past, G);
    CHECK(max_diff(o, time_slice(ref, past, n)) < 1e-14);
    past += n;
  }
  // the cache holds the keys and values it was given
  double kd = 0;
  for (int64_t bh = 0; bh < B * G; ++bh)
    for (int64_t i = 0; i < T * D; ++i)
      kd = std::max(kd, std::fabs(k.data<double>()[bh * (T + 2) * D + i] - k2.data<double>()[bh * T * D + i]));
  CHECK(kd == 0.0);
  // the group's k holds position t's key: row t's k columns of group G - 1
  const int64_t t = 5;
  CHECK(k2.data<double>()[((B - 1) * G + G - 1) * T * D + t * D + 1] ==
        qkv.data<double>()[((B - 1) * T + t) * W + (G - 1) * (H / G + 2) * D + (H / G) * D + 1]);
  Tensor one = Tensor::empty({B, 1, W}, DType::f64), o1 = Tensor::empty({B, 1, H * D}, DType::f64);
  CHECK_THROWS(ops::attention_cached_forward(o1, k2, v2, one, H, T, G));  // past + 1 > capacity
  Tensor kf = Tensor::zeros({B, G, T, D});                                // f32 cache, f64 qkv
  CHECK_THROWS(ops::attention_cached_forward(o1, kf, v2, one, H, 0, G));
}

// bf16 storage: the op equals the f32 op on the widened inputs, rounded once at the
// store; the cache keeps the rounded keys/values, so decoding in pieces equals the
// bf16 prefill exactly.
TEST_CASE("attention_cached_forward: bf16 storage, pieces equal the prefill", "[attention][low_precision]") {
  std::mt19937_64 g(9);
  const int64_t B = 1, T = 6, H = 2, D = 8;
  Tensor q64 = randn({B, T, 3 * H * D}, g);
  Tensor qkv = Tensor::empty(q64.shape(), DType::bf16), q32 = Tensor::empty(q64.shape());
  ops::convert(qkv, q64);
  ops::convert(q32, qkv);  // the bf16 values, exactly, in f32
  Tensor k = Tensor::zeros({B, H, T, D}, DType::bf16), v = Tensor::zeros({B, H, T, D}, DType::bf16);
  Tensor out = Tensor::empty({B, T, H * D}, DType::bf16);
  ops::attention_cached_forward(out, k, v, qkv, H, 0);
  Tensor k32 = Tensor::zeros({B, H, T, D}), v32 = Tensor::zeros({B, H, T, D}), o32 = Tensor::empty({B, T, H * D});
  ops::attention_cached_forward(o32, k32, v32, q32, H, 0);
  Tensor o32r = Tensor::empty({B, T, H * D}, DType::bf16);
  ops::convert(o32r, o32);
  for (int64_t i = 0; i < out.numel(); ++i) CHECK(out.data<uint16_t>()[i] == o32r.data<uint16_t>()[i]);

  Tensor k2 = Tensor::zeros({B, H, T, D}, DType::bf16), v2 = Tensor::zeros({B, H, T, D}, DType::bf16);
  for (int64_t t = 0; t < T; ++t) {
    Tensor piece = Tensor::empty({B, 1, 3 * H * D}, DType::bf16);
    ops::copy(piece, qkv.view({T, 3 * H * D}).rows(t, 1));
    Tensor o = Tensor::empty({B, 1, H * D}, DType::bf16);
    ops::attention_cached_forward(o, k2, v2, piece, H, t);
    for (int64_t i = 0; i < H * D; ++i) CHECK(o.data<uint16_t>()[i] == out.data<uint16_t>()[t * H * D + i]);
  }
  for (int64_t i = 0; i < k.numel(); ++i) CHECK(k2.data<uint16_t>()[i] == k.data<uint16_t>()[i]);
}
