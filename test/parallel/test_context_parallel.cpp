// parallel/context_parallel.hpp: the load-balanced split and its inverse, the in-process
// exchange, and causal attention across cp ranks (p2p ring, all_gather, a2a, a2a+p2p) against
// the one-rank attention_forward_lse / attention_backward_lse: output, log-sum-exp and dqkv,
// at cp 2 and 4, multi-head, grouped-query and multi-query, in f64 and f32; the four
// communication types against each other; what the ring sends.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <string>

#include "core/ops.hpp"
#include "parallel/context_parallel.hpp"

using namespace mtnlg;
using parallel::CpAttention;
using parallel::CpExchange;

namespace {

Tensor randn(const Shape& s, DType dt, std::mt19937_64& g) {
  Tensor t = Tensor::empty(s, DType::f64), out = Tensor::empty(s, dt);
  std::normal_distribution<double> d(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = d(g);
  ops::convert(out, t);
  return out;
}
double value(const Tensor& t, int64_t i) {
  return t.dtype() == DType::f64 ? t.data<double>()[i] : static_cast<double>(t.data<float>()[i]);
}
double max_diff_abs(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(value(a, i) - value(b, i)));
  return m;
}
// lse [B, H, T] <-> [B, T, H], so that cp_split / cp_gather move it by position.
Tensor bth(const Tensor& x) {
  const int64_t B = x.dim(0), P = x.dim(1), R = x.dim(2);
  Tensor y = Tensor::empty({B, R, P}, DType::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p = 0; p < P; ++p)
      for (int64_t r = 0; r < R; ++r) y.data<double>()[(b * R + r) * P + p] = value(x, (b * P + p) * R + r);
  return y;
}

const char* name(CpCommType t) {
  return t == CpCommType::p2p          ? "p2p"
         : t == CpCommType::all_gather ? "all_gather"
         : t == CpCommType::a2a        ? "a2a"
                                       : "a2a+p2p";
}

struct Result {
  Tensor out, lse, dqkv;      // the whole sequence, gathered from the ranks (lse as [B, T, H])
  std::vector<double> bytes;  // per rank: forward, backward
};

// qkv and dout [B, T, ...] split over cp in-process ranks, each running the cp attention's
// forward and backward; the ranks' results gathered back into sequence order.
Result run_cp(const Tensor& qkv, const Tensor& dout, int64_t cp, const CpAttention& a) {
  const int64_t n = cp;
  std::vector<Tensor> outs(static_cast<size_t>(n)), lses(static_cast<size_t>(n)), dqkvs(static_cast<size_t>(n));
  Result res;
  res.bytes.assign(static_cast<size_t>(2 * n), 0.0);
  parallel::run_in_process(cp, [&](CpExchange& ex) {
    const int64_t r = ex.rank();
    const Tensor q = parallel::cp_split(qkv, cp, r), dO = parallel::cp_split(dout, cp, r);
    Tensor out = Tensor::empty(dO.shape(), qkv.dtype()),
           lse = Tensor::empty({q.dim(0), a.heads, q.dim(1)}, qkv.dtype());
    const double b0 = ex.bytes_sent();
    parallel::cp_attention_forward(out, lse, q, a, ex);
    const double b1 = ex.bytes_sent();
    Tensor dqkv = Tensor::empty(q.shape(), qkv.dtype());
    parallel::cp_attention_backward(dqkv, dO, q, out, lse, a, ex);
    res.bytes[static_cast<size_t>(2 * r)] = b1 - b0;
    res.bytes[static_cast<size_t>(2 * r + 1)] = ex.bytes_sent() - b1;
    const auto i = static_cast<size_t>(r);
    outs[i] = out, lses[i] = bth(lse), dqkvs[i] = dqkv;
  });
  res.out = parallel::cp_gather(outs), res.lse = parallel::cp_gather(lses), res.dqkv = parallel::cp_gather(dqkvs);
  return res;
}

}  // namespace

TEST_CASE("context parallel: rank r holds chunks r and 2cp-1-r, and the gather inverts the split", "[cp]") {
  CHECK(parallel::cp_positions(16, 2, 0) == std::vector<int64_t>{0, 1, 2, 3, 12, 13, 14, 15});
  CHECK(parallel::cp_positions(16, 2, 1) == std::vector<int64_t>{4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(parallel::cp_positions(16, 4, 3) == std::vector<int64_t>{6, 7, 8, 9});
  CHECK(parallel::cp_positions(16, 1, 0).size() == 16);
  std::mt19937_64 g(3);
  const int64_t B = 2, T = 24;
  for (int64_t cp : {1, 2, 3, 4, 6}) {
    INFO("cp " << cp);
    // tokens (i32), the loss mask (f32), position ids (i32) and activations [B, T, 5]
    Tensor tokens = Tensor::empty({B, T}, DType::i32), pos = Tensor::empty({B, T}, DType::i32);
    for (int64_t i = 0; i < B * T; ++i)
      tokens.data<int32_t>()[i] = static_cast<int32_t>(1000 + i), pos.data<int32_t>()[i] = static_cast<int32_t>(i % T);
    const Tensor mask = randn({B, T}, DType::f32, g), act = randn({B, T, 5}, DType::f64, g);
    std::vector<Tensor> tp, pp, mp, ap;
    std::set<int64_t> seen;
    std::vector<int64_t> work;  // causal work per rank: sum over its queries of the keys they see
    for (int64_t r = 0; r < cp; ++r) {
      tp.push_back(parallel::cp_split(tokens, cp, r));
      pp.push_back(parallel::cp_split(pos, cp, r));
      mp.push_back(parallel::cp_split(mask, cp, r));
      ap.push_back(parallel::cp_split(act, cp, r));
      const auto p = parallel::cp_positions(T, cp, r);
      REQUIRE(tp.back().shape() == Shape{B, T / cp});
      int64_t w = 0;
      for (int64_t i = 0; i < T / cp; ++i) {
        CHECK(pp.back().data<int32_t>()[T / cp + i] == p[i]);  // sample 1: positions stay global
        CHECK(tp.back().data<int32_t>()[i] == 1000 + p[i]);
        CHECK(ap.back().data<double>()[(T / cp + i) * 5 + 4] == act.data<double>()[(T + p[i]) * 5 + 4]);
        CHECK((i == 0 || p[i] > p[i - 1]));  // local positions ascend
        seen.insert(p[i]);
        w += p[i] + 1;
      }
      work.push_back(w);
    }
    CHECK(static_cast<int64_t>(seen.size()) == T);
    CHECK(std::set<int64_t>(work.begin(), work.end()).size() == 1);  // every rank the same causal work
    const std::vector<std::pair<const std::vector<Tensor>*, const Tensor*>> pairs = {
        {&tp, &tokens}, {&pp, &pos}, {&mp, &mask}, {&ap, &act}};
    for (auto [parts, whole] : pairs) {
      const Tensor back = parallel::cp_gather(*parts);
      REQUIRE(back.shape() == whole->shape());
      CHECK(std::memcmp(back.raw(), whole->raw(), static_cast<size_t>(whole->nbytes())) == 0);
    }
  }
  CHECK_THROWS_WITH(parallel::cp_split(Tensor::zeros({1, 10}), 2, 0), Catch::Contains("2 x 2 equal chunks"));
  CHECK_THROWS(parallel::cp_split(Tensor::zeros({1, 8}), 2, 2));
  CHECK_THROWS(parallel::cp_gather({Tensor::zeros({1, 4}), Tensor::zeros({1, 2})}));
}

TEST_CASE("context parallel: the in-process exchange moves and counts what it is given", "[cp]") {
  const int64_t n = 3;
  std::vector<std::vector<float>> got(n);
  std::vector<double> bytes(n);
  parallel::run_in_process(n, [&](CpExchange& ex) {
    const auto r = static_cast<float>(ex.rank());
    Tensor mine = Tensor::empty({2}), from_left = Tensor::empty({2});
    mine.data<float>()[0] = r, mine.data<float>()[1] = 10 * r;
    ex.shift(mine, from_left, 1);  // from rank - 1
    Tensor all = Tensor::empty({2 * n});
    ex.all_gather(mine, all);
    Tensor blocks = Tensor::empty({n}), sum = Tensor::empty({1});
    for (int64_t j = 0; j < n; ++j) blocks.data<float>()[j] = r * 100 + static_cast<float>(j);
    ex.reduce_scatter(blocks, sum);  // sum over ranks of block rank()
    Tensor a2a = Tensor::empty({n});
    ex.all_to_all(blocks, a2a);  // block j of rank j's
    auto& v = got[static_cast<size_t>(ex.rank())];
    v = {from_left.data<float>()[0], all.data<float>()[2 * n - 1], sum.data<float>()[0], a2a.data<float>()[2]};
    bytes[static_cast<size_t>(ex.rank())] = ex.bytes_sent();
  });
  for (int64_t r = 0; r < n; ++r) {
    INFO("rank " << r);
    const auto& v = got[static_cast<size_t>(r)];
    CHECK(v[0] == static_cast<float>((r + n - 1) % n));
    CHECK(v[1] == 10.0f * (n - 1));
    CHECK(v[2] == 300.0f + 3.0f * static_cast<float>(r));  // (0 + 100 + 200) + 3 r
    CHECK(v[3] == 200.0f + static_cast<float>(r));
    // shift 8 bytes, all_gather 2/3 of 24, reduce_scatter 2/3 of 12, all_to_all 2/3 of 12
    CHECK(bytes[static_cast<size_t>(r)] == Approx(8 + 16 + 8 + 8));
  }
  // a failing rank ends the group: the others are woken, the first error comes back
  CHECK_THROWS_WITH(parallel::run_in_process(4,
                                             [](CpExchange& ex) {
                                               if (ex.rank() == 2) throw std::runtime_error("rank 2 broke");
                                               Tensor a = Tensor::zeros({1}), b = Tensor::zeros({1});
                                               ex.shift(a, b, 1);
                                               ex.shift(a, b, 1);
                                             }),
                    "rank 2 broke");
}

namespace {
// The one-rank op on the whole sequence: out, lse as [B, T, H], dqkv.
struct Reference {
  Tensor out, lse, dqkv;
};
Reference one_rank(const Tensor& qkv, const Tensor& dout, int64_t H, int64_t G,
                   const ops::AttentionDropout& drop = {}) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1);
  Tensor out = Tensor::empty(dout.shape(), qkv.dtype()), lse = Tensor::empty({B, H, T}, qkv.dtype());
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype());
  ops::attention_forward_lse(out, lse, qkv, H, drop, G);
  ops::attention_backward_lse(dqkv, dout, qkv, out, lse, H, drop, G);
  return {out, bth(lse), dqkv};
}
// max |a - b| / max |b|: the error relative to the tensor's scale.
double rel(const Tensor& a, const Tensor& b) {
  double scale = 0;
  for (int64_t i = 0; i < b.numel(); ++i) scale = std::max(scale, std::fabs(value(b, i)));
  return max_diff_abs(a, b) / std::max(scale, 1e-300);
}
std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}
}  // namespace

// The proof: the split attention at cp 2 and 4 against the one-rank op on the whole
// sequence (the same dtype), for every communication type (a2a+p2p with a2a groups of 2:
// at cp 2 one group, at cp 4 a ring of two), multi-head, grouped-query and multi-query (a2a
// only where the groups split over the ranks), f64 and f32: output, lse and dqkv within
// 1e-12 (f64) or 1e-6 (f32) of the tensor's largest value; in f32 also no further from the
// fp64 result than 2 x the one-rank f32 op is; the types against each other; what the ring
// and the gather send.
TEST_CASE("context parallel: attention across cp ranks equals the one-rank op, forward and backward", "[cp]") {
  const DType dt = GENERATE(DType::f64, DType::f32);
  const int64_t cp = GENERATE(2, 4);
  const auto hg = GENERATE(values<std::pair<int64_t, int64_t>>({{4, 4}, {4, 2}, {4, 1}}));
  const int64_t H = hg.first, G = hg.second, B = 2, T = 32, D = 8, W = G * (H / G + 2) * D;
  INFO(to_string(dt) << " cp " << cp << " heads " << H << " groups " << G);
  std::mt19937_64 g(static_cast<uint64_t>(100 * cp + 10 * G + (dt == DType::f64)));
  const Tensor qkv = randn({B, T, W}, dt, g), dout = randn({B, T, H * D}, dt, g);
  Tensor qkv64 = Tensor::empty(qkv.shape(), DType::f64), dout64 = Tensor::empty(dout.shape(), DType::f64);
  ops::convert(qkv64, qkv);
  ops::convert(dout64, dout);
  const Reference ref = one_rank(qkv, dout, H, G), truth = one_rank(qkv64, dout64, H, G);
  const double tol = dt == DType::f64 ? 1e-12 : 1e-6;
  std::vector<Result> results;
  for (CpCommType type : {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a, CpCommType::a2a_p2p}) {
    CpAttention a{H, G, type};
    a.a2a_size = 2;  // a2a+p2p: a2a within pairs of ranks, the ring across them
    if ((type == CpCommType::a2a && G % cp != 0) || (type == CpCommType::a2a_p2p && G % 2 != 0)) {
      CHECK_THROWS_WITH(run_cp(qkv, dout, cp, a), Catch::Contains("do not split over"));
      continue;
    }
    Result r = run_cp(qkv, dout, cp, a);
    const double d_out = rel(r.out, ref.out), d_lse = rel(r.lse, ref.lse), d_dqkv = rel(r.dqkv, ref.dqkv);
    INFO(name(type) << ": out " << sci(d_out) << " lse " << sci(d_lse) << " dqkv " << sci(d_dqkv));
    CHECK(d_out <= tol);
    CHECK(d_lse <= tol);
    CHECK(d_dqkv <= tol);
    if (dt == DType::f32) {
      const double own = std::max({rel(ref.out, truth.out), rel(ref.lse, truth.lse), rel(ref.dqkv, truth.dqkv)});
      const double mine = std::max({rel(r.out, truth.out), rel(r.lse, truth.lse), rel(r.dqkv, truth.dqkv)});
      INFO("against fp64: one-rank f32 " << sci(own) << ", cp " << sci(mine));
      CHECK(mine <= 2 * own);
    }
    const double kv_bytes = static_cast<double>(B * (T / cp) * G * 2 * D * dtype_size(dt));
    if (type == CpCommType::p2p)  // the groups' K/V only: cp - 1 shifts forward, twice that plus one back
      for (int64_t rank = 0; rank < cp; ++rank) {
        CHECK(r.bytes[static_cast<size_t>(2 * rank)] == Approx((cp - 1) * kv_bytes));
        CHECK(r.bytes[static_cast<size_t>(2 * rank + 1)] == Approx((2 * (cp - 1) + 1) * kv_bytes));
      }
    if (type == CpCommType::all_gather) CHECK(r.bytes[0] == Approx((cp - 1) * kv_bytes));
    results.push_back(std::move(r));
  }
  for (size_t i = 1; i < results.size(); ++i) {
    CHECK(rel(results[i].out, results[0].out) <= 2 * tol);
    CHECK(rel(results[i].lse, results[0].lse) <= 2 * tol);
    CHECK(rel(results[i].dqkv, results[0].dqkv) <= 2 * tol);
  }
}

// Attention dropout: every rank draws the one-rank op's mask at its rows' global
// positions (heads offset and counted as a tensor-parallel rank passes them), so the split
// attention equals the one-rank op with the same dropout.
TEST_CASE("context parallel: attention dropout draws the one-rank op's mask", "[cp]") {
  const int64_t cp = GENERATE(2, 4);
  const auto hg = GENERATE(values<std::pair<int64_t, int64_t>>({{4, 4}, {4, 2}, {4, 1}}));
  const int64_t H = hg.first, G = hg.second, B = 2, T = 32, D = 8, W = G * (H / G + 2) * D;
  INFO("cp " << cp << " heads " << H << " groups " << G);
  std::mt19937_64 g(static_cast<uint64_t>(7 * cp + G));
  const Tensor qkv = randn({B, T, W}, DType::f64, g), dout = randn({B, T, H * D}, DType::f64, g);
  const ops::AttentionDropout drop{0.25, 0xC0FFEEull, 3, H, 3 * H};
  const Reference ref = one_rank(qkv, dout, H, G, drop), plain = one_rank(qkv, dout, H, G);
  CHECK(rel(ref.out, plain.out) > 0.1);  // the mask matters
  for (CpCommType type : {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a, CpCommType::a2a_p2p}) {
    if ((type == CpCommType::a2a && G % cp != 0) || (type == CpCommType::a2a_p2p && G % 2 != 0)) continue;
    CpAttention a{H, G, type};
    a.a2a_size = 2;
    a.drop = drop;
    const Result r = run_cp(qkv, dout, cp, a);
    const double d_out = rel(r.out, ref.out), d_lse = rel(r.lse, ref.lse), d_dqkv = rel(r.dqkv, ref.dqkv);
    INFO(name(type) << ": out " << sci(d_out) << " lse " << sci(d_lse) << " dqkv " << sci(d_dqkv));
    CHECK(d_out <= 1e-12);
    CHECK(d_lse <= 1e-12);
    CHECK(d_dqkv <= 1e-12);
  }
}

TEST_CASE("context parallel: attention refuses what it does not do", "[cp]") {
  std::mt19937_64 g(5);
  const Tensor qkv = randn({1, 8, 3 * 2 * 4}, DType::f64, g);
  CHECK_THROWS_WITH(run_cp(qkv, Tensor::zeros({1, 8, 8}, DType::f64), 2, {2, 2, CpCommType::a2a_p2p, {}, 4}),
                    Catch::Contains("a2a groups of 4 ranks do not divide 2 ranks"));
  const Tensor bf = Tensor::zeros({1, 4, 3 * 2 * 4}, DType::bf16);
  CHECK_THROWS_WITH(
      parallel::run_in_process(1,
                               [&](CpExchange& ex) {
                                 Tensor out = Tensor::empty({1, 4, 8}, DType::bf16);
                                 Tensor lse = Tensor::empty({1, 2, 4});
                                 parallel::cp_attention_forward(out, lse, bf, {2, 2, CpCommType::p2p}, ex);
                               }),
      Catch::Contains("f32 or f64"));
}
