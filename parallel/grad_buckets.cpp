// GradBucketer: bucket layout, readiness counting, nonblocking all-reduce per bucket;
// DataParallelGrads: the step's reductions in their order.
#include "parallel/grad_buckets.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/ops.hpp"

namespace mtnlg::parallel {

GradBucketer::GradBucketer(std::vector<GradRange> params, std::shared_ptr<Communicator> dp, int64_t bucket_size)
    : params_(std::move(params)), dp_(std::move(dp)) {
  int64_t expect = 0;
  for (const auto& p : params_) {
    MTNLG_CHECK(p.offset == expect && p.numel >= 0,
                "gradient buckets: parameter at offset {} (numel {}), expected offset {}", p.offset, p.numel, expect);
    expect += p.numel;
  }
  const int64_t n = static_cast<int64_t>(params_.size());
  bucket_of_param_.assign(static_cast<size_t>(n), 0);
  // Reverse declaration order: bucket 0 ends at the end of the buffer.
  int64_t end = expect, filled = 0;
  for (int64_t i = n - 1; i >= 0; --i) {
    bucket_of_param_[static_cast<size_t>(i)] = static_cast<int64_t>(buckets_.size());
    filled += params_[static_cast<size_t>(i)].numel;
    const bool close = i == 0 || (bucket_size > 0 && filled >= bucket_size);
    if (close) {
      const int64_t begin = params_[static_cast<size_t>(i)].offset;
      buckets_.push_back({begin, end - begin});
      end = begin;
      filled = 0;
    }
  }
  remaining_.assign(buckets_.size(), 0);
  started_.assign(buckets_.size(), 0);
  inflight_.resize(buckets_.size());
  param_ready_.assign(static_cast<size_t>(n), 0);
}

void GradBucketer::begin(float* grads) {
  MTNLG_CHECK(!in_step_, "gradient buckets: begin() while the previous step is not finished");
  grads_ = grads;
  in_step_ = true;
  started_early_ = 0;
  std::fill(remaining_.begin(), remaining_.end(), 0);
  for (size_t i = 0; i < params_.size(); ++i) ++remaining_[static_cast<size_t>(bucket_of_param_[i])];
  std::fill(started_.begin(), started_.end(), 0);
  std::fill(param_ready_.begin(), param_ready_.end(), 0);
}

void GradBucketer::mark_ready(int64_t offset, int64_t numel) {
  MTNLG_CHECK(in_step_, "gradient buckets: mark_ready outside a step (call begin first)");
  if (numel == 0) return;
  // First parameter starting at `offset`.
  auto it = std::lower_bound(params_.begin(), params_.end(), offset,
                             [](const GradRange& p, int64_t off) { return p.offset < off; });
  MTNLG_CHECK(it != params_.end() && it->offset == offset, "gradient buckets: range at {} does not start a parameter",
              offset);
  int64_t pos = offset;
  for (; it != params_.end() && pos < offset + numel; ++it) {
    const auto i = static_cast<size_t>(it - params_.begin());
    MTNLG_CHECK(!param_ready_[i], "gradient buckets: parameter at offset {} marked ready twice in one step",
                it->offset);
    param_ready_[i] = 1;
    --remaining_[static_cast<size_t>(bucket_of_param_[i])];
    pos += it->numel;
  }
  MTNLG_CHECK(pos == offset + numel, "gradient buckets: range [{}, {}) does not end at a parameter boundary", offset,
              offset + numel);
  const int64_t before = std::count(started_.begin(), started_.end(), 1);
  start_ready_buckets();
  started_early_ += std::count(started_.begin(), started_.end(), 1) - before;
}

void GradBucketer::start_ready_buckets() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (started_[b] || remaining_[b] != 0) continue;
    started_[b] = 1;
    if (active()) inflight_[b] = dp_->iall_reduce(grads_ + buckets_[b].offset, buckets_[b].numel, ReduceOp::sum);
  }
}

void GradBucketer::finish() {
  MTNLG_CHECK(in_step_, "gradient buckets: finish() outside a step");
  // Whatever was not marked is final now: start it in bucket order, like every peer.
  std::fill(remaining_.begin(), remaining_.end(), 0);
  start_ready_buckets();
  for (auto& r : inflight_)
    if (r) {
      r->wait();
      r.reset();
    }
  in_step_ = false;
}

std::vector<GradRange> DataParallelGrads::ranges(const std::vector<DpParam>& ps) {
  std::vector<GradRange> r;
  r.reserve(ps.size());
  for (const auto& p : ps) r.push_back({p.offset, p.numel});
  return r;
}

namespace {
bool several(const std::shared_ptr<Communicator>& c) { return c && c->size() > 1; }
}  // namespace

DataParallelGrads::DataParallelGrads(std::vector<DpParam> params, const ProcessGroups& groups, bool sequence_parallel,
                                     int64_t bucket_size, std::optional<Zero1Shard> zero1)
    : params_(std::move(params)),
      dp_(groups.grad_group()),
      tp_(groups.tp),
      embedding_(groups.embedding),
      sp_shared_(sequence_parallel && several(groups.tp)),
      tp_shared_(several(groups.tp) &&
                 std::any_of(params_.begin(), params_.end(), [](const DpParam& p) { return p.tp_partial; })),
      emb_shared_(groups.topo.pp() > 1 && several(groups.embedding)),
      zero1_(several(groups.grad_group()) ? std::move(zero1) : std::nullopt),
      bucketer_(ranges(params_), zero1_ ? nullptr : groups.grad_group(), bucket_size) {
  deferred_.reserve(params_.size());
  for (const auto& p : params_) deferred_.push_back((p.word_embedding && emb_shared_) || tp_partial(p));
  if (zero1_) {
    const int64_t padded = zero1_->buffer.numel(), n = dp_->size();
    MTNLG_CHECK(zero1_->buffer.dtype() == DType::f32 && padded % n == 0 && zero1_->shard_begin <= zero1_->shard_end &&
                    zero1_->shard_end - zero1_->shard_begin <= padded / n,
                "ZeRO-1: a buffer of {} elements does not hold {} equal shards of [{}, {})", padded, n,
                zero1_->shard_begin, zero1_->shard_end);
  }
}

void DataParallelGrads::begin(Tensor& grads) {
  if (!active()) return;
  MTNLG_CHECK(!in_step_, "data-parallel gradients: begin() while the previous step is not finished");
  MTNLG_CHECK(grads.dtype() == DType::f32, "data-parallel gradients must be f32, got {}", to_string(grads.dtype()));
  grads_ = grads;
  if (overlapped())
    bucketer_.begin(static_cast<float*>(grads.raw()));  // device memory: only the communicator touches it
  in_step_ = true;
}

void DataParallelGrads::param_ready(int64_t offset) {
  if (!in_step_ || !overlapped()) return;
  auto it = std::lower_bound(params_.begin(), params_.end(), offset,
                             [](const DpParam& p, int64_t off) { return p.offset < off; });
  MTNLG_CHECK(it != params_.end() && it->offset == offset, "data-parallel gradients: no parameter starts at offset {}",
              offset);
  if (!deferred_[static_cast<size_t>(it - params_.begin())] && it->numel > 0)
    bucketer_.mark_ready(it->offset, it->numel);
}

// The tp-partial gradients over tp (in parameter order), then the tied word
// embedding between the first and the last stage.
void DataParallelGrads::reduce_shared() {
  if (sp_shared_ || tp_shared_)
    for (const auto& p : params_)
      if (tp_partial(p) && p.numel > 0)
        tp_->all_reduce(grads_.flat(p.offset, p.numel).raw(), p.numel, DType::f32, ReduceOp::sum);
  if (emb_shared_)
    for (const auto& p : params_)
      if (p.word_embedding && p.numel > 0)
        embedding_->all_reduce(grads_.flat(p.offset, p.numel).raw(), p.numel, DType::f32, ReduceOp::sum);
}

// ZeRO-1: the whole buffer, zero-padded to dp equal shards, reduce-scattered so that
// this rank's shard of `grads_` holds the sum over dp.
void DataParallelGrads::reduce_scatter_shard() {
  Tensor& buf = zero1_->buffer;
  const int64_t numel = grads_.numel(), padded = buf.numel();
  MTNLG_CHECK(numel <= padded, "ZeRO-1: gradient buffer of {} elements, the shard buffer holds {}", numel, padded);
  const int64_t shard = padded / dp_->size(), mine = dp_->rank() * shard;
  const int64_t begin = zero1_->shard_begin, len = zero1_->shard_end - zero1_->shard_begin;
  Tensor head = buf.flat(0, numel), pad = buf.flat(numel, padded - numel);
  ops::copy(head, grads_);
  ops::fill(pad, 0.0);
  dp_->reduce_scatter(buf.raw(), buf.flat(mine, shard).raw(), shard, DType::f32);
  Tensor dst = grads_.flat(begin, len);
  ops::copy(dst, buf.flat(mine, len));
}

void DataParallelGrads::finish() {
  if (!in_step_) return;
  reduce_shared();
  if (overlapped()) bucketer_.finish();
  if (zero1_) reduce_scatter_shard();
  grads_ = Tensor();
  in_step_ = false;
}

}  // namespace mtnlg::parallel
