#include "model/moe.hpp"

#include "core/error.hpp"
#include "core/ops.hpp"

namespace mtnlg::model {

namespace {
void act_forward(bool swiglu, Tensor& out, const Tensor& pre) {
  if (swiglu)
    ops::swiglu_forward(out, pre);
  else
    ops::gelu_forward(out, pre);
}
void act_backward(bool swiglu, Tensor& dpre, const Tensor& dact, const Tensor& pre) {
  if (swiglu)
    ops::swiglu_backward(dpre, dact, pre);
  else
    ops::gelu_backward(dpre, pre, dact);
}
Tensor empty_like_rows(int64_t rows, int64_t cols, const Tensor& like) {
  return Tensor::empty({rows, cols}, like.dtype(), like.device());
}
}  // namespace

int64_t MoeActs::bytes() const {
  int64_t b = 0;
  for (const Tensor* t : {&logits, &probs, &idx, &scores, &counts, &xp, &pre, &act, &aw, &s_pre, &s_act, &s_out,
                          &s_logit, &d.row_src, &d.row_slot, &d.slot_row})
    if (t->defined()) b += t->nbytes();
  return b;
}

// seq_aux_loss: one group per sequence; the other types: one group.
int64_t MoeMlp::loss_groups(int64_t rows, int64_t seq) const {
  if (cfg.balancing != MoeBalancing::seq_aux_loss) return 1;
  MTNLG_CHECK(seq > 0 && rows % seq == 0, "MoE: {} rows are not whole sequences of {}", rows, seq);
  return rows / seq;
}

// Router, top-k, capacity and dispatch; in training the balancing and z losses.
void MoeMlp::route(MoeActs& a, const Tensor& in, const MoeParams& p, int64_t seq, bool train,
                   MoeLayerStats* stats) const {
  const int64_t N = in.dim(0), E = cfg.num_experts, k = cfg.router.topk;
  a.logits = empty_like_rows(N, E, in);
  ops::moe_router_logits_forward(a.logits, in, p.router_w);
  double z = 0.0, aux = 0.0;
  if (train && cfg.z_coeff > 0) z = ops::moe_z_loss_forward(a.logits, cfg.z_coeff);
  a.probs = empty_like_rows(N, k, in);
  a.idx = Tensor::empty({N, k}, DType::i32, in.device());
  ops::moe_topk_forward(a.probs, a.idx, a.logits, p.expert_bias.defined() ? &p.expert_bias : nullptr, cfg.router);
  int64_t dropped = 0;
  if (cfg.capacity_factor > 0) {
    const int64_t cap = ops::moe_capacity(N, E, k, cfg.capacity_factor);
    Tensor keep = Tensor::empty({N, k}, DType::i32, in.device());
    dropped = ops::moe_apply_capacity(keep, a.probs, a.idx, E, cap, cfg.drop_policy);
    a.d = ops::moe_dispatch_plan(a.idx, &keep, E, cfg.pad_to_capacity ? cap : 0);
  } else {
    a.d = ops::moe_dispatch_plan(a.idx, nullptr, E, 0);
  }
  if (train && cfg.balancing != MoeBalancing::none && cfg.aux_coeff > 0) {
    const int64_t groups = loss_groups(N, seq);
    a.scores = empty_like_rows(N, E, in);
    a.counts = Tensor::empty({groups, E}, in.dtype(), in.device());
    ops::fill(a.counts, 0.0);
    ops::moe_aux_scores_forward(a.scores, a.counts, a.logits, cfg.router.score, k, groups);
    aux = ops::moe_aux_loss_forward(a.scores, a.counts, groups, static_cast<double>(N / groups), k, cfg.aux_coeff);
  }
  if (!stats) return;
  stats->tokens.resize(static_cast<size_t>(E), 0.0);
  for (int64_t e = 0; e < E; ++e) stats->tokens[static_cast<size_t>(e)] += static_cast<double>(a.d.tokens[e]);
  stats->dropped += dropped;
  if (cfg.aux_coeff > 0) stats->aux += aux / cfg.aux_coeff;
  if (cfg.z_coeff > 0) stats->z += z / cfg.z_coeff;
  ++stats->forwards;
}

// out = unpermute(W2_e (weight * act(W1_e permute(in)))).
void MoeMlp::experts_forward(Tensor& out, MoeActs& a, const Tensor& in, const MoeParams& p) const {
  const int64_t H = in.dim(1), F = cfg.ffn, rows = a.d.rows;
  a.xp = empty_like_rows(rows, H, in);
  ops::moe_permute(a.xp, in, a.d);
  a.pre = empty_like_rows(rows, swiglu ? 2 * F : F, in);
  ops::grouped_matmul_forward(a.pre, a.xp, p.w1, nullptr, a.d.counts);
  a.act = empty_like_rows(rows, F, in);
  act_forward(swiglu, a.act, a.pre);
  a.aw = empty_like_rows(rows, F, in);
  ops::moe_weight_rows_forward(a.aw, a.act, a.probs, a.d);
  Tensor eo = empty_like_rows(rows, H, in);
  ops::grouped_matmul_forward(eo, a.aw, p.w2, nullptr, a.d.counts);
  ops::moe_unpermute(out, eo, a.d);
}

// out += shared(in), times sigmoid(in . gate) with the gate.
void MoeMlp::shared_forward(Tensor& out, MoeActs& a, const Tensor& in, const MoeParams& p) const {
  const int64_t N = in.dim(0), H = in.dim(1), S = cfg.shared_ffn;
  a.s_pre = empty_like_rows(N, swiglu ? 2 * S : S, in);
  ops::matmul_forward(a.s_pre, in, p.s_w1, nullptr);
  a.s_act = empty_like_rows(N, S, in);
  act_forward(swiglu, a.s_act, a.s_pre);
  a.s_out = empty_like_rows(N, H, in);
  ops::matmul_forward(a.s_out, a.s_act, p.s_w2, nullptr);
  if (!cfg.shared_gate) {
    ops::add_inplace(out, a.s_out);
    return;
  }
  a.s_logit = empty_like_rows(N, 1, in);
  ops::matmul_forward(a.s_logit, in, p.s_gate, nullptr);
  Tensor gated = empty_like_rows(N, H, in);
  ops::sigmoid_gate_forward(gated, a.s_out, a.s_logit.view({N}));
  ops::add_inplace(out, gated);
}

void MoeMlp::forward(Tensor& out, MoeActs& a, const Tensor& in, const MoeParams& p, int64_t seq, bool train,
                     MoeLayerStats* stats) const {
  route(a, in, p, seq, train, stats);
  experts_forward(out, a, in, p);
  if (cfg.shared_ffn > 0) shared_forward(out, a, in, p);
}

void MoeMlp::shared_backward(Tensor& din, const Tensor& dout, const MoeActs& a, const Tensor& in, MoeParams& p) const {
  const int64_t N = in.dim(0), H = in.dim(1), S = cfg.shared_ffn;
  Tensor ds_out = dout;
  if (cfg.shared_gate) {
    ds_out = empty_like_rows(N, H, in);
    Tensor dlogit = empty_like_rows(N, 1, in);
    Tensor dlogit_flat = dlogit.view({N});
    ops::sigmoid_gate_backward(ds_out, dlogit_flat, dout, a.s_out, a.s_logit.view({N}));
    ops::matmul_backward(&din, &p.d_s_gate, nullptr, dlogit, in, p.s_gate, true);
  }
  Tensor ds_act = empty_like_rows(N, S, in);
  ops::matmul_backward(&ds_act, &p.d_s_w2, nullptr, ds_out, a.s_act, p.s_w2);
  Tensor ds_pre = empty_like_rows(N, swiglu ? 2 * S : S, in);
  act_backward(swiglu, ds_pre, ds_act, a.s_pre);
  ops::matmul_backward(&din, &p.d_s_w1, nullptr, ds_pre, in, p.s_w1, true);
}

// The router's gradient: through the top-k weights, the balancing loss's scores and the
// z-loss (each loss's gradient scaled by loss_weight), then the gating GEMM.
void MoeMlp::router_backward(Tensor& din, const Tensor& dprobs, const MoeActs& a, const Tensor& in, MoeParams& p,
                             int64_t seq, double loss_weight) const {
  const int64_t N = in.dim(0), E = cfg.num_experts, k = cfg.router.topk;
  Tensor dlogits = empty_like_rows(N, E, in);
  ops::moe_topk_backward(dlogits, dprobs, a.logits, a.idx, cfg.router);
  if (a.scores.defined()) {
    const int64_t groups = loss_groups(N, seq);
    Tensor dscores = empty_like_rows(N, E, in);
    ops::moe_aux_loss_backward(dscores, a.counts, groups, static_cast<double>(N / groups), k, cfg.aux_coeff,
                               loss_weight);
    ops::moe_aux_scores_backward(dlogits, dscores, a.logits, cfg.router.score);
  }
  if (cfg.z_coeff > 0) ops::moe_z_loss_backward(dlogits, a.logits, cfg.z_coeff, loss_weight);
  Tensor dx = empty_like_rows(N, in.dim(1), in);
  ops::moe_router_logits_backward(dx, p.d_router_w, dlogits, in, p.router_w);
  ops::add_inplace(din, dx);
}

void MoeMlp::backward(Tensor& din, const Tensor& dout, const MoeActs& a, const Tensor& in, MoeParams& p, int64_t seq,
                      double loss_weight) const {
  MTNLG_CHECK(a.defined(), "MoE backward without its forward's activations");
  const int64_t N = in.dim(0), H = in.dim(1), F = cfg.ffn, rows = a.d.rows;
  Tensor deo = empty_like_rows(rows, H, in);
  ops::moe_permute(deo, dout, a.d);
  Tensor daw = empty_like_rows(rows, F, in);
  ops::grouped_matmul_backward(&daw, &p.d_w2, nullptr, deo, a.aw, p.w2, a.d.counts);
  Tensor dact = empty_like_rows(rows, F, in);
  Tensor dprobs = empty_like_rows(N, cfg.router.topk, in);
  ops::moe_weight_rows_backward(dact, dprobs, daw, a.act, a.probs, a.d);
  Tensor dpre = empty_like_rows(rows, swiglu ? 2 * F : F, in);
  act_backward(swiglu, dpre, dact, a.pre);
  Tensor dxp = empty_like_rows(rows, H, in);
  ops::grouped_matmul_backward(&dxp, &p.d_w1, nullptr, dpre, a.xp, p.w1, a.d.counts);
  ops::moe_unpermute(din, dxp, a.d);
  if (cfg.shared_ffn > 0) shared_backward(din, dout, a, in, p);
  router_backward(din, dprobs, a, in, p, seq, loss_weight);
}

}  // namespace mtnlg::model
