// Context-parallel attention over MPI (np = 1..4 as the cp group): the exchange over the
// world Communicator (make_cp_exchange), each rank's rows of the split attention against
// the one-rank attention_forward_lse / attention_backward_lse that every rank computes on
// the whole sequence, for p2p, all_gather, (where the groups split) a2a and (at an even np)
// a2a+p2p with a2a groups of 2, with and without attention dropout.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "core/ops.hpp"
#include "parallel/communicator.hpp"
#include "parallel/context_parallel.hpp"
#include "test/support/mpi/mpi_test_world.hpp"

using namespace mtnlg;

namespace {
Tensor normal(const Shape& s, std::mt19937_64& g) {
  Tensor t = Tensor::empty(s, DType::f64);
  std::normal_distribution<double> d(0.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = d(g);
  return t;
}
double max_abs(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(a.data<double>()[i] - b.data<double>()[i]));
  return m;
}
}  // namespace

TEST_CASE("mpi: context-parallel attention over the world equals the one-rank op", "[mpi][cp]") {
  auto world = test::mpi_test_world();
  const int64_t cp = world->size(), r = world->rank();
  const int64_t B = 2, T = 24, H = 4, G = 2, D = 4, W = G * (H / G + 2) * D, L = T / cp;
  std::mt19937_64 g(11);  // the same inputs on every rank
  const Tensor qkv = normal({B, T, W}, g), dout = normal({B, T, H * D}, g);
  const double p = GENERATE(0.0, 0.2);  // attention dropout off and on
  const ops::AttentionDropout drop{p, 42, 0, 0, 0};
  Tensor out = Tensor::empty({B, T, H * D}, DType::f64), lse = Tensor::empty({B, H, T}, DType::f64);
  Tensor dqkv = Tensor::empty(qkv.shape(), DType::f64);
  ops::attention_forward_lse(out, lse, qkv, H, drop, G);
  ops::attention_backward_lse(dqkv, dout, qkv, out, lse, H, drop, G);
  auto ex = parallel::make_cp_exchange(world);
  const auto pos = parallel::cp_positions(T, cp, r);
  for (CpCommType type : {CpCommType::p2p, CpCommType::all_gather, CpCommType::a2a, CpCommType::a2a_p2p}) {
    if (type == CpCommType::a2a && G % cp != 0) continue;
    if (type == CpCommType::a2a_p2p && cp % 2 != 0) continue;  // a2a within pairs of ranks
    INFO("type " << static_cast<int>(type) << " cp " << cp << " dropout " << p);
    const Tensor q = parallel::cp_split(qkv, cp, r), dO = parallel::cp_split(dout, cp, r);
    Tensor o = Tensor::empty({B, L, H * D}, DType::f64), l = Tensor::empty({B, H, L}, DType::f64);
    Tensor dq = Tensor::empty(q.shape(), DType::f64);
    const double b0 = ex->bytes_sent();
    const parallel::CpAttention a{H, G, type, drop, 2};
    parallel::cp_attention_forward(o, l, q, a, *ex);
    if (type == CpCommType::p2p)  // the groups' K/V, cp - 1 times
      CHECK(ex->bytes_sent() - b0 == Approx(static_cast<double>((cp - 1) * B * L * G * 2 * D * 8)));
    parallel::cp_attention_backward(dq, dO, q, o, l, a, *ex);
    CHECK(max_abs(o, parallel::cp_split(out, cp, r)) < 1e-12);
    CHECK(max_abs(dq, parallel::cp_split(dqkv, cp, r)) < 1e-12);
    double dl = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < L; ++i)
          dl = std::max(dl, std::fabs(l.data<double>()[(b * H + h) * L + i] -
                                      lse.data<double>()[(b * H + h) * T + pos[static_cast<size_t>(i)]]));
    CHECK(dl < 1e-12);
  }
}
