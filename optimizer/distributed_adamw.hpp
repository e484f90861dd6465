// Global gradient-norm clipping and AdamW, with or without ZeRO-1 (Megatron's
// distributed optimizer), over the flat parameter and gradient buffers of one rank
// (model/params.hpp lays them out). The gradients arrive reduced over the data-parallel
// group by parallel::DataParallelGrads (parallel/grad_buckets.hpp), the one owner of
// that reduction:
// Without ZeRO-1: the whole buffer is summed over dp, and every rank updates all of it.
// With ZeRO-1: the buffer is split into dp equal shards (shard_begin/shard_end); rank r's
// shard r is summed over dp (DataParallelGrads reduce-scatters it through this
// optimizer's zero1_buffer), rank r updates only that shard (Adam m and v exist only for
// it), then the parameters are all-gathered.
//
// Gradients arrive already scaled so that their sum over data-parallel ranks is the
// gradient of the batch-mean loss (the model weights each token by 1/global tokens).
//
// Grad norm: each element counts once in the whole job: segments marked
// `count_in_norm` (tp-replicated params only on tp rank 0, the last stage's copy of
// the tied embedding not at all) summed, then all-reduced over the model-parallel
// group (and the data-parallel group for ZeRO shards). clip coeff = max/(norm+1e-6).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "optimizer/config.hpp"
#include "core/ops.hpp"
#include "core/tensor.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::optimizer {

// A parameter tensor's run of the flat buffers: offset, numel and weight decay as the
// update takes them, plus whether the gradient norm counts it on this rank.
struct ParamSegment : ops::AdamWSegment {
  bool count_in_norm = true;
};

struct StepResult {
  double grad_norm = 0;  // before clipping
  bool skipped = false;  // non-finite gradient: no update was made
};

class DistributedAdamW {
 public:
  // The optimizer state (Adam m and v, fp32) and the ZeRO-1 buffer live on `dev`, the
  // device of the parameter buffers.
  DistributedAdamW(const AdamWConfig& cfg, std::vector<ParamSegment> segments, int64_t numel,
                   const parallel::ProcessGroups& groups, bool zero1, int64_t bucket_size, Device dev = Device::cpu);

  // Clips the reduced `grads`, updates `params` (the fp32 master) with learning rate
  // `lr` and writes the compute copy `weights` (bf16/f16, or the master itself).
  // `loss_scale`: the gradients are the loss gradient times it (fp16); the norm is
  // reported and clipped unscaled and the update divides it out. A non-finite norm on
  // any rank skips the step everywhere (the fp16 overflow check). Reads the norm from the
  // device once: grad_norm_sq + apply for a caller with nothing else to read.
  StepResult step(Tensor& params, Tensor& grads, double lr, Tensor* weights = nullptr, double loss_scale = 1.0);

  // The same step in two parts, for the trainer, which reads the norm together with
  // the loss in its one host round trip per step:
  // acc (f64 [1], on the device) := the squared gradient norm of the whole model (each
  // element counted once), reduced over the model-parallel group (and dp under ZeRO-1)
  // on the device. Collective.
  void grad_norm_sq(const Tensor& grads, Tensor& acc);
  // Clips with `grad_norm_scaled` (the norm of the gradients as they are, loss scale
  // included) and updates. `skip`: a non-finite norm or loss somewhere in the job (the
  // caller agreed on it across ranks): no update. Not collective without ZeRO-1.
  StepResult apply(Tensor& params, Tensor& grads, double lr, Tensor* weights, double loss_scale,
                   double grad_norm_scaled, bool skip);

  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }
  bool zero1() const { return zero1_; }
  // Elements per dp gradient bucket (the recipe's, or Megatron's default): DataParallelGrads takes it from here.
  int64_t bucket_size() const { return bucket_size_; }
  // This rank's optimizer shard [shard_begin, shard_end) of the flat buffer (whole buffer without ZeRO-1).
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }
  // ZeRO-1: the padded f32 buffer of dp equal shards (the gradients' reduce-scatter and
  // the parameters' all-gather go through it); undefined without ZeRO-1.
  Tensor& zero1_buffer() { return gather_buf_; }
  Tensor& exp_avg() { return m_; }
  Tensor& exp_avg_sq() { return v_; }
  // Bytes of optimizer state this rank holds (fp32 m and v).
  int64_t state_bytes() const { return m_.nbytes() + v_.nbytes(); }

 private:
  AdamWConfig cfg_;
  std::vector<ParamSegment> segments_;
  std::vector<std::pair<int64_t, int64_t>> norm_ranges_;  // [begin, end) counted in the gradient norm
  int64_t numel_, padded_, shard_begin_ = 0, shard_end_ = 0, bucket_size_;
  parallel::ProcessGroups groups_;
  bool zero1_;
  int64_t step_ = 0;
  Tensor m_, v_;
  Tensor gather_buf_;  // ZeRO-1: padded copy of params / grads for the collectives (zero1_buffer)
  Device dev_;
};

}  // namespace mtnlg::optimizer
