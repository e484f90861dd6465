// Data-parallel gradient buckets reduced as soon as they are ready (the overlap of
// Megatron's DistributedDataParallel, for the CPU/MPI path; not used with ZeRO-1, which
// keeps one reduce-scatter after the backward).
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

// The one owner of data-parallel gradient reduction without ZeRO-1 (whose optimizer
// reduce-scatters on its own): the bucket layout over the flat fp32 gradient buffer,
// which parameters are final during the backward, and the overlap. The model reports
// each parameter whose gradient is final for the step (its chunk's last micro batch
// has passed that layer backwards: GptChunk's grad-ready hook), so a full bucket starts
// its all-reduce while the backward of earlier layers goes on. `deferred` parameters
// are changed after the backward by other reductions (the tied word embedding between
// first and last stage, sequence-parallel partial gradients over tp): only finish()
// reduces their buckets, after those. Inactive (nothing communicated) when dp is 1.
struct DpParam {
  int64_t offset = 0, numel = 0;
  bool deferred = false;
};

class DataParallelGrads {
 public:
  DataParallelGrads(std::vector<DpParam> params, std::shared_ptr<Communicator> dp, int64_t bucket_size);

  bool active() const { return bucketer_.active(); }
  // A step over `grads` (f32, the whole flat buffer).
  void begin(Tensor& grads);
  // The gradient of the parameter starting at `offset` is final for this step. Deferred
  // parameters, and every call on an inactive object, are ignored.
  void param_ready(int64_t offset);
  // Starts what was not started and waits: the gradients are summed over dp.
  void finish();

  int64_t num_buckets() const { return bucketer_.num_buckets(); }
  int64_t started_early() const { return bucketer_.started_early(); }

 private:
  static std::vector<GradRange> ranges(const std::vector<DpParam>& ps);
  std::vector<DpParam> params_;
  GradBucketer bucketer_;
  bool in_step_ = false;
};

}  // namespace mtnlg::parallel
