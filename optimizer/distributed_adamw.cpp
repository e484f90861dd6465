#include "optimizer/distributed_adamw.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/mem_account.hpp"
#include "core/ops.hpp"

namespace mtnlg::optimizer {

DistributedAdamW::DistributedAdamW(const AdamWConfig& cfg, std::vector<ParamSegment> segments, int64_t numel,
                                   const parallel::ProcessGroups& groups, bool zero1, int64_t bucket_size, Device dev)
    : cfg_(cfg),
      segments_(std::move(segments)),
      numel_(numel),
      bucket_size_(bucket_size),
      groups_(groups),
      zero1_(zero1),
      dev_(dev) {
  // The update takes its segments in buffer order.
  std::sort(segments_.begin(), segments_.end(),
            [](const ParamSegment& a, const ParamSegment& b) { return a.offset < b.offset; });
  int64_t dp = groups_.grad_group() ? groups_.grad_group()->size() : 1;
  if (dp == 1) zero1_ = false;                                                          // nothing to shard
  if (bucket_size_ <= 0) bucket_size_ = std::max<int64_t>(40'000'000, 1'000'000 * dp);  // Megatron's default
  auto zeros = [&](int64_t n) {
    Tensor t = Tensor::empty({n}, DType::f32, dev_);
    ops::fill(t, 0.0);
    return t;
  };
  if (zero1_) {
    int64_t shard = (numel_ + dp - 1) / dp;
    padded_ = shard * dp;
    int64_t r = groups_.grad_group()->rank();
    shard_begin_ = std::min(numel_, r * shard);
    shard_end_ = std::min(numel_, (r + 1) * shard);
    gather_buf_ = zeros(padded_);
  } else {
    padded_ = numel_;
    shard_begin_ = 0;
    shard_end_ = numel_;
  }
  // The gradient norm's ranges: the counted segments clipped to this rank's part, runs of
  // adjacent ones merged, so the norm is a few launches however many parameters there are.
  for (const auto& seg : segments_) {
    if (!seg.count_in_norm) continue;
    const int64_t b = std::max(shard_begin_, seg.offset), e = std::min(shard_end_, seg.offset + seg.numel);
    if (b >= e) continue;
    if (!norm_ranges_.empty() && norm_ranges_.back().second == b)
      norm_ranges_.back().second = e;
    else
      norm_ranges_.emplace_back(b, e);
  }
  mem::RoleScope role(mem::Role::optimizer);  // the ZeRO-1 gather buffer above stays workspace
  m_ = zeros(shard_end_ - shard_begin_);
  v_ = zeros(shard_end_ - shard_begin_);
}

void DistributedAdamW::grad_norm_sq(const Tensor& grads, Tensor& acc) {
  // The squared norm of this rank's part first (each element counted once in the job),
  // then summed over the model-parallel group, and over dp for ZeRO shards.
  MTNLG_CHECK(acc.numel() == 1 && acc.dtype() == DType::f64, "grad_norm_sq: acc must be f64 [1]");
  ops::fill(acc, 0.0);
  for (const auto& [b, e] : norm_ranges_) ops::sum_squares_accumulate(acc, grads.flat(b, e - b));
  if (groups_.mp && groups_.mp->size() > 1) groups_.mp->all_reduce(acc.raw(), 1, DType::f64, parallel::ReduceOp::sum);
  if (zero1_) groups_.grad_group()->all_reduce(acc.raw(), 1, DType::f64, parallel::ReduceOp::sum);
}

StepResult DistributedAdamW::step(Tensor& params, Tensor& grads, double lr, Tensor* weights, double loss_scale) {
  MTNLG_CHECK(grads.numel() == numel_, "optimizer: gradient buffer of {} elements, expected {}", grads.numel(), numel_);
  Tensor acc = Tensor::empty({1}, DType::f64, grads.device());
  grad_norm_sq(grads, acc);
  const double norm = std::sqrt(acc.to(Device::cpu).data<double>()[0]);
  // Skipping must be unanimous: replicas that updated while another skipped would
  // silently diverge. (Normally the dp reduction already spreads a NaN everywhere.)
  int64_t nonfinite = std::isfinite(norm) ? 0 : 1;
  if (groups_.world && groups_.world->size() > 1) groups_.world->all_reduce(&nonfinite, 1, parallel::ReduceOp::max);
  return apply(params, grads, lr, weights, loss_scale, norm, nonfinite != 0);
}

StepResult DistributedAdamW::apply(Tensor& params, Tensor& grads, double lr, Tensor* weights, double loss_scale,
                                   double grad_norm_scaled, bool skip) {
  MTNLG_CHECK(params.numel() == numel_ && grads.numel() == numel_, "optimizer buffers of {} / {} elements, expected {}",
              params.numel(), grads.numel(), numel_);
  StepResult res;
  res.grad_norm = grad_norm_scaled / loss_scale;
  if (skip || !std::isfinite(res.grad_norm)) {
    res.skipped = true;
    return res;
  }
  double coeff = 1.0;
  if (cfg_.clip_grad > 0) coeff = std::min(1.0, cfg_.clip_grad / (res.grad_norm + 1e-6));
  ++step_;
  // One update over this rank's part [shard_begin_, shard_end_) of the flat buffers (all
  // of it without ZeRO-1): the segments clipped to it, offsets relative to its start (m
  // and v hold just that part). The compute copy is written with the update; under
  // ZeRO-1 this rank updates only its shard, so the whole copy is rebuilt after the
  // all-gather.
  const bool copy = weights && weights->defined() && weights->raw() != params.raw();
  if (copy)
    MTNLG_CHECK(weights->numel() == numel_, "optimizer: compute copy of {} elements, expected {}", weights->numel(),
                numel_);
  std::vector<ops::AdamWSegment> part;
  part.reserve(segments_.size());
  for (const auto& seg : segments_) {
    const int64_t b = std::max(shard_begin_, seg.offset), e = std::min(shard_end_, seg.offset + seg.numel);
    if (b < e) part.push_back({b - shard_begin_, e - b, seg.weight_decay});
  }
  const int64_t len = shard_end_ - shard_begin_;
  if (len > 0) {
    Tensor p = params.flat(shard_begin_, len), g = grads.flat(shard_begin_, len);
    Tensor m = m_.flat(0, len), v = v_.flat(0, len);
    Tensor w = copy && !zero1_ ? weights->flat(shard_begin_, len) : Tensor();
    const ops::AdamWParams ap{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay, step_, coeff / loss_scale};
    ops::adamw_flat(p, g, m, v, ap, part, w.defined() ? &w : nullptr);
  }
  if (zero1_) {
    auto* dp = groups_.grad_group().get();
    const int64_t shard = padded_ / dp->size(), mine = dp->rank() * shard, len = shard_end_ - shard_begin_;
    Tensor slot = gather_buf_.flat(mine, len);
    ops::copy(slot, params.flat(shard_begin_, len));
    dp->all_gather(gather_buf_.flat(mine, shard).raw(), gather_buf_.raw(), shard, DType::f32);
    ops::copy(params, gather_buf_.flat(0, numel_));
    if (copy) ops::convert(*weights, params);
  }
  return res;
}

}  // namespace mtnlg::optimizer
