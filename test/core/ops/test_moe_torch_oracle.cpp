// Outside oracle for the MoE ops: one MoE MLP block composed from them (router, top-k,
// experts as grouped GEMMs, the shared expert with its sigmoid gate, the load-balancing
// loss and the z-loss) against test/core/ops/torch_moe.py, an independent PyTorch block
// written from Megatron-Core's formulas: the loss and every gradient, per tensor
// ||ours - torch|| / ||torch|| <= 1e-5, the routing the same.
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <string>

#include "core/moe_ops.hpp"
#include "core/ops.hpp"
#include "core/safetensors.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;

namespace {

struct OracleCase {
  std::string name;
  ops::RouterParams router;
  bool expert_bias = false;  // sigmoid only: the bias chooses, never weights
  bool seq_aux = false;      // seq_aux_loss over the B sequences (else aux_loss over the micro batch)
  bool gelu = false;         // GELU experts (else SwiGLU)
  bool sinkhorn = false;     // chosen by sinkhorn's assignment, no balancing loss
};

// The block's sizes, coefficients and weights (f32, as the trainer keeps them).
struct Block {
  static constexpr int64_t B = 2, S = 6, N = B * S, H = 16, E = 8, F = 12, Fs = 20;
  static constexpr double aux_coeff = 0.05, z_coeff = 0.01;
  OracleCase c;
  Tensor x, wr, bias, w1, w2, ws1, ws2, wg, R;

  int64_t pre(int64_t f) const { return c.gelu ? f : 2 * f; }
  void act(Tensor& out, const Tensor& in) const { c.gelu ? ops::gelu_forward(out, in) : ops::swiglu_forward(out, in); }
  void act_back(Tensor& din, const Tensor& dout, const Tensor& in) const {
    c.gelu ? ops::gelu_backward(din, in, dout) : ops::swiglu_backward(din, dout, in);
  }
};

Tensor normal(const Shape& s, uint64_t seed, double scale) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, static_cast<float>(scale));
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  return t;
}

Block make_block(const OracleCase& c) {
  Block b;
  b.c = c;
  const int64_t N = Block::N, H = Block::H, E = Block::E, F = Block::F, Fs = Block::Fs;
  b.x = normal({N, H}, 1, 1.0);
  b.wr = normal({E, H}, 2, 0.5);
  b.bias = normal({E}, 3, 0.1);
  b.w1 = normal({E, b.pre(F), H}, 4, 0.3);
  b.w2 = normal({E, H, F}, 5, 0.3);
  b.ws1 = normal({b.pre(Fs), H}, 6, 0.3);
  b.ws2 = normal({H, Fs}, 7, 0.3);
  b.wg = normal({1, H}, 8, 0.3);
  b.R = normal({N, H}, 9, 1.0);
  return b;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += double(a.data<float>()[i]) * double(b.data<float>()[i]);
  return s;
}

// What the forward keeps for the backward.
struct Acts {
  Tensor logits, probs, idx, scores, counts;
  ops::MoeDispatch d;
  Tensor xp, h1, a, aw, hs, as, so, gl;
  double aux = 0, z = 0, loss = 0;
};
struct Grads {
  Tensor dx, dwr, dw1, dw2, dws1, dws2, dwg;
};

void router_forward(const Block& b, Acts& s) {
  const int64_t N = Block::N, E = Block::E, k = b.c.router.topk, G = b.c.seq_aux ? Block::B : 1;
  s.logits = Tensor::empty({N, E});
  ops::moe_router_logits_forward(s.logits, b.x, b.wr);
  s.z = ops::moe_z_loss_forward(s.logits, Block::z_coeff);
  s.probs = Tensor::empty({N, k});
  s.idx = Tensor::empty({N, k}, DType::i32);
  if (b.c.sinkhorn) {
    Tensor sel = Tensor::empty({N, E});
    ops::moe_sinkhorn(sel, s.logits);
    ops::moe_topk_forward(s.probs, s.idx, s.logits, nullptr, b.c.router, &sel);
    return;  // no balancing loss
  }
  ops::moe_topk_forward(s.probs, s.idx, s.logits, b.c.expert_bias ? &b.bias : nullptr, b.c.router);
  s.scores = Tensor::empty({N, E});
  s.counts = Tensor::empty({G, E});
  ops::moe_aux_scores_forward(s.scores, s.counts, s.logits, b.c.router.score, k, G);
  s.aux = ops::moe_aux_loss_forward(s.scores, s.counts, G, double(N / G), k, Block::aux_coeff);
}

// Routed experts plus the gated shared expert: out [N, H].
Tensor block_forward(const Block& b, Acts& s) {
  const int64_t N = Block::N, H = Block::H, F = Block::F, Fs = Block::Fs;
  router_forward(b, s);
  s.d = ops::moe_dispatch_plan(s.idx, nullptr, Block::E);
  const int64_t R = s.d.rows;
  s.xp = Tensor::empty({R, H});
  ops::moe_permute(s.xp, b.x, s.d);
  s.h1 = Tensor::empty({R, b.pre(F)});
  ops::grouped_matmul_forward(s.h1, s.xp, b.w1, nullptr, s.d.counts);
  s.a = Tensor::empty({R, F});
  b.act(s.a, s.h1);
  s.aw = Tensor::empty({R, F});
  ops::moe_weight_rows_forward(s.aw, s.a, s.probs, s.d);
  Tensor eo = Tensor::empty({R, H}), y = Tensor::empty({N, H});
  ops::grouped_matmul_forward(eo, s.aw, b.w2, nullptr, s.d.counts);
  ops::moe_unpermute(y, eo, s.d);
  s.hs = Tensor::empty({N, b.pre(Fs)});
  ops::matmul_forward(s.hs, b.x, b.ws1, nullptr);
  s.as = Tensor::empty({N, Fs});
  b.act(s.as, s.hs);
  s.so = Tensor::empty({N, H});
  ops::matmul_forward(s.so, s.as, b.ws2, nullptr);
  s.gl = Tensor::empty({N, 1});
  ops::matmul_forward(s.gl, b.x, b.wg, nullptr);
  Tensor sg = Tensor::empty({N, H});
  ops::sigmoid_gate_forward(sg, s.so, s.gl);
  ops::add(y, y, sg);
  return y;
}

// d(dot(out, R) + aux + z) for every weight and the input.
Grads block_backward(const Block& b, const Acts& s) {
  const int64_t N = Block::N, H = Block::H, F = Block::F, Fs = Block::Fs, E = Block::E, k = b.c.router.topk;
  const int64_t R = s.d.rows, G = b.c.seq_aux ? Block::B : 1;
  Grads g{Tensor::empty({N, H}),       Tensor::zeros({E, H}),        Tensor::zeros(b.w1.shape()),
          Tensor::zeros(b.w2.shape()), Tensor::zeros(b.ws1.shape()), Tensor::zeros(b.ws2.shape()),
          Tensor::zeros(b.wg.shape())};
  // the shared expert and its gate
  Tensor dso = Tensor::empty({N, H}), dgl = Tensor::empty({N, 1}), das = Tensor::empty({N, Fs});
  Tensor dhs = Tensor::empty(s.hs.shape());
  ops::sigmoid_gate_backward(dso, dgl, b.R, s.so, s.gl);
  ops::matmul_backward(&g.dx, &g.dwg, nullptr, dgl, b.x, b.wg);
  ops::matmul_backward(&das, &g.dws2, nullptr, dso, s.as, b.ws2);
  b.act_back(dhs, das, s.hs);
  ops::matmul_backward(&g.dx, &g.dws1, nullptr, dhs, b.x, b.ws1, true);
  // the routed experts
  Tensor deo = Tensor::empty({R, H}), daw = Tensor::empty({R, F}), da = Tensor::empty({R, F});
  Tensor dprobs = Tensor::empty({N, k}), dh1 = Tensor::empty(s.h1.shape()), dxp = Tensor::empty({R, H});
  Tensor dxe = Tensor::empty({N, H});
  ops::moe_permute(deo, b.R, s.d);
  ops::grouped_matmul_backward(&daw, &g.dw2, nullptr, deo, s.aw, b.w2, s.d.counts);
  ops::moe_weight_rows_backward(da, dprobs, daw, s.a, s.probs, s.d);
  b.act_back(dh1, da, s.h1);
  ops::grouped_matmul_backward(&dxp, &g.dw1, nullptr, dh1, s.xp, b.w1, s.d.counts);
  ops::moe_unpermute(dxe, dxp, s.d);
  ops::add_inplace(g.dx, dxe);
  // the router: the weights' path, the load-balancing loss, the z-loss
  Tensor dl = Tensor::empty({N, E}), ds = Tensor::empty({N, E}), dxr = Tensor::empty({N, H});
  ops::moe_topk_backward(dl, dprobs, s.logits, s.idx, b.c.router);
  if (!b.c.sinkhorn) {
    ops::moe_aux_loss_backward(ds, s.counts, G, double(N / G), k, Block::aux_coeff, 1.0);
    ops::moe_aux_scores_backward(dl, ds, s.logits, b.c.router.score);
  }
  ops::moe_z_loss_backward(dl, s.logits, Block::z_coeff, 1.0);
  ops::moe_router_logits_backward(dxr, g.dwr, dl, b.x, b.wr);
  ops::add_inplace(g.dx, dxr);
  return g;
}

// Whether the routing's special form changes some token's experts: the expert bias
// against the same router without it, group-limited routing against plain top-k (a case
// that chose the same experts either way would not test the form).
bool form_matters(const Block& b, const Acts& s) {
  ops::RouterParams plain = b.c.router;
  plain.num_groups = plain.group_topk = 0;
  Tensor p = Tensor::empty(s.probs.shape()), idx = Tensor::empty(s.idx.shape(), DType::i32);
  ops::moe_topk_forward(p, idx, s.logits, nullptr, plain);
  for (int64_t i = 0; i < idx.numel(); ++i)
    if (idx.data<int32_t>()[i] != s.idx.data<int32_t>()[i]) return true;
  return false;
}

// Runs the block on case `c` and writes what torch_moe.py reads into `path`.
void dump_case(const OracleCase& c, const std::string& path) {
  const Block b = make_block(c);
  Acts s;
  const Tensor out = block_forward(b, s);
  s.loss = dot(out, b.R) + s.aux + s.z;
  const Grads g = block_backward(b, s);
  const auto& r = c.router;
  if (c.expert_bias || r.group_topk > 0 || c.sinkhorn) CHECK(form_matters(b, s));
  std::map<std::string, std::string> meta = {{"name", c.name},
                                             {"B", "2"},
                                             {"S", "6"},
                                             {"topk", std::to_string(r.topk)},
                                             {"score", r.score == ops::RouterScore::sigmoid ? "sigmoid" : "softmax"},
                                             {"pre_softmax", r.pre_softmax ? "1" : "0"},
                                             {"scaling_factor", fmt::format("{}", r.scaling_factor)},
                                             {"num_groups", std::to_string(r.num_groups)},
                                             {"group_topk", std::to_string(r.group_topk)},
                                             {"expert_bias", c.expert_bias ? "1" : "0"},
                                             {"seq_aux", c.seq_aux ? "1" : "0"},
                                             {"gelu", c.gelu ? "1" : "0"},
                                             {"sinkhorn", c.sinkhorn ? "1" : "0"},
                                             {"aux_coeff", fmt::format("{}", Block::aux_coeff)},
                                             {"z_coeff", fmt::format("{}", Block::z_coeff)}};
  Tensor losses = Tensor::empty({3}, DType::f64);
  losses.data<double>()[0] = s.loss, losses.data<double>()[1] = s.aux, losses.data<double>()[2] = s.z;
  safetensors::write(path,
                     {{"x", b.x},
                      {"router.weight", b.wr},
                      {"router.expert_bias", b.bias},
                      {"w1", b.w1},
                      {"w2", b.w2},
                      {"shared.w1", b.ws1},
                      {"shared.w2", b.ws2},
                      {"shared.gate", b.wg},
                      {"R", b.R},
                      {"losses", losses},
                      {"idx", s.idx},
                      {"grad.x", g.dx},
                      {"grad.router.weight", g.dwr},
                      {"grad.w1", g.dw1},
                      {"grad.w2", g.dw2},
                      {"grad.shared.w1", g.dws1},
                      {"grad.shared.w2", g.dws2},
                      {"grad.shared.gate", g.dwg}},
                     meta);
}
}  // namespace

TEST_CASE("moe: an MoE block's loss and gradients equal PyTorch's (Megatron-Core's formulas)", "[oracle]") {
  if (!test::python_has("torch")) FAIL("Debian's python3-torch is missing (scripts/install-deps.sh installs it)");
  test::TempDir dir("moe-oracle");
  int n = 0;
  ops::RouterParams softmax;  // top-2 of the logits, softmax over the two
  ops::RouterParams pre = softmax;
  pre.pre_softmax = true, pre.topk = 3, pre.scaling_factor = 1.5;
  ops::RouterParams sigmoid;
  sigmoid.score = ops::RouterScore::sigmoid, sigmoid.topk = 4, sigmoid.scaling_factor = 2.5;
  ops::RouterParams groups = softmax;
  groups.topk = 4, groups.num_groups = 4, groups.group_topk = 2;
  ops::RouterParams deepseek = sigmoid;  // group-limited sigmoid with the bias (DeepSeek-V3's form)
  deepseek.num_groups = 4, deepseek.group_topk = 2;
  ops::RouterParams sinkhorn2 = softmax;  // sinkhorn's weights: softmax over all experts (top-k > 1) ...
  sinkhorn2.pre_softmax = true;
  ops::RouterParams sinkhorn1;  // ... or the chosen one's sigmoid (top-1)
  sinkhorn1.score = ops::RouterScore::sigmoid, sinkhorn1.topk = 1;
  for (const OracleCase& c :
       {OracleCase{"softmax top-2, aux_loss, SwiGLU", softmax, false, false, false},
        OracleCase{"pre-softmax top-3 x1.5, seq_aux_loss, GELU", pre, false, true, true},
        OracleCase{"sigmoid top-4 x2.5 with expert bias, seq_aux_loss", sigmoid, true, true, false},
        OracleCase{"group-limited softmax top-4 (4 groups, 2 kept), aux_loss", groups, false, false, false},
        OracleCase{"group-limited sigmoid with expert bias, aux_loss", deepseek, true, false, false},
        OracleCase{"sinkhorn top-2 (softmax weights), SwiGLU", sinkhorn2, false, false, false, true},
        OracleCase{"sinkhorn top-1 (sigmoid weight), GELU", sinkhorn1, false, false, true, true}})
    dump_case(c, (dir / fmt::format("moe-{}.safetensors", n++)).string());
  // One Python run for every case (torch loads once).
  const auto res =
      test::run_command(test::python() + " " + test::source_dir() + "/test/core/ops/torch_moe.py " + dir.str());
  INFO(res.out);
  CHECK(res.exit_code == 0);
  CHECK(res.out.find("PASS: 7 cases") != std::string::npos);
}
