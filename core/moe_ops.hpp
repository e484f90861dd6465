// The mixture-of-experts ops (core/ops/moe.cpp; docs/specs/moe.md), in the op set's
// style (core/ops.hpp: explicit forward/backward pairs, activation gradients written,
// parameter gradients accumulated) and namespace, with their argument structs. A header
// of its own so that the rest of the op set does not depend on it.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.hpp"
#include "core/tensor.hpp"

namespace mtnlg::ops {

// ---- mixture of experts (ops::moe_*; docs/specs/moe.md) ------------------------------------
// How the router turns a token's logits [E] into its top-k experts and their weights
// (Megatron-Core's forms): softmax (top-k of the logits, then a softmax over those k; or,
// with pre_softmax, the top-k of the softmax over all E), or sigmoid (the top-k of
// sigmoid(logit) + expert_bias, the bias choosing only; the k sigmoids then divided by
// their sum + 1e-20 when k > 1). The weights are multiplied by scaling_factor when it is
// non-zero. With group_topk > 0 (group-limited routing) the E experts form num_groups
// equal groups, a group's score is the sum of its top topk / group_topk selection scores,
// and only the group_topk best groups' experts compete.
enum class RouterScore { softmax, sigmoid };
struct RouterParams {
  int64_t topk = 2;
  RouterScore score = RouterScore::softmax;
  bool pre_softmax = false;
  double scaling_factor = 0.0;  // 0: none
  int64_t num_groups = 0;
  int64_t group_topk = 0;  // > 0: group-limited routing
};

// Which of an expert's tokens past its capacity are dropped: the lowest weights (ties: the
// later token), or the later positions.
enum class DropPolicy { probs, position };

// Where each routed (token, slot) goes once the tokens are sorted by expert
// (ops::moe_dispatch_plan): expert e's rows are [offset(e), offset(e) + counts[e]), its
// tokens in token order (slot order within a token), then any padding rows (zeros that
// never return to a token). Slot n*k + j is token n's j-th choice (idx/probs [N, k]).
struct MoeDispatch {
  int64_t num_tokens = 0, topk = 0, num_experts = 0;
  int64_t rows = 0;             // sum of counts
  std::vector<int64_t> counts;  // rows per expert, padding included
  std::vector<int64_t> tokens;  // routed (kept) slots per expert, before padding
  // On the device of the routing choices (made on the host, uploaded for CUDA's kernels).
  Tensor row_src;   // i32 [rows]: the token of each row; -1 for padding
  Tensor row_slot;  // i32 [rows]: the slot of each row; -1 for padding
  Tensor slot_row;  // i32 [N*k]: the row of each slot; -1 when dropped

  int64_t offset(int64_t e) const {
    int64_t o = 0;
    for (int64_t i = 0; i < e; ++i) o += counts[static_cast<size_t>(i)];
    return o;
  }
  // The same plan with its index tensors on `dev` (copied where they live elsewhere).
  MoeDispatch on(Device dev) const {
    MoeDispatch m = *this;
    for (Tensor* t : {&m.row_src, &m.row_slot, &m.slot_row}) *t = t->on(dev);
    return m;
  }
};

// ---- mixture of experts (core/ops/moe.cpp; docs/specs/moe.md) --------------------------------
// The MoE layer's pieces: the CPU reference in f32 or f64, and CUDA (core/cuda/moe.cu:
// the router's side in f32, the rows in f32, bf16 or f16; the experts' GEMMs through
// cuBLAS's grouped GEMM). N tokens (rows), E experts, top-k, H hidden, groups of
// contiguous rows for the per-sequence loss. Every sum runs in a fixed order (row, then
// slot, then expert), so results do not depend on threads. The dispatch plan and the
// capacity are computed on the host for both devices (CUDA's choices are copied over:
// the plan's sizes decide the launches and allocations that follow), except for the
// padded plan (moe_padded_dispatch_plan): its sizes are fixed, so CUDA makes it on the
// device, and with the accumulating forms of the losses and the routing record a padded
// MoE layer runs without a synchronisation (what a CUDA graph captures).
//
// The router's gating in its own dtype: logits[N, E] = x[N, H] @ w[E, H]^T computed in the
// dtype of `logits` (x and w converted to it, Megatron-Core's moe_router_dtype).
void moe_router_logits_forward(Tensor& logits, const Tensor& x, const Tensor& w);
// dx (written, x's dtype) = dlogits @ w; dw += dlogits^T @ x (dw in the wide dtype of w).
void moe_router_logits_backward(Tensor& dx, Tensor& dw, const Tensor& dlogits, const Tensor& x, const Tensor& w);
// Top-k routing (RouterParams): probs [N, k] (the dtype of logits) and idx (i32 [N, k]),
// each row's choices in descending selection score, ties to the lower expert index.
// expert_bias [E] (optional, sigmoid only) shifts the selection, never the weights.
// selection [N, E] (optional, the logits' dtype): the experts are chosen by it instead
// (sinkhorn's balanced assignment), the weights still the router's form of the chosen.
void moe_topk_forward(Tensor& probs, Tensor& idx, const Tensor& logits, const Tensor* expert_bias,
                      const RouterParams& p, const Tensor* selection = nullptr);
// Sinkhorn's balancing (Megatron-Core's sinkhorn load balancing): out [N, E] (written) =
// d1[e] * exp(logits[n, e]) * d0[n], the row and column factors iterated, d0 = 1 / (N *
// (exp(l) d1 + 1e-8)) then d1 = 1 / (E * (d0^T exp(l) + 1e-8)), until the mean change of
// d1 is at most `tol` (at most `max_iter` rounds). In double, sums in row and expert
// order; no gradient (it only chooses). Its columns sum to 1/E, its rows to about 1/N.
void moe_sinkhorn(Tensor& out, const Tensor& logits, double tol = 1e-4, int64_t max_iter = 10000);
// dlogits (written) from dprobs [N, k] through the weights' formula (the selection is a
// constant): only the chosen logits get gradient, except with pre_softmax (all E).
void moe_topk_backward(Tensor& dlogits, const Tensor& dprobs, const Tensor& logits, const Tensor& idx,
                       const RouterParams& p);
// The load-balancing loss's scores and counts: scores [N, E] = softmax(logits), or
// sigmoid(logits) / (their sum + 1e-20); counts [groups, E] (+ written) = how many of each
// group's rows (N / groups contiguous rows) have the expert in their own top-k of these
// scores (no bias, no groups, no drops).
void moe_aux_scores_forward(Tensor& scores, Tensor& counts, const Tensor& logits, RouterScore score, int64_t topk,
                            int64_t groups);
// dlogits += the scores' backward of dscores [N, E].
void moe_aux_scores_backward(Tensor& dlogits, const Tensor& dscores, const Tensor& logits, RouterScore score);
// Megatron-Core's switch load-balancing loss over `groups` groups of rows, averaged:
//   loss = coeff * E / (topk * T^2) / groups * sum_g sum_e (sum_{n in g} scores[n, e]) * counts[g, e]
// with T = total_tokens. aux_loss: groups 1, T = N, counts of this micro batch;
// seq_aux_loss: groups = sequences, T = sequence length; global_aux_loss: groups 1, counts
// averaged over the batch's micro batches and ranks, T = N x ranks. Returns the loss; with
// `acc` (f64 [1] on the op's device) adds it there instead and returns 0 (on CUDA without
// a synchronisation).
double moe_aux_loss_forward(const Tensor& scores, const Tensor& counts, int64_t groups, double total_tokens,
                            int64_t topk, double coeff, Tensor* acc = nullptr);
// dscores (written) = dloss * coeff * E / (topk * T^2) / groups * counts[g(n), e]; with
// `dloss_scale` (f64 [1] on the op's device) dloss is multiplied by its value, read when
// the op runs (a CUDA graph's replay reads the current one).
void moe_aux_loss_backward(Tensor& dscores, const Tensor& counts, int64_t groups, double total_tokens, int64_t topk,
                           double coeff, double dloss, const Tensor* dloss_scale = nullptr);
// The router z-loss: coeff * mean_n (logsumexp_e logits[n, e])^2; the backward adds
// dloss * coeff * 2 lse_n softmax(logits)[n, e] / N to dlogits. `acc` and `dloss_scale`
// as for the balancing loss.
double moe_z_loss_forward(const Tensor& logits, double coeff, Tensor* acc = nullptr);
void moe_z_loss_backward(Tensor& dlogits, const Tensor& logits, double coeff, double dloss,
                         const Tensor* dloss_scale = nullptr);
// An expert's capacity: ceil(tokens * topk / E * factor).
int64_t moe_capacity(int64_t tokens, int64_t num_experts, int64_t topk, double factor);
// keep (i32 [N, k], written): 1 for the slots each expert keeps within `capacity`, 0 for
// the dropped (DropPolicy). Returns the dropped count, sum_e max(0, routed_e - capacity).
int64_t moe_apply_capacity(Tensor& keep, const Tensor& probs, const Tensor& idx, int64_t num_experts, int64_t capacity,
                           DropPolicy policy);
// The permutation of idx [N, k] (i32) by expert, stable; `keep` (optional) drops slots;
// pad_to > 0 pads every expert's group with zero rows up to pad_to (fixed-size groups).
MoeDispatch moe_dispatch_plan(const Tensor& idx, const Tensor* keep, int64_t num_experts, int64_t pad_to = 0);
// The capacity's drops and the padded plan in one, on the device of the choices and
// without a synchronisation: every expert's group is exactly `capacity` rows, its kept
// slots in token order, then padding. The plan is moe_apply_capacity's keep followed by
// moe_dispatch_plan(pad_to = capacity), bit for bit, except that d.tokens stays empty:
// kept (i32 [E], written) holds each expert's kept slots, on the device.
MoeDispatch moe_padded_dispatch_plan(Tensor& kept, const Tensor& probs, const Tensor& idx, int64_t num_experts,
                                     int64_t capacity, DropPolicy policy);
// One forward's routing added to a layer's record (f64 [E + 4] on kept's device): [e] +=
// kept[e], [E] += slots - sum(kept) (the dropped slots), [E + 3] += 1 (the forwards); [E +
// 1] and [E + 2] take the balancing and z losses (their forwards' `acc`).
void moe_record_routing(Tensor& record, const Tensor& kept, int64_t slots);
// out[rows, H] (written): row r = x[row_src[r]], zero for padding. Its backward is
// moe_unpermute of the gradient, and moe_unpermute's is moe_permute.
void moe_permute(Tensor& out, const Tensor& x, const MoeDispatch& d);
// y[N, H] (written): y[n] = sum over n's kept slots j (in slot order) of rows[slot_row[n*k + j]].
void moe_unpermute(Tensor& y, const Tensor& rows, const MoeDispatch& d);
// out[rows, F] (written) = act * probs[row_slot[r]] per row (zero for padding): the
// routing weight, applied after the activation and before the second expert GEMM.
void moe_weight_rows_forward(Tensor& out, const Tensor& act, const Tensor& probs, const MoeDispatch& d);
// dact (written) = dout * weight; dprobs [N, k] (written) = sum_f dout * act for each kept
// slot's row, 0 for dropped slots.
void moe_weight_rows_backward(Tensor& dact, Tensor& dprobs, const Tensor& dout, const Tensor& act, const Tensor& probs,
                              const MoeDispatch& d);
// The experts as one grouped GEMM over contiguous row groups (counts[e] rows each, in
// expert order): out[rows, OC] = inp[rows, C] @ w[e]^T (+ bias[e]) with w [E, OC, C], bias
// [E, OC] (optional); one BLAS call per non-empty expert.
void grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias,
                            const std::vector<int64_t>& counts);
// dinp (written), dw +=, dbias += per expert (any may be null).
void grouped_matmul_backward(Tensor* dinp, Tensor* dw, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                             const Tensor& w, const std::vector<int64_t>& counts);
// Aux-loss-free balancing (the sign rule), once per global batch: bias[e] += rate *
// sign(mean(counts) - counts[e]) (bias f32/f64 [E], counts [E] in any float dtype).
void moe_expert_bias_update(Tensor& bias, const Tensor& counts, double rate);
// The shared expert's gate: out[N, C] = x * sigmoid(gate[N]) (gate = x_in . w, one logit
// per token); backward: dx = dout * sigmoid(g) (written), dgate[n] = sum_c dout x s(1-s) (written).
void sigmoid_gate_forward(Tensor& out, const Tensor& x, const Tensor& gate);
void sigmoid_gate_backward(Tensor& dx, Tensor& dgate, const Tensor& dout, const Tensor& x, const Tensor& gate);
// The router's input jitter (moe_input_jitter_eps, training only): out[e] = x[e] * (1 - eps
// + 2 eps u_e), u_e uniform in [0, 1) drawn as dropout's masks are (counter-based:
// philox_uniform(key, 1, base_index + e), the same on both devices and in any layout that
// gives the rows the same base; `dkey` as for dropout). Its backward is the same op on the
// gradient. out may be x.
void moe_jitter(Tensor& out, const Tensor& x, double eps, uint64_t key, uint64_t base_index,
                const DeviceKey& dkey = {});

}  // namespace mtnlg::ops
