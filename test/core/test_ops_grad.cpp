// Finite-difference checks (fp64, central differences) for every op's backward, and
// forward checks against naive formulas. Loss = sum(out * R) for a fixed random R, so
// dL/dout = R and each backward is checked against (L(x+h) - L(x-h)) / 2h.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>

#include "core/ops.hpp"

using namespace mtnlg;

namespace {

Tensor randn(const Shape& s, std::mt19937_64& g, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::f64);
  std::normal_distribution<double> d(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = d(g);
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

// Checks analytic gradient `g` of loss() w.r.t. every element of `x`.
void check_grad(const char* what, Tensor& x, const Tensor& g, const std::function<double()>& loss, double tol = 1e-6) {
  INFO(what);
  REQUIRE(g.numel() == x.numel());
  const double h = 1e-5;
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double& xi = x.data<double>()[i];
    double old = xi;
    xi = old + h;
    double lp = loss();
    xi = old - h;
    double lm = loss();
    xi = old;
    double num = (lp - lm) / (2 * h);
    double ana = g.data<double>()[i];
    double err = std::fabs(num - ana) / (1e-6 + std::fabs(num) + std::fabs(ana));
    worst = std::max(worst, err);
  }
  CHECK(worst < tol);
}

}  // namespace

TEST_CASE("ops: matmul forward and backward (fp64 finite differences)", "[ops]") {
  std::mt19937_64 g(1);
  for (bool with_bias : {true, false}) {
    int64_t N = 5, C = 7, OC = 3;
    Tensor x = randn({N, C}, g), w = randn({OC, C}, g), b = randn({OC}, g), R = randn({N, OC}, g);
    Tensor out = Tensor::empty({N, OC}, DType::f64);
    auto loss = [&] {
      ops::matmul_forward(out, x, w, with_bias ? &b : nullptr);
      return dot(out, R);
    };
    loss();
    // forward vs naive
    double maxerr = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t o = 0; o < OC; ++o) {
        double s = with_bias ? b.data<double>()[o] : 0;
        for (int64_t c = 0; c < C; ++c) s += x.data<double>()[i * C + c] * w.data<double>()[o * C + c];
        maxerr = std::max(maxerr, std::fabs(s - out.data<double>()[i * OC + o]));
      }
    CHECK(maxerr < 1e-12);
    Tensor dx = Tensor::zeros({N, C}, DType::f64), dw = Tensor::zeros({OC, C}, DType::f64), db = Tensor::zeros({OC}, DType::f64);
    ops::matmul_backward(&dx, &dw, with_bias ? &db : nullptr, R, x, w);
    check_grad("matmul dinp", x, dx, loss);
    check_grad("matmul dw", w, dw, loss);
    if (with_bias) check_grad("matmul dbias", b, db, loss);
    // parameter gradients accumulate, activation gradients are written
    ops::matmul_backward(&dx, &dw, nullptr, R, x, w);
    Tensor dw1 = Tensor::zeros({OC, C}, DType::f64);
    ops::matmul_backward(nullptr, &dw1, nullptr, R, x, w);
    CHECK(dw.data<double>()[3] == Approx(2 * dw1.data<double>()[3]));
  }
}

TEST_CASE("ops: layernorm (fp64 finite differences)", "[ops]") {
  std::mt19937_64 g(2);
  int64_t N = 4, C = 9;
  Tensor x = randn({N, C}, g, 2.0), w = randn({C}, g), b = randn({C}, g), R = randn({N, C}, g);
  Tensor out = Tensor::empty({N, C}, DType::f64), mean = Tensor::empty({N}, DType::f64), rstd = Tensor::empty({N}, DType::f64);
  auto loss = [&] {
    ops::layernorm_forward(out, mean, rstd, x, w, b, 1e-5);
    return dot(out, R);
  };
  loss();
  Tensor dx = Tensor::zeros({N, C}, DType::f64), dw = Tensor::zeros({C}, DType::f64), db = Tensor::zeros({C}, DType::f64);
  ops::layernorm_backward(dx, dw, db, R, x, w, mean, rstd);
  check_grad("layernorm dinp", x, dx, loss);
  check_grad("layernorm dw", w, dw, loss);
  check_grad("layernorm db", b, db, loss);
}

TEST_CASE("ops: gelu (fp64 finite differences)", "[ops]") {
  std::mt19937_64 g(3);
  Tensor x = randn({31}, g, 2.0), R = randn({31}, g), out = Tensor::empty({31}, DType::f64);
  auto loss = [&] {
    ops::gelu_forward(out, x);
    return dot(out, R);
  };
  loss();
  double x0 = x.data<double>()[0];
  double ref = 0.5 * x0 * (1 + std::tanh(std::sqrt(2 / M_PI) * (x0 + 0.044715 * x0 * x0 * x0)));
  CHECK(out.data<double>()[0] == Approx(ref).epsilon(1e-14));
  Tensor dx = Tensor::empty({31}, DType::f64);
  ops::gelu_backward(dx, x, R);
  check_grad("gelu", x, dx, loss);
}

TEST_CASE("ops: dropout mask is counter based and backward matches", "[ops]") {
  std::mt19937_64 g(4);
  Tensor x = randn({1000}, g), out = Tensor::empty({1000}, DType::f64), out2 = Tensor::empty({1000}, DType::f64);
  ops::dropout_forward(out, x, 0.3, 77, 5000);
  int zeros = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    double o = out.data<double>()[i];
    if (o == 0) ++zeros;
    else CHECK(o == Approx(x.data<double>()[i] / 0.7));
  }
  CHECK(zeros > 230);
  CHECK(zeros < 370);
  // the element at index base+i is the same whatever window it is drawn in
  Tensor tail = x.flat(500, 500), o_tail = Tensor::empty({500}, DType::f64);
  ops::dropout_forward(o_tail, tail, 0.3, 77, 5500);
  for (int64_t i = 0; i < 500; ++i) CHECK(o_tail.data<double>()[i] == out.data<double>()[500 + i]);
  Tensor R = randn({1000}, g), dx = Tensor::empty({1000}, DType::f64);
  auto loss = [&] {
    ops::dropout_forward(out2, x, 0.3, 77, 5000);
    return dot(out2, R);
  };
  ops::dropout_backward(dx, R, 0.3, 77, 5000);
  check_grad("dropout", x, dx, loss);
}

TEST_CASE("ops: causal attention (fp64 finite differences, with and without dropout)", "[ops]") {
  std::mt19937_64 g(5);
  for (double p : {0.0, 0.25}) {
    int64_t B = 2, T = 5, H = 2, D = 3;
    Tensor qkv = randn({B, T, 3 * H * D}, g), R = randn({B, T, H * D}, g);
    Tensor out = Tensor::empty({B, T, H * D}, DType::f64), probs = Tensor::empty({B, H, T, T}, DType::f64);
    ops::AttentionDropout drop{p, 99, 3, 1, 4};
    auto loss = [&] {
      ops::attention_forward(out, probs, qkv, H, drop);
      return dot(out, R);
    };
    loss();
    if (p == 0) {  // forward vs a naive softmax(QK^T/sqrt(D))V for one (b, h, i)
      int64_t b = 1, h = 1, i = 3;
      auto at = [&](int64_t t, int64_t part, int64_t d) { return qkv.data<double>()[(b * T + t) * 3 * H * D + h * 3 * D + part * D + d]; };
      std::vector<double> s(i + 1);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double v = 0;
        for (int64_t d = 0; d < D; ++d) v += at(i, 0, d) * at(j, 1, d);
        s[j] = v / std::sqrt(3.0);
        mx = std::max(mx, s[j]);
      }
      for (auto& v : s) sum += (v = std::exp(v - mx));
      for (int64_t d = 0; d < D; ++d) {
        double o = 0;
        for (int64_t j = 0; j <= i; ++j) o += s[j] / sum * at(j, 2, d);
        CHECK(out.data<double>()[(b * T + i) * H * D + h * D + d] == Approx(o).epsilon(1e-12));
      }
    }
    Tensor dqkv = Tensor::empty(qkv.shape(), DType::f64);
    ops::attention_backward(dqkv, R, qkv, probs, H, drop);
    check_grad(p == 0 ? "attention" : "attention+dropout", qkv, dqkv, loss);
  }
}

TEST_CASE("ops: embeddings, positions (fp64 finite differences)", "[ops]") {
  std::mt19937_64 g(6);
  int64_t V = 6, C = 4, B = 2, T = 3, N = B * T;
  Tensor table = randn({V, C}, g), pos = randn({5, C}, g), R = randn({B, T, C}, g);
  Tensor tok = Tensor::empty({N}, DType::i32);
  int32_t ids[] = {7, 8, 9, 12, 8, 3};  // vocab_start 7: ids 3 and 12..13 fall outside [7, 13)
  for (int i = 0; i < N; ++i) tok.data<int32_t>()[i] = ids[i];
  Tensor out = Tensor::empty({B, T, C}, DType::f64);
  auto loss = [&] {
    ops::embedding_forward(out, tok, table, 7);
    ops::position_forward(out, pos, 1, 4);  // rows start at global row 1, sequences of 4
    return dot(out, R);
  };
  loss();
  CHECK(out.data<double>()[5 * C] == Approx(pos.data<double>()[2 * C]));  // id 3 out of range -> only position (6 % 4 = 2)
  Tensor dtable = Tensor::zeros({V, C}, DType::f64), dpos = Tensor::zeros({5, C}, DType::f64);
  ops::embedding_backward(dtable, tok, R, 7);
  ops::position_backward(dpos, R, 1, 4);
  check_grad("embedding", table, dtable, loss);
  check_grad("position", pos, dpos, loss);
}

// The grouping of ids by token that the CUDA embedding backward walks: runs of equal ids
// in ascending id, rows ascending within a run; [runs, starts..., rows...].
TEST_CASE("ops: embedding_grad_order groups rows by token, in row order", "[ops]") {
  const int32_t ids[] = {7, 8, 9, 12, 8, 3, 7};
  const Tensor o = ops::embedding_grad_order(ids, 7);
  const int32_t want[] = {5, /*starts*/ 0, 1, 3, 5, 6, 7, /*rows*/ 5, 0, 6, 1, 4, 2, 3};
  REQUIRE(o.numel() == 14);
  for (int i = 0; i < 14; ++i) CHECK(o.data<int32_t>()[i] == want[i]);
  const ops::EmbeddingGradOrder view = ops::EmbeddingGradOrder::from(o, o, 7);
  CHECK(view.runs == 5);
  CHECK(view.starts.numel() == 6);
  CHECK(view.rows.data<int32_t>()[0] == 5);
  CHECK(ops::embedding_grad_order(ids, 0).data<int32_t>()[0] == 0);
}

TEST_CASE("ops: bias add (fp64 finite differences)", "[ops]") {
  std::mt19937_64 g(8);
  Tensor x = randn({5, 70}, g), b = randn({70}, g), R = randn({5, 70}, g), y = Tensor::empty({5, 70}, DType::f64);
  auto loss = [&] {
    ops::copy(y, x);
    ops::bias_add_forward(y, b);
    return dot(y, R);
  };
  Tensor db = Tensor::zeros({70}, DType::f64);
  ops::bias_add_backward(db, R);
  check_grad("bias", b, db, loss);
}

TEST_CASE("ops: vocab-parallel cross-entropy pieces (fp64 finite differences)", "[ops]") {
  std::mt19937_64 g(7);
  int64_t N = 4, V = 10, valid = 8;  // two padding columns
  Tensor logits = randn({N, V}, g, 3.0), tgt = Tensor::empty({N}, DType::i32), dl = randn({N}, g);
  int32_t t[] = {0, 7, 3, 5};
  for (int i = 0; i < N; ++i) tgt.data<int32_t>()[i] = t[i];
  Tensor mx = Tensor::empty({N}, DType::f64), se = Tensor::empty({N}, DType::f64), tl = Tensor::empty({N}, DType::f64);
  auto loss = [&] {
    ops::xent_rowmax(mx, logits, valid);
    ops::xent_sumexp_target(se, tl, logits, tgt, mx, 0, valid);
    double s = 0;
    for (int64_t i = 0; i < N; ++i) s += dl.data<double>()[i] * (std::log(se.data<double>()[i]) + mx.data<double>()[i] - tl.data<double>()[i]);
    return s;
  };
  loss();
  // against a naive log-softmax that ignores padding
  double lse = 0;
  for (int v = 0; v < valid; ++v) lse += std::exp(logits.data<double>()[v]);
  CHECK(std::log(se.data<double>()[0]) + mx.data<double>()[0] == Approx(std::log(lse)).epsilon(1e-12));
  Tensor dlog = Tensor::empty({N, V}, DType::f64);
  ops::xent_backward(dlog, logits, tgt, mx, se, dl, 0, valid);
  check_grad("cross-entropy", logits, dlog, loss);
  CHECK(dlog.data<double>()[9] == 0.0);
}

TEST_CASE("ops: AdamW matches the textbook update", "[ops]") {
  Tensor p = Tensor::empty({3}, DType::f64), gr = Tensor::empty({3}, DType::f64);
  Tensor m = Tensor::zeros({3}, DType::f64), v = Tensor::zeros({3}, DType::f64);
  double p0[] = {1.0, -2.0, 0.5}, g0[] = {0.1, 0.2, -0.3};
  for (int i = 0; i < 3; ++i) p.data<double>()[i] = p0[i], gr.data<double>()[i] = g0[i];
  ops::AdamWParams ap{1e-2, 0.9, 0.95, 1e-8, 0.1, 1, 0.5};
  ops::adamw_step(p, gr, m, v, ap);
  for (int i = 0; i < 3; ++i) {
    double g = g0[i] * 0.5, mm = 0.1 * g, vv = 0.05 * g * g;
    double mh = mm / 0.1, vh = vv / 0.05;
    double ref = p0[i] - 1e-2 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * p0[i]);
    CHECK(p.data<double>()[i] == Approx(ref).epsilon(1e-12));
  }
}

TEST_CASE("ops: flat AdamW updates each segment as adamw_step does and leaves gaps alone", "[ops]") {
  const int64_t n = 40;
  Tensor p = Tensor::empty({n}), gr = Tensor::empty({n}), m = Tensor::zeros({n}), v = Tensor::zeros({n});
  for (int64_t i = 0; i < n; ++i) p.data<float>()[i] = 0.1f * float(i % 7) - 0.3f, gr.data<float>()[i] = 0.01f * float(i % 5) - 0.02f;
  const ops::AdamWParams ap{1e-2, 0.9, 0.95, 1e-8, 0.1, 3, 0.5};
  const std::vector<ops::AdamWSegment> segs{{0, 10, true}, {10, 12, false}, {30, 10, true}};
  // reference: one adamw_step per segment, weight decay 0 where the segment has none
  Tensor rp = p.clone(), rm = m.clone(), rv = v.clone();
  for (const auto& s : segs) {
    ops::AdamWParams a = ap;
    a.weight_decay = s.weight_decay ? ap.weight_decay : 0.0;
    Tensor pp = rp.flat(s.offset, s.numel), mm = rm.flat(s.offset, s.numel), vv = rv.flat(s.offset, s.numel);
    ops::adamw_step(pp, gr.flat(s.offset, s.numel), mm, vv, a);
  }
  Tensor copy = Tensor::zeros({n}, DType::bf16), fp = p.clone();
  ops::adamw_flat(fp, gr, m, v, ap, segs, &copy);
  Tensor back = Tensor::empty({n});
  ops::convert(back, copy);
  for (int64_t i = 0; i < n; ++i) {
    INFO("element " << i);
    CHECK(fp.data<float>()[i] == rp.data<float>()[i]);  // bit-equal: the same kernel per element
    CHECK(m.data<float>()[i] == rm.data<float>()[i]);
    if (i >= 22 && i < 30) {
      CHECK(fp.data<float>()[i] == p.data<float>()[i]);  // the gap is not touched
      CHECK(back.data<float>()[i] == 0.0f);
    } else {
      CHECK(back.data<float>()[i] == Approx(rp.data<float>()[i]).epsilon(1e-2));
    }
  }
  CHECK_THROWS_WITH(ops::adamw_flat(fp, gr, m, v, ap, {{0, 20, true}, {10, 5, true}}), Catch::Contains("overlaps"));
  CHECK_THROWS_WITH(ops::adamw_flat(fp, gr, m, v, ap, {{30, 11, true}}), Catch::Contains("outside the flat buffer"));
  ops::AdamWParams step0 = ap;
  step0.step = 0;
  CHECK_THROWS_WITH(ops::adamw_flat(fp, gr, m, v, step0, segs), Catch::Contains("step must be >= 1"));
}

TEST_CASE("ops: conversions round to nearest even", "[ops]") {
  Tensor f = Tensor::empty({4}), h = Tensor::empty({4}, DType::bf16), f16 = Tensor::empty({4}, DType::f16), back = Tensor::empty({4});
  float vals[] = {1.0f, 1.00390625f /* 1+2^-8 ties to even */, -3.14159f, 65504.0f};
  for (int i = 0; i < 4; ++i) f.data<float>()[i] = vals[i];
  ops::convert(h, f);
  ops::convert(back, h);
  CHECK(back.data<float>()[0] == 1.0f);
  CHECK(back.data<float>()[1] == 1.0f);
  CHECK(back.data<float>()[2] == Approx(-3.140625f));
  ops::convert(f16, f);
  ops::convert(back, f16);
  CHECK(back.data<float>()[2] == Approx(-3.140625f));
  CHECK(back.data<float>()[3] == 65504.0f);
}
