// The routed-experts MLP of a mixture-of-experts layer (docs/specs/moe.md), a part of the
// decoder like those of model/parts.hpp: a layer's MLP is dense or this, per
// MoeLayerConfig::is_moe. Built from the MoE ops (core/moe_ops.hpp) on one process: the
// router's logits, top-k, capacity, dispatch, the experts as grouped GEMMs with the
// model's activation, combine, the optional shared expert with its gate, and the
// balancing and z losses added to the training loss. CPU or CUDA; the rows f32, f64 or
// bf16/f16 storage, the router f32 (f64 beside f64 rows).
#pragma once
#include <cstdint>
#include <vector>

#include "core/moe_ops.hpp"
#include "core/tensor.hpp"

namespace mtnlg::parallel {
class Communicator;
}

namespace mtnlg::model {

// The MoE keys as the model uses them (app::gpt_config fills it from the recipe).
// sinkhorn: training chooses by ops::moe_sinkhorn of the logits (no balancing loss).
enum class MoeBalancing { aux_loss, seq_aux_loss, global_aux_loss, none, sinkhorn };
struct MoeLayerConfig {
  int64_t num_experts = 0;  // 0: every layer dense
  int64_t ffn = 0;          // each routed expert's width
  int64_t shared_ffn = 0;   // the shared expert's width; 0 = none
  bool shared_gate = false;
  ops::RouterParams router;
  bool router_fp64 = false;  // moe_router_dtype fp64: logits, choices, losses in double (the weights as before)
  MoeBalancing balancing = MoeBalancing::aux_loss;
  double aux_coeff = 0.0, z_coeff = 0.0;  // 0: that loss is not computed
  bool expert_bias = false;
  double bias_update_rate = 1e-3;
  double capacity_factor = 0.0;  // 0: dropless
  double jitter_eps = 0.0;       // > 0: the router's input scaled by U(1 - eps, 1 + eps) in training
  bool pad_to_capacity = false;
  ops::DropPolicy drop_policy = ops::DropPolicy::probs;
  std::vector<uint8_t> layers;  // per layer of the whole model: 1 = MoE
  // Expert parallelism: this rank holds experts [ep_rank * E / ep_size, (ep_rank + 1) * E /
  // ep_size) (the model declares only those); the trainer sets it from its expert grid.
  int64_t ep_size = 1, ep_rank = 0;
  // Expert tensor parallelism: each expert's width split over etp_size ranks (ffn / etp_size
  // of it here).
  int64_t etp_size = 1, etp_rank = 0;
  int64_t local_experts() const { return num_experts / ep_size; }
  int64_t local_ffn() const { return ffn / etp_size; }
  int64_t first_expert() const { return ep_rank * local_experts(); }

  bool enabled() const { return num_experts > 0; }
  bool is_moe(int64_t layer) const {
    return enabled() && layer >= 0 && layer < static_cast<int64_t>(layers.size()) &&
           layers[static_cast<size_t>(layer)] == 1;
  }
};

// The groups an MoE layer talks over (none in one process): `ep`, the expert-parallel
// group whose ranks hold E / ep experts each and swap tokens with all-to-all; `etp`, the
// expert-tensor-parallel group whose ranks hold a slice of each expert's width and pool
// their rows so each computes its slice for all of them; `seq`, the ranks that split one micro batch's tokens (the tp
// group under sequence parallelism), over which the balancing loss's counts are summed
// and the losses are partial (their sum over `seq` is the micro batch's loss): the tp
// group under sequence parallelism and the cp group, each summed over in turn.
struct MoeGroups {
  parallel::Communicator* ep = nullptr;      // null: one expert-parallel rank
  parallel::Communicator* etp = nullptr;     // the ranks splitting each expert's width; null: one
  std::vector<parallel::Communicator*> seq;  // tp under sp, cp: together they split the tokens
  parallel::Communicator* dp = nullptr;      // the data replicas (global_aux_loss sums its counts over them)
  int64_t seq_parts() const;
  bool exchange() const;  // rows leave this rank: ep or etp has more than one rank
};

// One MoE layer's weights and gradients (the store's views). w1 [E, F or 2F, H] (SwiGLU:
// each expert's [gate; up]), w2 [E, H, F]; the shared expert's s_w1 [S or 2S, H], s_w2
// [H, S] and gate [1, H] when configured; expert_bias [E] (no gradient: the update rule
// moves it).
struct MoeParams {
  Tensor router_w, d_router_w, expert_bias;
  Tensor w1, d_w1, w2, d_w2;
  Tensor s_w1, d_s_w1, s_w2, d_s_w2, s_gate, d_s_gate;
};

// What a training forward keeps for the backward.
struct MoeActs {
  Tensor logits, probs, idx;  // router [N, E], top-k weights and experts [N, k]
  Tensor scores, counts;      // the balancing loss's scores [N, E] and counts [groups, E]
  ops::MoeDispatch d;
  // Expert parallelism: the rows swapped with each ep peer (sent = this rank's routed rows
  // by the peer holding their expert, received = the rows for this rank's experts), the
  // received rows as one batch of "tokens" routed once each (k = 1) to a local expert
  // (plan `rd`, in (peer, expert, token) order) and their routing weights [R, 1].
  std::vector<int64_t> sent, received;
  std::vector<int64_t> pooled;  // etp: the rows each rank of the group brought to the pool
  ops::MoeDispatch rd;
  Tensor r_weight;
  Tensor xp, pre, act, aw;              // dispatched rows, fc1 output, activation, weighted activation
  Tensor s_pre, s_act, s_out, s_logit;  // shared expert: fc1 output, activation, fc2 output, gate logit
  // The router's input jitter of this forward (set by the caller before it; `on` false: none)
  // and the jittered input the router's weight gradient needs.
  struct Jitter {
    bool on = false;
    uint64_t key = 0, base = 0;
    DeviceKey dkey;
  } jitter;
  Tensor router_in;
  bool defined() const { return logits.defined(); }
  int64_t bytes() const;
};

// One step's routing record of a layer, summed over its training forwards (recomputed
// forwards excluded): tokens per expert after drops, dropped slots, and the balancing and
// z losses divided by their coefficients (Megatron-Core's logged values).
struct MoeLayerStats {
  int64_t layer = 0;
  std::vector<double> tokens;
  int64_t dropped = 0;
  double aux = 0.0, z = 0.0;
  int64_t forwards = 0;
  // global_aux_loss: the balancing counts of this step's micro batches so far (summed over
  // the tp, cp and dp ranks) and how many micro batches they hold.
  std::vector<double> global_counts{};
  int64_t global_micro = 0;
  // A layer with fixed-size groups (MoeMlp::fixed_groups) records on the rows' device
  // instead, f64 [E + 4]: tokens per expert, dropped, aux, z, forwards (ops::moe_record_routing);
  // take_record adds it to the fields above and zeroes it.
  Tensor record{};
  void take_record();
  // Back to an empty record, the device record (zeroed) kept.
  void reset();
};

// Where an MoE layer's time goes on this thread since the process started (the comm
// report's per-step differences): `dispatch`, the wall time moving routed rows — the
// permutations, the routing weights' gathers and scatters and, with expert parallelism,
// the all-to-alls — forward and backward; `exchange`, the part of it inside the
// all-to-alls (the wait for the other ranks included).
struct MoeDispatchTimes {
  double dispatch = 0, exchange = 0;
};
MoeDispatchTimes moe_dispatch_times();

struct MoeMlp {
  MoeLayerConfig cfg;
  bool swiglu = false;
  MoeGroups groups;

  // out [N, H] (written) from the normed input `in` [N, H]; `seq` tokens per sequence (the
  // per-sequence loss's groups). train: keeps `a` for the backward and, with `stats`,
  // records the routing and the losses.
  void forward(Tensor& out, MoeActs& a, const Tensor& in, const MoeParams& p, int64_t seq, bool train,
               MoeLayerStats* stats) const;
  // din (written) from dout [N, H]; parameter gradients accumulate. loss_weight: the
  // gradient of the total loss with respect to this micro batch's balancing and z losses,
  // times `weight_dev`'s value (f64 [1] on the rows' device, read when the kernels run: a
  // CUDA graph's replay reads the current micro batch's) when given.
  void backward(Tensor& din, const Tensor& dout, const MoeActs& a, const Tensor& in, MoeParams& p, int64_t seq,
                double loss_weight, const Tensor* weight_dev = nullptr) const;
  // Whether this layer's routing runs without a synchronisation: fixed-size expert groups
  // (a capacity, padded to it) on this rank's own experts. Its plan is then made where the
  // rows are, and its record (MoeLayerStats::record) kept there.
  bool fixed_groups() const;

 private:
  void route(MoeActs& a, const Tensor& in, const MoeParams& p, int64_t seq, bool train, MoeLayerStats* stats) const;
  void experts_forward(Tensor& out, MoeActs& a, const Tensor& in, const MoeParams& p) const;
  // The local experts on rows xr [R, H] dispatched by plan d with weights w (d's probs):
  // yr [R, H] (written) in xr's order; keeps what the backward needs in `a`.
  void local_experts_forward(Tensor& yr, MoeActs& a, const Tensor& xr, const ops::MoeDispatch& d, const Tensor& w,
                             const MoeParams& p) const;
  void local_experts_backward(Tensor& dxr, Tensor& dw, const Tensor& dyr, const MoeActs& a, const ops::MoeDispatch& d,
                              const Tensor& w, MoeParams& p) const;
  void exchange_forward(Tensor& out, MoeActs& a, const Tensor& in, const MoeParams& p) const;
  std::vector<int32_t> swap_counts(MoeActs& a) const;
  std::vector<int64_t> pool_counts(int64_t rows, Device dev) const;
  Tensor pool_rows(const Tensor& x, const std::vector<int64_t>& counts, int64_t w) const;
  Tensor sum_pooled(const Tensor& partial, const std::vector<int64_t>& counts, int64_t w) const;
  void exchange_backward(Tensor& din, Tensor& dprobs, const Tensor& dout, const MoeActs& a, MoeParams& p) const;
  double aux_loss(MoeActs& a, const Tensor& in, int64_t seq, MoeLayerStats* stats) const;
  double running_global_counts(MoeActs& a, MoeLayerStats* stats) const;
  void shared_forward(Tensor& out, MoeActs& a, const Tensor& in, const MoeParams& p) const;
  void shared_backward(Tensor& din, const Tensor& dout, const MoeActs& a, const Tensor& in, MoeParams& p) const;
  void router_backward(Tensor& din, const Tensor& dprobs, const MoeActs& a, const Tensor& in, MoeParams& p, int64_t seq,
                       double loss_weight, const Tensor* weight_dev) const;
  void plan(MoeActs& a, const Tensor& in, MoeLayerStats* stats, int64_t& dropped) const;
  // The router's side (logits, its top-k, the balancing scores and counts, their
  // gradients): f64 with router_fp64 or beside f64 rows, else f32.
  Tensor router_side(int64_t rows, int64_t cols, const Tensor& like) const;
  int64_t loss_groups(int64_t rows, int64_t seq) const;
};

}  // namespace mtnlg::model
