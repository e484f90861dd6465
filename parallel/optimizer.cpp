#include "parallel/optimizer.hpp"

#include <cmath>
#include <cstring>

#include "core/mem_account.hpp"
#include "core/ops.hpp"

namespace mtnlg::parallel {

DistributedAdamW::DistributedAdamW(const OptimizerConfig& cfg, std::vector<ParamSegment> segments, int64_t numel,
                                   const ProcessGroups& groups, bool zero1, int64_t bucket_size)
    : cfg_(cfg), segments_(std::move(segments)), numel_(numel), bucket_size_(bucket_size), groups_(groups), zero1_(zero1) {
  int64_t dp = groups_.dp ? groups_.dp->size() : 1;
  if (dp == 1) zero1_ = false;  // nothing to shard
  if (bucket_size_ <= 0) bucket_size_ = std::max<int64_t>(40'000'000, 1'000'000 * dp);  // Megatron's default
  if (zero1_) {
    int64_t shard = (numel_ + dp - 1) / dp;
    padded_ = shard * dp;
    int64_t r = groups_.dp->rank();
    shard_begin_ = std::min(numel_, r * shard);
    shard_end_ = std::min(numel_, (r + 1) * shard);
    gather_buf_ = Tensor::zeros({padded_});
  } else {
    padded_ = numel_;
    shard_begin_ = 0;
    shard_end_ = numel_;
  }
  mem::RoleScope role(mem::Role::optimizer);  // the ZeRO-1 gather buffer above stays workspace
  m_ = Tensor::zeros({shard_end_ - shard_begin_});
  v_ = Tensor::zeros({shard_end_ - shard_begin_});
}

void DistributedAdamW::reduce_gradients(Tensor& grads) {
  auto* dp = groups_.dp.get();
  if (!dp || dp->size() == 1 || !zero1_) return;  // without ZeRO-1 the caller's DataParallelGrads reduced them
  float* g = grads.data<float>();
  // Reduce-scatter into this rank's shard (padded so every shard has the same size).
  int64_t shard = padded_ / dp->size();
  float* buf = gather_buf_.data<float>();
  std::memcpy(buf, g, static_cast<size_t>(numel_) * sizeof(float));
  std::memset(buf + numel_, 0, static_cast<size_t>(padded_ - numel_) * sizeof(float));
  dp->reduce_scatter(buf, buf + dp->rank() * shard, shard);
  std::memcpy(g + shard_begin_, buf + dp->rank() * shard, static_cast<size_t>(shard_end_ - shard_begin_) * sizeof(float));
}

double DistributedAdamW::local_norm_sq(const Tensor& grads, int64_t begin, int64_t end) const {
  double s = 0;
  for (auto& seg : segments_) {
    if (!seg.count_in_norm) continue;
    int64_t b = std::max(begin, seg.offset), e = std::min(end, seg.offset + seg.numel);
    if (b >= e) continue;
    s += ops::sum_squares(grads.flat(b, e - b));
  }
  return s;
}

StepResult DistributedAdamW::step(Tensor& params, Tensor& grads, double lr, Tensor* weights, double loss_scale) {
  MTNLG_CHECK(params.numel() == numel_ && grads.numel() == numel_, "optimizer buffers of {} / {} elements, expected {}",
              params.numel(), grads.numel(), numel_);
  reduce_gradients(grads);
  StepResult res;
  double sq = local_norm_sq(grads, shard_begin_, shard_end_);
  if (groups_.mp && groups_.mp->size() > 1) groups_.mp->all_reduce(&sq, 1, ReduceOp::sum);
  if (zero1_) groups_.dp->all_reduce(&sq, 1, ReduceOp::sum);
  res.grad_norm = std::sqrt(sq) / loss_scale;
  // Skipping must be unanimous: replicas that updated while another skipped would
  // silently diverge. (Normally the dp reduction already spreads a NaN everywhere.)
  int64_t nonfinite = std::isfinite(res.grad_norm) ? 0 : 1;
  if (groups_.world && groups_.world->size() > 1) groups_.world->all_reduce(&nonfinite, 1, ReduceOp::max);
  if (nonfinite) {
    res.skipped = true;
    return res;
  }
  double coeff = 1.0;
  if (cfg_.clip_grad > 0) coeff = std::min(1.0, cfg_.clip_grad / (res.grad_norm + 1e-6));
  ++step_;
  // The compute copy is written with the update, segment by segment; under ZeRO-1 this
  // rank updates only its shard, so the whole copy is rebuilt after the all-gather.
  const bool copy = weights && weights->defined() && weights->raw() != params.raw();
  if (copy) MTNLG_CHECK(weights->numel() == numel_, "optimizer: compute copy of {} elements, expected {}", weights->numel(), numel_);
  for (auto& seg : segments_) {
    int64_t b = std::max(shard_begin_, seg.offset), e = std::min(shard_end_, seg.offset + seg.numel);
    if (b >= e) continue;
    Tensor p = params.flat(b, e - b), g = grads.flat(b, e - b);
    Tensor m = m_.flat(b - shard_begin_, e - b), v = v_.flat(b - shard_begin_, e - b);
    ops::AdamWParams ap{lr, cfg_.adam_beta1, cfg_.adam_beta2, cfg_.adam_eps, seg.weight_decay ? cfg_.weight_decay : 0.0,
                        step_, coeff / loss_scale};
    Tensor w = copy && !zero1_ ? weights->flat(b, e - b) : Tensor();
    ops::adamw_step(p, g, m, v, ap, w.defined() ? &w : nullptr);
  }
  if (zero1_) {
    auto* dp = groups_.dp.get();
    int64_t shard = padded_ / dp->size();
    float* buf = gather_buf_.data<float>();
    std::memcpy(buf + dp->rank() * shard, params.data<float>() + shard_begin_,
                static_cast<size_t>(shard_end_ - shard_begin_) * sizeof(float));
    dp->all_gather(buf + dp->rank() * shard, buf, shard);
    std::memcpy(params.data<float>(), buf, static_cast<size_t>(numel_) * sizeof(float));
    if (copy) ops::convert(*weights, params);
  }
  return res;
}

}  // namespace mtnlg::parallel
