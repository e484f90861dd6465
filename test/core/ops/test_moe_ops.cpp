// The MoE ops' properties that are not finite differences (those are the op table's
// moe_* entries): the fixed tie order of the top-k, the expert bias choosing without
// weighting, permute then unpermute restoring the input and the gradient, dropped-token
// counts against the capacity formula, the load-balancing loss's reference values, the
// sign rule of the expert-bias update, the global loss's averaged counts, the router in fp32
// from bf16 inputs.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/moe_ops.hpp"
#include "core/ops.hpp"

using namespace mtnlg;

namespace {
Tensor f32(std::vector<float> v, Shape s) {
  Tensor t = Tensor::empty(s);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}
Tensor normal(Shape s, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, static_cast<float>(scale));
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  return t;
}
std::vector<int32_t> ints(const Tensor& t) { return {t.data<int32_t>(), t.data<int32_t>() + t.numel()}; }
}  // namespace

TEST_CASE("moe: top-k picks in descending score, ties to the lower expert", "[ops]") {
  const Tensor logits = f32({1, 3, 3, 0, 3, /*row 2*/ 0, 0, 0, 0, 0}, {2, 5});
  Tensor probs = Tensor::empty({2, 3}), idx = Tensor::empty({2, 3}, DType::i32);
  ops::RouterParams p;
  p.topk = 3;
  ops::moe_topk_forward(probs, idx, logits, nullptr, p);
  CHECK(ints(idx) == std::vector<int32_t>{1, 2, 4, 0, 1, 2});
  for (int i = 0; i < 6; ++i) CHECK(probs.data<float>()[i] == Approx(1.0 / 3));
  // The sigmoid's expert bias chooses (expert 0 wins with it) but does not weight.
  p.topk = 2;
  p.score = ops::RouterScore::sigmoid;
  const Tensor l = f32({0.0f, 1.0f, 2.0f}, {1, 3}), bias = f32({5.0f, 0.0f, 0.0f}, {3});
  Tensor pr = Tensor::empty({1, 2}), ix = Tensor::empty({1, 2}, DType::i32);
  ops::moe_topk_forward(pr, ix, l, &bias, p);
  CHECK(ints(ix) == std::vector<int32_t>{0, 2});
  const double s0 = 0.5, s2 = 1 / (1 + std::exp(-2.0));
  CHECK(pr.data<float>()[0] == Approx(s0 / (s0 + s2)));
  CHECK(pr.data<float>()[1] == Approx(s2 / (s0 + s2)));
  CHECK_THROWS_WITH(ops::moe_topk_forward(pr, ix, l, &bias, ops::RouterParams{}), Catch::Contains("sigmoid"));
}

TEST_CASE("moe: permute then unpermute restores the input and the gradient", "[ops]") {
  const int64_t N = 11, E = 4, H = 6;
  for (int64_t k : {1, 2, 3}) {
    INFO("top-" << k);
    ops::RouterParams p;
    p.topk = k;
    p.pre_softmax = true;
    Tensor probs = Tensor::empty({N, k}), idx = Tensor::empty({N, k}, DType::i32);
    ops::moe_topk_forward(probs, idx, normal({N, E}, 5 + k), nullptr, p);
    const ops::MoeDispatch d = ops::moe_dispatch_plan(idx, nullptr, E);
    REQUIRE(d.rows == N * k);
    // Contiguous groups by expert, tokens in order within each (stable).
    for (int64_t e = 0, r = 0; e < E; ++e)
      for (int64_t i = 0; i < d.counts[e]; ++i, ++r) {
        const int32_t slot = d.row_slot.data<int32_t>()[r];
        CHECK(idx.data<int32_t>()[slot] == e);
        if (i > 0) CHECK(d.row_src.data<int32_t>()[r] > d.row_src.data<int32_t>()[r - 1]);
      }
    const Tensor x = normal({N, H}, 11), dy = normal({N, H}, 12);
    Tensor xp = Tensor::empty({d.rows, H}), back = Tensor::empty({N, H});
    ops::moe_permute(xp, x, d);
    ops::moe_unpermute(back, xp, d);
    Tensor dxp = Tensor::empty({d.rows, H}), dx = Tensor::empty({N, H});
    ops::moe_permute(dxp, dy, d);    // unpermute's backward
    ops::moe_unpermute(dx, dxp, d);  // permute's backward
    int64_t bad = 0;
    for (int64_t i = 0; i < N * H; ++i) {
      bad += back.data<float>()[i] != static_cast<float>(k) * x.data<float>()[i];  // k copies of each token
      bad += dx.data<float>()[i] != static_cast<float>(k) * dy.data<float>()[i];
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("moe: dropped tokens equal the capacity formula", "[ops]") {
  const int64_t N = 64, E = 8, k = 2;
  Tensor logits = normal({N, E}, 21);
  for (int64_t n = 0; n < N; ++n) logits.data<float>()[n * E] += 1.5f;  // expert 0 overloaded
  ops::RouterParams p;
  p.topk = k;
  Tensor probs = Tensor::empty({N, k}), idx = Tensor::empty({N, k}, DType::i32),
         keep = Tensor::empty({N, k}, DType::i32);
  ops::moe_topk_forward(probs, idx, logits, nullptr, p);
  std::vector<int64_t> routed(E, 0);
  for (int32_t e : ints(idx)) ++routed[e];
  CHECK(ops::moe_capacity(N, E, k, 1.25) == 20);  // ceil(64 * 2 / 8 * 1.25)
  CHECK(ops::moe_capacity(10, 3, 1, 1.0) == 4);   // ceil(3.33)
  for (double cf : {0.5, 1.0, 1.25, 4.0}) {
    for (auto policy : {ops::DropPolicy::probs, ops::DropPolicy::position}) {
      INFO("capacity factor " << cf << (policy == ops::DropPolicy::probs ? " probs" : " position"));
      const int64_t cap = ops::moe_capacity(N, E, k, cf);
      int64_t formula = 0;
      for (int64_t e = 0; e < E; ++e) formula += std::max<int64_t>(0, routed[e] - cap);
      const int64_t dropped = ops::moe_apply_capacity(keep, probs, idx, E, cap, policy);
      CHECK(dropped == formula);
      const ops::MoeDispatch d = ops::moe_dispatch_plan(idx, &keep, E);
      CHECK(d.rows == N * k - formula);
      for (int64_t e = 0; e < E; ++e) CHECK(d.tokens[e] == std::min(routed[e], cap));
      const ops::MoeDispatch padded = ops::moe_dispatch_plan(idx, &keep, E, cap);
      CHECK(padded.rows == E * cap);  // every group exactly `cap` rows
      // Which ones: the highest weights of an overloaded expert, or its earliest tokens.
      double min_kept = 2, max_dropped = -1;
      int64_t last_kept = -1, first_dropped = N;
      for (int64_t s = 0; s < N * k; ++s) {
        if (idx.data<int32_t>()[s] != 0) continue;
        const bool kept = keep.data<int32_t>()[s] != 0;
        const double w = probs.data<float>()[s];
        if (kept) min_kept = std::min(min_kept, w), last_kept = std::max(last_kept, s / k);
        if (!kept) max_dropped = std::max(max_dropped, w), first_dropped = std::min(first_dropped, s / k);
      }
      if (policy == ops::DropPolicy::probs) CHECK(min_kept >= max_dropped);
      if (policy == ops::DropPolicy::position) CHECK(last_kept < first_dropped);
    }
  }
}

TEST_CASE("moe: the load-balancing loss is coeff under uniform routing; the per-sequence form averages", "[ops]") {
  const int64_t N = 12, E = 4, k = 2;
  Tensor scores = Tensor::empty({N, E}), counts = Tensor::empty({1, E});
  for (int64_t i = 0; i < N * E; ++i) scores.data<float>()[i] = 1.0f / E;
  for (int64_t e = 0; e < E; ++e) counts.data<float>()[e] = static_cast<float>(N * k / E);
  CHECK(ops::moe_aux_loss_forward(scores, counts, 1, N, k, 0.01) == Approx(0.01).epsilon(1e-12));
  // seq_aux_loss over 2 sequences of 6 = the mean of each sequence's own aux_loss.
  const Tensor logits = normal({N, E}, 31);
  Tensor s2 = Tensor::empty({N, E}), c2 = Tensor::empty({2, E});
  ops::moe_aux_scores_forward(s2, c2, logits, ops::RouterScore::softmax, k, 2);
  const double seq = ops::moe_aux_loss_forward(s2, c2, 2, 6, k, 0.1);
  double each = 0;
  for (int64_t g = 0; g < 2; ++g) {
    Tensor sg = Tensor::empty({6, E}), cg = Tensor::empty({1, E});
    ops::moe_aux_scores_forward(sg, cg, logits.flat(g * 6 * E, 6 * E).view({6, E}), ops::RouterScore::softmax, k, 1);
    each += ops::moe_aux_loss_forward(sg, cg, 1, 6, k, 0.1) / 2;
  }
  CHECK(seq == Approx(each).epsilon(1e-12));
}

TEST_CASE("moe: the expert bias moves by the rate toward the mean load (sign rule)", "[ops]") {
  Tensor bias = f32({0.1f, 0.0f, -0.2f, 0.0f}, {4});
  const Tensor counts = f32({5, 1, 3, 3}, {4});  // mean 3
  ops::moe_expert_bias_update(bias, counts, 0.01);
  CHECK(bias.data<float>()[0] == Approx(0.09));  // overloaded: down
  CHECK(bias.data<float>()[1] == Approx(0.01));  // underloaded: up
  CHECK(bias.data<float>()[2] == -0.2f);         // at the mean: unchanged
  CHECK(bias.data<float>()[3] == 0.0f);
}

TEST_CASE("moe: global_aux_loss is the aux loss over the batch's averaged counts", "[ops]") {
  const int64_t N = 8, E = 4, k = 2;
  const Tensor l1 = normal({N, E}, 41), l2 = normal({N, E}, 42);
  Tensor s1 = Tensor::empty({N, E}), c1 = Tensor::empty({1, E}), s2 = Tensor::empty({N, E}), c2 = Tensor::empty({1, E});
  ops::moe_aux_scores_forward(s1, c1, l1, ops::RouterScore::sigmoid, k, 1);
  ops::moe_aux_scores_forward(s2, c2, l2, ops::RouterScore::sigmoid, k, 1);
  // The second micro batch: counts averaged over the two so far, T its own tokens.
  Tensor avg = Tensor::empty({1, E});
  for (int64_t e = 0; e < E; ++e) avg.data<float>()[e] = (c1.data<float>()[e] + c2.data<float>()[e]) / 2;
  double want = 0;
  for (int64_t e = 0; e < E; ++e) {
    double P = 0;
    for (int64_t n = 0; n < N; ++n) P += s2.data<float>()[n * E + e];
    want += P * avg.data<float>()[e];
  }
  want *= 0.01 * E / (k * double(N) * N);
  CHECK(ops::moe_aux_loss_forward(s2, avg, 1, N, k, 0.01) == Approx(want).epsilon(1e-6));
}

TEST_CASE("moe: the router's logits in fp32 from bf16 activations and weights", "[ops]") {
  const int64_t N = 5, H = 8, E = 4;
  Tensor x = Tensor::empty({N, H}, DType::bf16), w = Tensor::empty({E, H}, DType::bf16);
  ops::convert(x, normal({N, H}, 51));
  ops::convert(w, normal({E, H}, 52));
  Tensor x32 = Tensor::empty({N, H}), w32 = Tensor::empty({E, H});
  ops::convert(x32, x);
  ops::convert(w32, w);
  Tensor logits = Tensor::empty({N, E}), ref = Tensor::empty({N, E});
  ops::moe_router_logits_forward(logits, x, w);
  ops::matmul_forward(ref, x32, w32, nullptr);
  const Tensor dl = normal({N, E}, 53);
  Tensor dx = Tensor::empty({N, H}, DType::bf16), dw = Tensor::zeros({E, H});
  Tensor rdx = Tensor::empty({N, H}), rdw = Tensor::zeros({E, H}), rdx16 = Tensor::empty({N, H}, DType::bf16);
  ops::moe_router_logits_backward(dx, dw, dl, x, w);
  ops::matmul_backward(&rdx, &rdw, nullptr, dl, x32, w32);
  ops::convert(rdx16, rdx);
  int64_t bad = 0;
  for (int64_t i = 0; i < N * E; ++i) bad += logits.data<float>()[i] != ref.data<float>()[i];
  for (int64_t i = 0; i < E * H; ++i) bad += dw.data<float>()[i] != rdw.data<float>()[i];
  for (int64_t i = 0; i < N * H; ++i) bad += dx.data<uint16_t>()[i] != rdx16.data<uint16_t>()[i];
  CHECK(bad == 0);
}
