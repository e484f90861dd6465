// Context parallelism's p2p ring and all_gather with cuDNN's fused blocks (parallel/context_parallel.hpp,
// CpAttention::fused; docs/specs/cudnn-sdpa.md "Blocks"): bf16 on CUDA, cp 2 and 4 in
// process (and 1: the diagonal alone), multi-head, grouped-query and multi-query, against the one-rank cuDNN attention
// (ops::attention_forward_lse / attention_backward_lse on the whole sequence): out, lse
// and dqkv. On the emulated backend in CI (its cuDNN recognises the block graphs and runs
// them with the CPU's block ops); on a GPU the real cuDNN runs them.
#ifdef MTNLG_HAVE_CUDA
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/ops.hpp"
#include "parallel/context_parallel.hpp"
#include "test/core/cuda/cuda_test_util.hpp"

using namespace mtnlg;
using parallel::CpAttention;
using parallel::CpExchange;

namespace {

// The in-process exchange with device tensors: staged through the host (the trainer's NCCL
// moves device memory itself).
class HostStaged final : public CpExchange {
 public:
  explicit HostStaged(CpExchange& in) : in_(in) {}
  int64_t rank() const override { return in_.rank(); }
  int64_t size() const override { return in_.size(); }
  void shift(const Tensor& send, Tensor& recv, int64_t k) override {
    staged(send, recv, [&](auto& i, auto& o) { in_.shift(i, o, k); });
  }
  void all_gather(const Tensor& in, Tensor& out) override {
    staged(in, out, [&](auto& i, auto& o) { in_.all_gather(i, o); });
  }
  void reduce_scatter(const Tensor& in, Tensor& out) override {
    staged(in, out, [&](auto& i, auto& o) { in_.reduce_scatter(i, o); });
  }
  void all_to_all(const Tensor&, Tensor&, int64_t) override { FAIL("p2p and all_gather do not all-to-all"); }

 private:
  template <typename F>
  void staged(const Tensor& in, Tensor& out, F&& f) {
    const Tensor i = in.to(Device::cpu);
    Tensor o = Tensor::empty(out.shape(), out.dtype());
    f(i, o);
    ops::copy(out, o.to(out.device()));
  }
  CpExchange& in_;
};

Tensor randn(const Shape& s, DType dt, std::mt19937_64& g) {
  Tensor t = Tensor::empty(s, DType::f32), out = Tensor::empty(s, dt);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  ops::convert(out, t);
  return out;
}
Tensor f64(const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), DType::f64);
  ops::convert(y, x.to(Device::cpu));
  return y;
}
// max |a - b| / max |b|.
double rel(const Tensor& a, const Tensor& b) {
  const Tensor x = f64(a), y = f64(b);
  double m = 0, scale = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    m = std::max(m, std::fabs(x.data<double>()[i] - y.data<double>()[i]));
    scale = std::max(scale, std::fabs(y.data<double>()[i]));
  }
  return m / std::max(scale, 1e-300);
}
// lse [B, H, T] -> [B, T, H] (f64), so that cp_split / cp_gather move it by position.
Tensor bth(const Tensor& lse) {
  const Tensor x = f64(lse);
  const int64_t B = x.dim(0), H = x.dim(1), T = x.dim(2);
  Tensor y = Tensor::empty({B, T, H}, DType::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) y.data<double>()[(b * T + t) * H + h] = x.data<double>()[(b * H + h) * T + t];
  return y;
}

struct Result {
  Tensor out, lse, dqkv;  // on the host, the whole sequence (lse as [B, T, H])
};

Result one_rank(const Tensor& qkv, const Tensor& dout, int64_t H, int64_t G) {
  const Tensor q = qkv.to(Device::cuda), dO = dout.to(Device::cuda);
  Tensor out = Tensor::empty(dout.shape(), qkv.dtype(), Device::cuda);
  Tensor lse = Tensor::empty({qkv.dim(0), H, qkv.dim(1)}, DType::f32, Device::cuda);
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), Device::cuda);
  ops::attention_forward_lse(out, lse, q, H, {}, G);
  ops::attention_backward_lse(dqkv, dO, q, out, lse, H, {}, G);
  return {out.to(Device::cpu), bth(lse), dqkv.to(Device::cpu)};
}

Result fused_ring(const Tensor& qkv, const Tensor& dout, int64_t cp, const CpAttention& a) {
  std::vector<Tensor> outs(static_cast<size_t>(cp)), lses(outs.size()), dqkvs(outs.size());
  parallel::run_in_process(cp, [&](CpExchange& inner) {
    HostStaged ex(inner);
    const int64_t r = ex.rank();
    const Tensor q = parallel::cp_split(qkv, cp, r).to(Device::cuda);
    const Tensor dO = parallel::cp_split(dout, cp, r).to(Device::cuda);
    Tensor out = Tensor::empty(dO.shape(), qkv.dtype(), Device::cuda);
    Tensor lse = Tensor::empty({q.dim(0), a.heads, q.dim(1)}, DType::f32, Device::cuda);
    parallel::cp_attention_forward(out, lse, q, a, ex);
    Tensor dqkv = Tensor::empty(q.shape(), qkv.dtype(), Device::cuda);
    parallel::cp_attention_backward(dqkv, dO, q, out, lse, a, ex);
    const auto i = static_cast<size_t>(r);
    outs[i] = out.to(Device::cpu), lses[i] = bth(lse), dqkvs[i] = dqkv.to(Device::cpu);
  });
  return {parallel::cp_gather(outs), parallel::cp_gather(lses), parallel::cp_gather(dqkvs)};
}

}  // namespace

// cp 1: p2p's diagonal block alone. The bound is the op table's for bf16 against its
// reference (kRtolLow, 1e-2 of the tensor's largest value): out and dqkv are each rounded
// to bf16 once, from f32 sums in a different order; lse stays f32 on both sides (1e-5).
// Measured on the emulated backend: out 3.5e-3, dqkv 5.5e-3 (p2p) and 6.5e-3 (all_gather),
// lse 1.1e-7.
TEST_CASE("cp p2p and all_gather with cuDNN's fused blocks equal the one-rank cuDNN attention (bf16)", "[gpu][cp]") {
  if (!test::gpu_ready()) return;
  const int64_t cp = GENERATE(1, 2, 4);
  const auto hg = GENERATE(values<std::pair<int64_t, int64_t>>({{4, 4}, {4, 2}, {4, 1}}));
  const int64_t H = hg.first, G = hg.second, B = 2, T = 32, D = 8, W = G * (H / G + 2) * D;
  INFO("cp " << cp << " heads " << H << " groups " << G);
  std::string why;
  std::mt19937_64 g(static_cast<uint64_t>(31 * cp + G));
  const Tensor qkv = randn({B, T, W}, DType::bf16, g), dout = randn({B, T, H * D}, DType::bf16, g);
  const Result ref = one_rank(qkv, dout, H, G);
  for (CpCommType type : {CpCommType::p2p, CpCommType::all_gather}) {
    REQUIRE(ops::attention_cp_blocks_fused_supported(Device::cuda, DType::bf16, B, T / cp, H, D, &why, G,
                                                     type == CpCommType::all_gather ? cp : 0));
    CpAttention a{H, G, type};
    a.fused = true;
    const Result r = fused_ring(qkv, dout, cp, a);
    const double d_out = rel(r.out, ref.out), d_lse = rel(r.lse, ref.lse), d_dqkv = rel(r.dqkv, ref.dqkv);
    INFO((type == CpCommType::p2p ? "p2p" : "all_gather")
         << ": out " << d_out << " lse " << d_lse << " dqkv " << d_dqkv);
    CHECK(d_out <= test::kRtolLow);
    CHECK(d_lse <= 1e-5);
    CHECK(d_dqkv <= test::kRtolLow);
  }
}

TEST_CASE("cp fused blocks refuse what they do not take", "[gpu][cp]") {
  if (!test::gpu_ready()) return;
  std::string why;
  // A chunk of 2 rows: the statistics' pointer of the second chunk would not be 16-byte aligned.
  CHECK_FALSE(ops::attention_cp_blocks_fused_supported(Device::cuda, DType::bf16, 1, 4, 2, 8, &why));
  CHECK_THAT(why, Catch::Matchers::Contains("multiple of 4"));
  CHECK_FALSE(ops::attention_cp_blocks_fused_supported(Device::cuda, DType::f32, 1, 16, 2, 8, &why));
  CHECK_THAT(why, Catch::Matchers::Contains("bf16 or fp16"));
  CHECK_FALSE(ops::attention_cp_blocks_fused_supported(Device::cpu, DType::bf16, 1, 16, 2, 8, &why));
  // f32 activations, or another communication type, with fused set
  const Tensor qkv = Tensor::zeros({1, 16, 3 * 2 * 8}).to(Device::cuda);
  CpAttention a{2, 2, CpCommType::p2p};
  a.fused = true;
  CHECK_THROWS_WITH(parallel::run_in_process(1,
                                             [&](CpExchange& ex) {
                                               Tensor out = Tensor::empty({1, 16, 16}, DType::f32, Device::cuda);
                                               Tensor lse = Tensor::empty({1, 2, 16}, DType::f32, Device::cuda);
                                               parallel::cp_attention_forward(out, lse, qkv, a, ex);
                                             }),
                    Catch::Contains("cuDNN's fused blocks take p2p or all_gather"));
}
#endif
