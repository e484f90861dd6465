// Data-parallel gradient reduction: the gradient buckets reduced as soon as they are
// ready (the overlap of Megatron's DistributedDataParallel), and DataParallelGrads, the
// one owner of every reduction a step's gradients go through before the optimizer.
//
// The flat gradient buffer (model/params.hpp) is cut into buckets of whole parameters,
// walking the parameters in REVERSE declaration order (the backward produces the last
// layers' gradients first), closing a bucket once it holds >= bucket_size elements; a
// bucket is one contiguous range of the buffer. The caller marks ranges whose
// gradients are final for this step (mark_ready); a bucket whose parameters are all
// ready is all-reduced (sum) over dp at once with a nonblocking all-reduce, so the
// reduction runs while the backward of earlier layers/chunks continues. finish()
// launches whatever was not marked and waits for every bucket.
//
// Collective-order invariant: every dp rank of a group must start its buckets in the
// same order. The ranks of one dp group run the same schedule on the same layers, so
// they make the same mark_ready calls in the same order; buckets that become ready in
// one call are started lowest index first.
//
// Determinism: the bucket boundaries are a function of the parameter layout and
// bucket_size only, so the same layout sums the same element ranges in the same
// collectives every run. The bytes equal a single all-reduce of the buffer (the ring
// model is linear in size).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/tensor.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::parallel {

struct GradRange {
  int64_t offset = 0, numel = 0;
};

class GradBucketer {
 public:
  // `params`: every parameter's range in declaration order, tiling [0, total) without
  // gaps or overlaps (RuntimeError otherwise). `dp` may be nullptr or of size 1: then
  // nothing is ever communicated. bucket_size <= 0 means one bucket.
  GradBucketer(std::vector<GradRange> params, std::shared_ptr<Communicator> dp, int64_t bucket_size);

  // Starts a step over `grads` (the whole flat buffer): nothing ready, nothing in flight.
  // RuntimeError if the previous step was not finished.
  void begin(float* grads);
  // The gradients of [offset, offset + numel) are final for this step. The range must
  // consist of whole parameters not marked before in this step (RuntimeError).
  void mark_ready(int64_t offset, int64_t numel);
  void mark_ready(const GradRange& r) { mark_ready(r.offset, r.numel); }
  // Starts the buckets not started yet (lowest index first) and waits for all of them.
  void finish();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  const std::vector<GradRange>& buckets() const { return buckets_; }
  // Buckets of the last step started by mark_ready, i.e. before finish().
  int64_t started_early() const { return started_early_; }
  bool active() const { return dp_ && dp_->size() > 1; }

 private:
  void start_ready_buckets();

  std::vector<GradRange> params_;
  std::shared_ptr<Communicator> dp_;
  std::vector<GradRange> buckets_;
  std::vector<int64_t> bucket_of_param_;
  std::vector<int64_t> remaining_;  // per bucket: parameters not ready yet
  std::vector<char> param_ready_;
  std::vector<std::unique_ptr<Request>> inflight_;  // per bucket, null until started
  std::vector<char> started_;
  float* grads_ = nullptr;
  bool in_step_ = false;
  int64_t started_early_ = 0;
};

// The one owner of a step's gradient reductions, in this order:
//   1. during the backward (without ZeRO-1): the model reports each parameter whose
//      gradient is final for the step (its chunk's last micro batch has passed that
//      layer backwards: GptChunk's grad-ready hook, param_ready here), and a full bucket
//      starts its all-reduce over dp while the backward of earlier layers goes on;
//   2. finish(), after the last backward: the shared gradients, changed by reductions
//      outside dp: tp-partial gradients (sequence-parallel ones, and the replicated
//      weights that each tp rank applies to its own heads) all-reduced over tp, then the
//      tied word embedding between the first and the last stage (the embedding group).
//      Their parameters are "deferred": their buckets start only after this;
//   3. finish() then completes dp: without ZeRO-1 it starts the buckets not started yet
//      and waits for all; with ZeRO-1 it reduce-scatters the whole buffer so this rank's
//      shard holds the sum over dp (the rest of the buffer is not reduced; the optimizer
//      reads and updates only the shard).
// Nothing is communicated for a group of one.
struct DpParam {
  int64_t offset = 0, numel = 0;
  bool word_embedding = false;  // the tied word embedding (first and last stage)
  bool sp_partial = false;      // under sequence parallelism its gradient is partial per tp rank
  bool tp_partial = false;      // its gradient is partial per tp rank whatever the parallelism
};

// ZeRO-1: this rank's shard [shard_begin, shard_end) of the flat buffer and the padded
// f32 buffer of dp equal shards the reduce-scatter goes through (the optimizer's, which
// its parameter all-gather reuses: DistributedAdamW::zero1_buffer).
struct Zero1Shard {
  int64_t shard_begin = 0, shard_end = 0;
  Tensor buffer;
};

class DataParallelGrads {
 public:
  // `zero1`: reduce-scatter into the shard instead of all-reducing buckets.
  DataParallelGrads(std::vector<DpParam> params, const ProcessGroups& groups, bool sequence_parallel,
                    int64_t bucket_size, std::optional<Zero1Shard> zero1 = std::nullopt);

  // Whether any reduction runs (some group of the step has more than one rank).
  bool active() const { return overlapped() || zero1_ || sp_shared_ || tp_shared_ || emb_shared_; }
  // A step over `grads` (f32, the whole flat buffer).
  void begin(Tensor& grads);
  // The gradient of the parameter starting at `offset` is final for this step. Deferred
  // parameters, and every call without overlapped buckets, are ignored.
  void param_ready(int64_t offset);
  // The shared gradients, then the rest of dp, waited for (the order above).
  void finish();

  // The overlapped buckets (0 under ZeRO-1 or without dp) and how many of them the last
  // step started before finish().
  int64_t overlapped_buckets() const { return overlapped() ? bucketer_.num_buckets() : 0; }
  int64_t started_early() const { return overlapped() ? bucketer_.started_early() : 0; }

 private:
  bool overlapped() const { return bucketer_.active(); }
  static std::vector<GradRange> ranges(const std::vector<DpParam>& ps);
  void reduce_shared();
  void reduce_scatter_shard();

  std::vector<DpParam> params_;
  std::vector<char> deferred_;  // per parameter
  std::shared_ptr<Communicator> dp_, tp_, embedding_;
  bool sp_shared_ = false, tp_shared_ = false, emb_shared_ = false;
  bool tp_partial(const DpParam& p) const { return (p.sp_partial && sp_shared_) || (p.tp_partial && tp_shared_); }
  std::optional<Zero1Shard> zero1_;
  GradBucketer bucketer_;
  Tensor grads_;
  bool in_step_ = false;
};

}  // namespace mtnlg::parallel
