// The CPU ops' checks that are not per-case comparisons: the embedding gradient's
// grouping, AdamW against the textbook update, the flat AdamW's segments, and the
// conversions' rounding. Each op's fp64 finite-difference checks (loss = sum(out * R) for
// a fixed random R, each backward against (L(x+h) - L(x-h)) / 2h) and its forward against
// naive formulas are cases of the op table: test/core/ops/op_cases.cpp, driven by
// test/core/ops/test_op_table.cpp ("ops table: <op> (fp64 finite differences)", [ops]).
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/ops.hpp"

using namespace mtnlg;

// The grouping of ids by token that the CUDA embedding backward walks: runs of equal ids
// in ascending id, rows ascending within a run; [runs, starts..., rows...], the starts
// padded with N to N + 1 entries so the buffer's size depends on N alone.
TEST_CASE("ops: embedding_grad_order groups rows by token, in row order", "[ops]") {
  const int32_t ids[] = {7, 8, 9, 12, 8, 3, 7};
  const Tensor o = ops::embedding_grad_order(ids, 7);
  const int32_t want[] = {5, /*starts*/ 0, 1, 3, 5, 6, 7, 7, 7, /*rows*/ 5, 0, 6, 1, 4, 2, 3};
  REQUIRE(o.numel() == 16);
  for (int i = 0; i < 16; ++i) CHECK(o.data<int32_t>()[i] == want[i]);
  const ops::EmbeddingGradOrder view = ops::EmbeddingGradOrder::from(o, 7);
  CHECK(view.max_runs == 7);
  CHECK(view.count.data<int32_t>()[0] == 5);
  CHECK(view.starts.numel() == 8);
  CHECK(view.rows.data<int32_t>()[0] == 5);
  const int32_t same[] = {4, 4, 4, 4, 4, 4, 4};  // one run: the size stays 2N + 2
  CHECK(ops::embedding_grad_order(same, 7).numel() == 16);
  CHECK(ops::embedding_grad_order(same, 7).data<int32_t>()[0] == 1);
  CHECK(ops::embedding_grad_order(ids, 0).data<int32_t>()[0] == 0);
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
  for (int64_t i = 0; i < n; ++i)
    p.data<float>()[i] = 0.1f * float(i % 7) - 0.3f, gr.data<float>()[i] = 0.01f * float(i % 5) - 0.02f;
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
  Tensor f = Tensor::empty({4}), h = Tensor::empty({4}, DType::bf16), f16 = Tensor::empty({4}, DType::f16),
         back = Tensor::empty({4});
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
