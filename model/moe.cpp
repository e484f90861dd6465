#include "model/moe.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <tuple>
#include <utility>

#include "core/error.hpp"
#include "core/ops.hpp"
#include "parallel/communicator.hpp"

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
// The routing weights on the rows (and their gradients) are f32 whatever the activations'
// storage (f64 in the f64 tests): the weights must not be rounded to bf16. The router's
// own side may be wider (MoeMlp::router_side).
DType weight_dtype(const Tensor& like) { return like.dtype() == DType::f64 ? DType::f64 : DType::f32; }
Tensor router_rows(int64_t rows, int64_t cols, const Tensor& like) {
  return Tensor::empty({rows, cols}, weight_dtype(like), like.device());
}

// w[r] = probs[row_slot[r]]: each dispatched row's routing weight (0 for padding rows), on
// either device: the weighting op on a column of ones.
void gather_row_weights(Tensor& w, const Tensor& probs, const ops::MoeDispatch& d) {
  Tensor ones = Tensor::empty({d.rows, 1}, w.dtype(), w.device());
  ops::fill(ones, 1.0);
  ops::moe_weight_rows_forward(w, ones, probs, d);
}
// dprobs [N, k] (written): each kept slot's gradient from its row's dw[r]; 0 for dropped
// slots (the weighting op's probs gradient against a column of ones).
void scatter_row_weights(Tensor& dprobs, const Tensor& dw, const Tensor& probs, const ops::MoeDispatch& d) {
  Tensor ones = Tensor::empty({d.rows, 1}, dw.dtype(), dw.device());
  Tensor unused = Tensor::empty({d.rows, 1}, dw.dtype(), dw.device());  // dw times the weights
  ops::fill(ones, 1.0);
  ops::moe_weight_rows_backward(unused, dprobs, dw, ones, probs, d);
}

std::vector<int64_t> times(const std::vector<int64_t>& v, int64_t k) {
  std::vector<int64_t> out(v);
  for (auto& x : out) x *= k;
  return out;
}
}  // namespace

namespace {
thread_local MoeDispatchTimes t_moe_times;

// Adds the wall time of its scope to a MoeDispatchTimes field.
class Timed {
 public:
  explicit Timed(double& into) : into_(into), t0_(std::chrono::steady_clock::now()) {}
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;
  ~Timed() { into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  double& into_;
  std::chrono::steady_clock::time_point t0_;
};

// The all-to-all, timed as exchange (and dispatch).
void swap_rows(parallel::Communicator& ep, const Tensor& in, const std::vector<int64_t>& send, Tensor& out,
               const std::vector<int64_t>& recv, int64_t width) {
  const Timed t(t_moe_times.exchange);
  ep.all_to_all_v(in.raw(), times(send, width), out.raw(), times(recv, width), in.dtype());
}
// Rows x [n, H] and their routing weights (or their gradients) w [n, 1] swapped with the
// ep peers: `send` rows to each, `recv` rows from each, into new tensors.
std::pair<Tensor, Tensor> swap_weighted_rows(parallel::Communicator& ep, const Tensor& x, const Tensor& w,
                                             const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  int64_t n = 0;
  for (int64_t c : recv) n += c;
  Tensor xo = empty_like_rows(n, x.dim(1), x), wo = empty_like_rows(n, 1, w);
  swap_rows(ep, x, send, xo, recv, x.dim(1));
  swap_rows(ep, w, send, wo, recv, 1);
  return {xo, wo};
}

// Host counts swapped with the group's peers (`blocks` to and from each) through buffers on
// `dev`: an NCCL group moves device memory only.
std::vector<int32_t> swap_host_counts(parallel::Communicator& g, const std::vector<int32_t>& mine,
                                      const std::vector<int64_t>& blocks, Device dev) {
  const auto n = static_cast<int64_t>(mine.size());
  Tensor h = Tensor::empty({n}, DType::i32);
  std::copy(mine.begin(), mine.end(), h.data<int32_t>());
  const Tensor in = h.on(dev);
  Tensor out = Tensor::empty({n}, DType::i32, dev);
  {
    const Timed t(t_moe_times.exchange);
    g.all_to_all_v(in.raw(), blocks, out.raw(), blocks, DType::i32);
  }
  const Tensor back = out.on(Device::cpu);
  return std::vector<int32_t>(back.data<int32_t>(), back.data<int32_t>() + n);
}

void timed_permute(Tensor& out, const Tensor& x, const ops::MoeDispatch& d) {
  const Timed t(t_moe_times.dispatch);
  ops::moe_permute(out, x, d);
}
void timed_unpermute(Tensor& y, const Tensor& rows, const ops::MoeDispatch& d) {
  const Timed t(t_moe_times.dispatch);
  ops::moe_unpermute(y, rows, d);
}
}  // namespace

MoeDispatchTimes moe_dispatch_times() { return t_moe_times; }

int64_t MoeGroups::seq_parts() const {
  int64_t n = 1;
  for (const auto* g : seq) n *= g->size();
  return n;
}
bool MoeGroups::exchange() const { return ep || etp; }

int64_t MoeActs::bytes() const {
  int64_t b = 0;
  for (const Tensor* t : {&router_in, &logits,     &probs,      &idx,      &scores,     &counts,      &xp,
                          &pre,       &act,        &aw,         &s_pre,    &s_act,      &s_out,       &s_logit,
                          &d.row_src, &d.row_slot, &d.slot_row, &r_weight, &rd.row_src, &rd.row_slot, &rd.slot_row})
    if (t->defined()) b += t->nbytes();
  return b;
}

// seq_aux_loss: one group per sequence; the other types: one group.
int64_t MoeMlp::loss_groups(int64_t rows, int64_t seq) const {
  if (cfg.balancing != MoeBalancing::seq_aux_loss) return 1;
  MTNLG_CHECK(seq > 0 && rows % seq == 0, "MoE: {} rows are not whole sequences of {}", rows, seq);
  return rows / seq;
}

Tensor MoeMlp::router_side(int64_t rows, int64_t cols, const Tensor& like) const {
  return Tensor::empty({rows, cols}, cfg.router_fp64 ? DType::f64 : weight_dtype(like), like.device());
}

// Router, top-k, capacity and dispatch; in training the balancing and z losses.
void MoeMlp::route(MoeActs& a, const Tensor& in, const MoeParams& p, int64_t seq, bool train,
                   MoeLayerStats* stats) const {
  const int64_t N = in.dim(0), E = cfg.num_experts, k = cfg.router.topk;
  a.logits = router_side(N, E, in);
  a.router_in = Tensor();
  if (train && a.jitter.on && cfg.jitter_eps > 0) {  // the router sees a jittered input, the experts the clean one
    a.router_in = empty_like_rows(N, in.dim(1), in);
    ops::moe_jitter(a.router_in, in, cfg.jitter_eps, a.jitter.key, a.jitter.base, a.jitter.dkey);
  }
  ops::moe_router_logits_forward(a.logits, a.router_in.defined() ? a.router_in : in, p.router_w);
  // Fixed-size groups: the record on the device, the losses added to it (over their coefficients).
  Tensor* rec = nullptr;
  if (stats && fixed_groups()) {
    if (!stats->record.defined()) {
      stats->record = Tensor::empty({E + 4}, DType::f64, in.device());
      ops::fill(stats->record, 0.0);
    }
    rec = &stats->record;
  }
  double z = 0.0, aux = 0.0;
  // Split tokens: each rank's share of the micro batch's mean.
  const double parts = static_cast<double>(groups.seq_parts());
  if (train && cfg.z_coeff > 0) {
    Tensor z_acc = rec ? rec->flat(E + 2, 1) : Tensor();
    z = ops::moe_z_loss_forward(a.logits, (rec ? 1.0 : cfg.z_coeff) / parts, rec ? &z_acc : nullptr);
  }
  Tensor probs = router_side(N, k, in);
  a.idx = Tensor::empty({N, k}, DType::i32, in.device());
  if (train && cfg.balancing == MoeBalancing::sinkhorn) {  // chosen by the balanced assignment
    Tensor sel = router_side(N, E, in);
    ops::moe_sinkhorn(sel, a.logits);
    ops::moe_topk_forward(probs, a.idx, a.logits, nullptr, cfg.router, &sel);
  } else {
    ops::moe_topk_forward(probs, a.idx, a.logits, p.expert_bias.defined() ? &p.expert_bias : nullptr, cfg.router);
  }
  a.probs = probs;  // the rows' weights: f32 beside an f64 router (rounded once), as Megatron-Core casts them
  if (probs.dtype() != weight_dtype(in)) {
    a.probs = router_rows(N, k, in);
    ops::convert(a.probs, probs);
  }
  int64_t dropped = 0;
  plan(a, in, rec ? stats : nullptr, dropped);
  if (train && cfg.balancing != MoeBalancing::none && cfg.balancing != MoeBalancing::sinkhorn && cfg.aux_coeff > 0)
    aux = aux_loss(a, in, seq, stats);
  if (!stats || rec) return;
  stats->tokens.resize(static_cast<size_t>(E), 0.0);
  for (int64_t e = 0; e < E; ++e) stats->tokens[static_cast<size_t>(e)] += static_cast<double>(a.d.tokens[e]);
  stats->dropped += dropped;
  if (cfg.aux_coeff > 0) stats->aux += aux / cfg.aux_coeff;
  if (cfg.z_coeff > 0) stats->z += z / cfg.z_coeff;
  ++stats->forwards;
}

bool MoeMlp::fixed_groups() const { return cfg.capacity_factor > 0 && cfg.pad_to_capacity && !groups.exchange(); }

// The capacity and the dispatch plan: fixed-size groups made where the rows are (their
// kept counts into `stats`'s device record when given), else on the host.
void MoeMlp::plan(MoeActs& a, const Tensor& in, MoeLayerStats* stats, int64_t& dropped) const {
  const int64_t N = in.dim(0), E = cfg.num_experts, k = cfg.router.topk;
  if (cfg.capacity_factor > 0) {
    const int64_t cap = ops::moe_capacity(N, E, k, cfg.capacity_factor);
    if (fixed_groups()) {
      Tensor kept = Tensor::empty({E}, DType::i32, in.device());
      a.d = ops::moe_padded_dispatch_plan(kept, a.probs, a.idx, E, cap, cfg.drop_policy);
      if (stats) ops::moe_record_routing(stats->record, kept, N * k);
      return;
    }
    Tensor keep = Tensor::empty({N, k}, DType::i32, in.device());
    dropped = ops::moe_apply_capacity(keep, a.probs, a.idx, E, cap, cfg.drop_policy);
    // Padding gives fixed-size groups; across ep ranks the rows travel unpadded (the same result).
    a.d = ops::moe_dispatch_plan(a.idx, &keep, E, 0);
  } else {
    a.d = ops::moe_dispatch_plan(a.idx, nullptr, E, 0);
  }
}

void MoeLayerStats::take_record() {
  if (!record.defined()) return;
  const Tensor h = record.to(Device::cpu);
  const double* r = h.data<double>();
  const auto E = static_cast<size_t>(record.numel() - 4);
  if (r[E + 3] > 0) {
    tokens.resize(E, 0.0);
    for (size_t e = 0; e < E; ++e) tokens[e] += r[e];
  }
  dropped += static_cast<int64_t>(r[E]);
  aux += r[E + 1];
  z += r[E + 2];
  forwards += static_cast<int64_t>(r[E + 3]);
  ops::fill(record, 0.0);
}

void MoeLayerStats::reset() {
  Tensor keep = record;
  *this = MoeLayerStats{layer, {}, 0, 0.0, 0.0, 0};
  record = keep;
  if (record.defined()) ops::fill(record, 0.0);
}

// The balancing loss (this rank's part of it when the micro batch's tokens are split):
// scores of its own rows against the counts of the whole micro batch (summed over the
// `seq` ranks), T = the micro batch's tokens. Its gradient is then the one-process one.
double MoeMlp::aux_loss(MoeActs& a, const Tensor& in, int64_t seq, MoeLayerStats* stats) const {
  const int64_t N = in.dim(0), E = cfg.num_experts, k = cfg.router.topk, parts = groups.seq_parts();
  MTNLG_CHECK(parts == 1 || cfg.balancing != MoeBalancing::seq_aux_loss,
              "MoE: the per-sequence balancing loss with tokens split over {} ranks", parts);
  const int64_t n_groups = loss_groups(N, seq);
  a.scores = router_side(N, E, in);
  a.counts = router_side(n_groups, E, in);
  ops::fill(a.counts, 0.0);
  ops::moe_aux_scores_forward(a.scores, a.counts, a.logits, cfg.router.score, k, n_groups);
  for (auto* g : groups.seq) g->all_reduce(a.counts.raw(), a.counts.numel(), a.counts.dtype(), parallel::ReduceOp::sum);
  double T = static_cast<double>(N * parts / n_groups);
  if (cfg.balancing == MoeBalancing::global_aux_loss) T *= running_global_counts(a, stats);
  if (stats && stats->record.defined() && fixed_groups()) {  // into the record, over the coefficient
    Tensor acc = stats->record.flat(E + 1, 1);
    return ops::moe_aux_loss_forward(a.scores, a.counts, n_groups, T, k, 1.0, &acc);
  }
  return ops::moe_aux_loss_forward(a.scores, a.counts, n_groups, T, k, cfg.aux_coeff);
}

// global_aux_loss (Megatron-Core's): the micro batch's counts summed over the data
// replicas too, added to the step's running sum, and a.counts replaced by the running
// average over the micro batches so far (the backward reads the same). Returns the data
// replicas, the factor of the tokens T the counts cover.
double MoeMlp::running_global_counts(MoeActs& a, MoeLayerStats* stats) const {
  MTNLG_CHECK(stats, "MoE: global_aux_loss in a forward that keeps no step record (full recompute is refused with it)");
  if (groups.dp) groups.dp->all_reduce(a.counts.raw(), a.counts.numel(), a.counts.dtype(), parallel::ReduceOp::sum);
  const int64_t E = cfg.num_experts;
  Tensor h = a.counts.to(Device::cpu);
  stats->global_counts.resize(static_cast<size_t>(E), 0.0);
  ++stats->global_micro;
  const double m = static_cast<double>(stats->global_micro);
  for (int64_t e = 0; e < E; ++e) {
    double& run = stats->global_counts[static_cast<size_t>(e)];
    if (h.dtype() == DType::f64) {
      run += h.data<double>()[e];
      h.data<double>()[e] = run / m;
    } else {
      run += static_cast<double>(h.data<float>()[e]);
      h.data<float>()[e] = static_cast<float>(run / m);
    }
  }
  a.counts.copy_from(h);
  return static_cast<double>(groups.dp ? groups.dp->size() : 1);
}

// yr = unpermute(W2_e (weight * act(W1_e permute(xr)))).
void MoeMlp::local_experts_forward(Tensor& yr, MoeActs& a, const Tensor& xr, const ops::MoeDispatch& d, const Tensor& w,
                                   const MoeParams& p) const {
  const int64_t H = xr.dim(1), F = cfg.local_ffn(), rows = d.rows;
  a.xp = empty_like_rows(rows, H, xr);
  timed_permute(a.xp, xr, d);
  a.pre = empty_like_rows(rows, swiglu ? 2 * F : F, xr);
  ops::grouped_matmul_forward(a.pre, a.xp, p.w1, nullptr, d.counts);
  a.act = empty_like_rows(rows, F, xr);
  act_forward(swiglu, a.act, a.pre);
  a.aw = empty_like_rows(rows, F, xr);
  ops::moe_weight_rows_forward(a.aw, a.act, w, d);
  Tensor eo = empty_like_rows(rows, H, xr);
  ops::grouped_matmul_forward(eo, a.aw, p.w2, nullptr, d.counts);
  timed_unpermute(yr, eo, d);
}

void MoeMlp::experts_forward(Tensor& out, MoeActs& a, const Tensor& in, const MoeParams& p) const {
  if (groups.exchange())
    exchange_forward(out, a, in, p);
  else
    local_experts_forward(out, a, in, a.d, a.probs, p);
}

// Expert parallelism: this rank's routed rows go to the ep peer holding their expert (by
// expert, token order inside), with their routing weights; with expert tensor parallelism
// the etp ranks then pool what they received, each computes its slice of every expert's
// width for all of it, and the partial outputs are summed back onto the rows' owners.
// The outputs return to the rows' ranks and combine as in one process.
void MoeMlp::exchange_forward(Tensor& out, MoeActs& a, const Tensor& in, const MoeParams& p) const {
  const int64_t H = in.dim(1), El = cfg.local_experts();
  std::optional<Timed> dispatch(t_moe_times.dispatch);
  Tensor xs = empty_like_rows(a.d.rows, H, in), ws = router_rows(a.d.rows, 1, in);
  ops::moe_permute(xs, in, a.d);
  gather_row_weights(ws, a.probs, a.d);
  // ep: the counts per (peer, expert of the peer), then the rows.
  std::vector<int32_t> theirs = swap_counts(a);
  int64_t R = 0;
  for (int64_t c : a.received) R += c;
  Tensor xr = xs, wr = ws;
  if (groups.ep) std::tie(xr, wr) = swap_weighted_rows(*groups.ep, xs, ws, a.sent, a.received);
  // Each received row's local expert, in (peer, expert, token) order, made on the host
  // (where the plan is made; only the etp pooling moves it to the rows' device).
  Tensor idx = Tensor::empty({R, 1}, DType::i32, Device::cpu);
  for (size_t e = 0, r = 0; e < theirs.size(); ++e)
    for (int32_t i = 0; i < theirs[e]; ++i) idx.data<int32_t>()[r++] = static_cast<int32_t>(e % El);
  // etp: every rank of the group gets all of the group's rows.
  Tensor xg = xr, ig = idx;
  a.r_weight = wr;
  if (groups.etp) {
    a.pooled = pool_counts(R, in.device());
    xg = pool_rows(xr, a.pooled, H);
    a.r_weight = pool_rows(wr, a.pooled, 1);
    ig = pool_rows(idx.on(in.device()), a.pooled, 1);
  }
  a.rd = ops::moe_dispatch_plan(ig, nullptr, El, 0).on(in.device());
  Tensor yg = empty_like_rows(a.rd.num_tokens, H, in);
  dispatch.reset();
  local_experts_forward(yg, a, xg, a.rd, a.r_weight, p);
  const Timed combine(t_moe_times.dispatch);
  Tensor yr = groups.etp ? sum_pooled(yg, a.pooled, H) : yg, ys = yr;
  if (groups.ep) {
    ys = empty_like_rows(a.d.rows, H, in);
    swap_rows(*groups.ep, yr, a.received, ys, a.sent, H);
  }
  ops::moe_unpermute(out, ys, a.d);
}

// The rows this rank sends each ep peer (a.sent) and receives from it (a.received), from
// the tokens per (peer, expert of the peer) swapped with every peer; returns what was
// received per (peer, local expert). Without ep: this rank's own counts.
std::vector<int32_t> MoeMlp::swap_counts(MoeActs& a) const {
  const int64_t E = cfg.num_experts, El = cfg.local_experts(), n = E / El;
  std::vector<int32_t> mine(static_cast<size_t>(E)), theirs(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    mine[static_cast<size_t>(e)] = static_cast<int32_t>(a.d.counts[static_cast<size_t>(e)]);
  if (groups.ep) {
    theirs = swap_host_counts(*groups.ep, mine, std::vector<int64_t>(static_cast<size_t>(n), El), a.probs.device());
  } else {
    theirs = mine;
  }
  a.sent.assign(static_cast<size_t>(n), 0);
  a.received.assign(static_cast<size_t>(n), 0);
  for (int64_t e = 0; e < E; ++e) {
    a.sent[static_cast<size_t>(e / El)] += mine[static_cast<size_t>(e)];
    a.received[static_cast<size_t>(e / El)] += theirs[static_cast<size_t>(e)];
  }
  return theirs;
}

// The rows each etp rank brings to the pool.
std::vector<int64_t> MoeMlp::pool_counts(int64_t rows, Device dev) const {
  parallel::Communicator& etp = *groups.etp;
  const auto n = static_cast<size_t>(etp.size());
  const std::vector<int32_t> all =
      swap_host_counts(etp, std::vector<int32_t>(n, static_cast<int32_t>(rows)), std::vector<int64_t>(n, 1), dev);
  return std::vector<int64_t>(all.begin(), all.end());
}

// x [rows, w] of this rank -> [sum(counts), w]: every etp rank's rows, in rank order.
Tensor MoeMlp::pool_rows(const Tensor& x, const std::vector<int64_t>& counts, int64_t w) const {
  parallel::Communicator& etp = *groups.etp;
  const int64_t n = etp.size(), rows = x.dim(0);
  Tensor copies = Tensor::empty({n * rows, w}, x.dtype(), x.device());
  for (int64_t j = 0; j < n; ++j) copies.flat(j * x.numel(), x.numel()).copy_from(x.flat(0, x.numel()));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  Tensor out = Tensor::empty({total, w}, x.dtype(), x.device());
  const Timed t(t_moe_times.exchange);
  etp.all_to_all_v(copies.raw(), std::vector<int64_t>(static_cast<size_t>(n), rows * w), out.raw(), times(counts, w),
                   x.dtype());
  return out;
}

// partial [sum(counts), w], each etp rank's partial sums for the whole pool -> this rank's
// rows [counts[me], w]: its block summed over the etp ranks, in rank order.
Tensor MoeMlp::sum_pooled(const Tensor& partial, const std::vector<int64_t>& counts, int64_t w) const {
  parallel::Communicator& etp = *groups.etp;
  const int64_t n = etp.size(), mine = counts[static_cast<size_t>(etp.rank())];
  Tensor got = Tensor::empty({n * mine, w}, partial.dtype(), partial.device());
  {
    const Timed t(t_moe_times.exchange);
    etp.all_to_all_v(partial.raw(), times(counts, w), got.raw(), std::vector<int64_t>(static_cast<size_t>(n), mine * w),
                     partial.dtype());
  }
  Tensor out = Tensor::empty({mine, w}, partial.dtype(), partial.device());
  ops::copy(out, got.flat(0, mine * w).view({mine, w}));
  for (int64_t j = 1; j < n; ++j) ops::add_inplace(out, got.flat(j * mine * w, mine * w).view({mine, w}));
  return out;
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
                             int64_t seq, double loss_weight, const Tensor* weight_dev) const {
  const int64_t N = in.dim(0), E = cfg.num_experts, k = cfg.router.topk;
  Tensor dlogits = router_side(N, E, in);
  Tensor dp = dprobs;
  if (dprobs.dtype() != dlogits.dtype()) {  // the rows' weights' gradient, widened for the f64 router
    dp = router_side(N, k, in);
    ops::convert(dp, dprobs);
  }
  ops::moe_topk_backward(dlogits, dp, a.logits, a.idx, cfg.router);
  const int64_t parts = groups.seq_parts();
  if (a.scores.defined()) {
    const int64_t n_groups = loss_groups(N, seq);
    Tensor dscores = router_side(N, E, in);
    ops::moe_aux_loss_backward(dscores, a.counts, n_groups, static_cast<double>(N * parts / n_groups), k, cfg.aux_coeff,
                               loss_weight, weight_dev);
    ops::moe_aux_scores_backward(dlogits, dscores, a.logits, cfg.router.score);
  }
  if (cfg.z_coeff > 0)
    ops::moe_z_loss_backward(dlogits, a.logits, cfg.z_coeff / static_cast<double>(parts), loss_weight, weight_dev);
  Tensor dx = empty_like_rows(N, in.dim(1), in);
  const bool jittered = a.router_in.defined();
  ops::moe_router_logits_backward(dx, p.d_router_w, dlogits, jittered ? a.router_in : in, p.router_w);
  if (jittered) ops::moe_jitter(dx, dx, cfg.jitter_eps, a.jitter.key, a.jitter.base, a.jitter.dkey);
  ops::add_inplace(din, dx);
}

// dxr (written) and the routing weights' dw (written) from dyr, through the local experts.
void MoeMlp::local_experts_backward(Tensor& dxr, Tensor& dw, const Tensor& dyr, const MoeActs& a,
                                    const ops::MoeDispatch& d, const Tensor& w, MoeParams& p) const {
  const int64_t H = dyr.dim(1), F = cfg.local_ffn(), rows = d.rows;
  Tensor deo = empty_like_rows(rows, H, dyr);
  timed_permute(deo, dyr, d);
  Tensor daw = empty_like_rows(rows, F, dyr);
  ops::grouped_matmul_backward(&daw, &p.d_w2, nullptr, deo, a.aw, p.w2, d.counts);
  Tensor dact = empty_like_rows(rows, F, dyr);
  ops::moe_weight_rows_backward(dact, dw, daw, a.act, w, d);
  Tensor dpre = empty_like_rows(rows, swiglu ? 2 * F : F, dyr);
  act_backward(swiglu, dpre, dact, a.pre);
  Tensor dxp = empty_like_rows(rows, H, dyr);
  ops::grouped_matmul_backward(&dxp, &p.d_w1, nullptr, dpre, a.xp, p.w1, d.counts);
  timed_unpermute(dxr, dxp, d);
}

// The forward's exchanges in reverse: output gradients to the experts' ranks (pooled over
// etp), input and routing-weight gradients back (summed over etp).
void MoeMlp::exchange_backward(Tensor& din, Tensor& dprobs, const Tensor& dout, const MoeActs& a, MoeParams& p) const {
  const int64_t H = dout.dim(1), rows = a.d.rows, R = a.rd.num_tokens;
  std::optional<Timed> dispatch(t_moe_times.dispatch);
  Tensor dys = empty_like_rows(rows, H, dout);
  ops::moe_permute(dys, dout, a.d);
  Tensor dyr = dys;
  if (groups.ep) {
    int64_t mine = 0;
    for (int64_t c : a.received) mine += c;
    dyr = empty_like_rows(mine, H, dout);
    swap_rows(*groups.ep, dys, a.sent, dyr, a.received, H);
  }
  Tensor dyg = groups.etp ? pool_rows(dyr, a.pooled, H) : dyr;
  Tensor dxg = empty_like_rows(R, H, dout), dwg = router_rows(R, 1, dout);
  dispatch.reset();
  local_experts_backward(dxg, dwg, dyg, a, a.rd, a.r_weight, p);
  const Timed combine(t_moe_times.dispatch);
  Tensor dxr = groups.etp ? sum_pooled(dxg, a.pooled, H) : dxg, dwr = groups.etp ? sum_pooled(dwg, a.pooled, 1) : dwg;
  Tensor dxs = dxr, dws = dwr;
  if (groups.ep) std::tie(dxs, dws) = swap_weighted_rows(*groups.ep, dxr, dwr, a.received, a.sent);
  ops::moe_unpermute(din, dxs, a.d);
  scatter_row_weights(dprobs, dws, a.probs, a.d);
}

void MoeMlp::backward(Tensor& din, const Tensor& dout, const MoeActs& a, const Tensor& in, MoeParams& p, int64_t seq,
                      double loss_weight, const Tensor* weight_dev) const {
  MTNLG_CHECK(a.defined(), "MoE backward without its forward's activations");
  Tensor dprobs = router_rows(in.dim(0), cfg.router.topk, in);
  if (groups.exchange())
    exchange_backward(din, dprobs, dout, a, p);
  else
    local_experts_backward(din, dprobs, dout, a, a.d, a.probs, p);
  if (cfg.shared_ffn > 0) shared_backward(din, dout, a, in, p);
  router_backward(din, dprobs, a, in, p, seq, loss_weight, weight_dev);
}

}  // namespace mtnlg::model
