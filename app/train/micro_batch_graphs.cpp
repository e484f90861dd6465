#include "app/train/micro_batch_graphs.hpp"

#include "core/error.hpp"
#include "core/refused.hpp"
#include "core/log.hpp"
#include "core/mem_account.hpp"
#include "parallel/flight_recorder.hpp"

#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/device.hpp"
#include "core/cuda/step_events.hpp"
#endif

namespace mtnlg::app {

std::string moe_graph_refusal(const MoeConfig& m, int64_t ep, int64_t etp) {
  if (!m.enabled()) return "";
  if (!m.moe_expert_capacity_factor || !m.moe_pad_expert_input_to_capacity)
    return "MoE layers route dropless here, and a dropless dispatch's group sizes are known only on the host after "
           "the routing: set model.moe_expert_capacity_factor and model.moe_pad_expert_input_to_capacity: true "
           "(fixed-size expert groups, which the graphs capture whole), or run eagerly";
  if (ep > 1 || etp > 1)
    return fmt::format(
        "MoE layers under expert_model_parallel_size {} x expert_tensor_parallel_size {}: the rows "
        "travel to the experts' ranks in sizes counted on the host; graphs capture MoE models on one "
        "expert-parallel rank (parallel.expert_model_parallel_size and expert_tensor_parallel_size 1)",
        ep, etp);
  if (m.moe_router_load_balancing_type == MoeLoadBalancing::global_aux_loss)
    return "model.moe_router_load_balancing_type: global_aux_loss keeps the step's running counts on the host "
           "between micro batches: use aux_loss or seq_aux_loss with graphs";
  return "";
}

std::string cuda_graph_refusal(const Recipe& r, Device device, bool observer) {
#ifndef MTNLG_HAVE_CUDA
  (void)r, (void)device, (void)observer;
  return "this mtnlg was built without CUDA";
#else
  if (device != Device::cuda) return "training runs on the CPU here (graphs are a GPU feature)";
  if (r.parallel.pipeline_model_parallel_size != 1)
    return "graphs cover one pipeline stage (parallel.pipeline_model_parallel_size 1): a stage's micro batches "
           "in flight would each need their own graphs and buffers";
  if (observer)
    return "spike forensics and the poison fault watch each layer's output on the host: turn off "
           "training.check_for_nan_in_loss_and_grad and training.loss_spike_threshold";
  return moe_graph_refusal(r.model.moe, r.ep(), r.etp());
#endif
}

#ifdef MTNLG_HAVE_CUDA

struct MicroBatchGraphs::Shape {
  int64_t seen = 0;        // micro batches of this shape so far
  bool eager = false;      // its capture failed: eager from then on
  model::PlacedInputs in;  // what the graphs read: overwritten before every forward launch
  int64_t saved = 0;       // activation bytes between the two graphs
  // Per captured group: the bytes each graph's operations count.
  std::vector<double> fwd_bytes, bwd_bytes;
  // The NCCL operations each graph captured: every launch records them again in the
  // device watchdog's flight recorder, with one probe around the launch.
  std::vector<parallel::CapturedOp> fwd_ops, bwd_ops;
  // Destroyed before the pool they allocate from (members go in reverse order).
  std::unique_ptr<cuda::GraphPool> pool;
  std::unique_ptr<cuda::CudaGraph> fwd, bwd;
};

namespace {
std::vector<double> bytes_of(const std::vector<parallel::Communicator*>& groups) {
  std::vector<double> b;
  for (const parallel::Communicator* c : groups) b.push_back(c->bytes_counted());
  return b;
}
std::vector<double> minus(std::vector<double> a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
  return a;
}
void count_replayed(const std::vector<parallel::Communicator*>& groups, const std::vector<double>& bytes) {
  for (size_t i = 0; i < groups.size(); ++i) groups[i]->count_replayed(bytes[i]);
}
}  // namespace

MicroBatchGraphs::MicroBatchGraphs(model::GptChunk& chunk, std::vector<parallel::Communicator*> groups)
    : chunk_(chunk) {
  for (parallel::Communicator* c : groups)
    if (c && c->size() > 1) groups_.push_back(c);
}
MicroBatchGraphs::~MicroBatchGraphs() = default;

bool MicroBatchGraphs::capture(Shape& sh, int64_t mb_id, const model::TrainMicroBatch& mb) {
  try {
    sh.pool = std::make_unique<cuda::GraphPool>();
    parallel::Watchdog& wd = parallel::device_watchdog();
    wd.take_captured();
    const std::vector<double> b0 = bytes_of(groups_);
    sh.fwd = std::make_unique<cuda::CudaGraph>(*sh.pool, [&] { chunk_.forward(mb_id, mb, sh.in, Tensor()); });
    sh.fwd_ops = wd.take_captured();
    const std::vector<double> b1 = bytes_of(groups_);
    sh.saved = chunk_.saved_bytes();
    sh.bwd = std::make_unique<cuda::CudaGraph>(*sh.pool, [&] { chunk_.backward(mb_id, Tensor()); });
    sh.bwd_ops = wd.take_captured();
    sh.fwd_bytes = minus(b1, b0);
    sh.bwd_bytes = minus(bytes_of(groups_), b1);
    MTNLG_CHECK(sh.pool->live_bytes() == 0,
                "{} bytes allocated during the capture are still held after the backward: a tensor outlived its graph",
                sh.pool->live_bytes());
  } catch (const Refused& e) {
    // The runtime (or a library) declined to capture this work: it runs eagerly. Any other
    // error -- an internal check such as the one above, out of memory -- ends the run.
    chunk_.drop_saved();  // a forward captured without its backward
    sh.bwd.reset();
    sh.fwd.reset();
    sh.pool.reset();
    sh.eager = true;
    note_ = fmt::format("CUDA graphs off for micro batches of {} samples: {}", mb.micro_batch_size, e.what());
    log::warn("{}; they run eagerly", note_);
    return false;
  }
  note_ = fmt::format("CUDA graphs: micro batches of {} samples captured (forward and backward, {:.1f} MiB pool)",
                      mb.micro_batch_size, static_cast<double>(sh.pool->bytes()) / (1 << 20));
  log::info("{}", note_);
  return true;
}

bool MicroBatchGraphs::forward(int64_t mb_id, const model::TrainMicroBatch& mb) {
  if (cuda::op_profile_on()) return false;  // logging.gpu_profile times ops one by one
  const Key key{mb.micro_batch_size, mb.loss_mask != nullptr};
  auto& slot = shapes_[key];
  if (!slot) slot = std::make_unique<Shape>();
  Shape& sh = *slot;
  if (sh.eager || sh.seen++ == 0) return false;  // the first of a shape warms up eagerly
  const model::PlacedInputs host = chunk_.stage_inputs(mb);
  const bool first = !sh.fwd;
  if (first) sh.in = host.empty_like(Device::cuda);
  sh.in.copy_from(host);  // queued before the capture or the launch that reads them
  if (first && !capture(sh, mb_id, mb)) return false;
  pending_counted_ = first;  // a capture counts its collectives' bytes itself
  if (!first) count_replayed(groups_, sh.fwd_bytes);
  parallel::device_watchdog().replay(sh.fwd_ops, cuda::stream(), [&] { sh.fwd->launch(); });
  ++replays_;
  // A replay allocates no tensor: its pool stands for what the eager forward and backward
  // would hold, counted as activations (the caller's role scope) until the backward.
  pool_role_ = mem::on_alloc(sh.pool->bytes());
  last_saved_ = sh.saved;
  pending_ = &sh;
  pending_id_ = mb_id;
  return true;
}

void MicroBatchGraphs::backward(int64_t mb_id) {
  MTNLG_CHECK(pending_ && pending_id_ == mb_id, "backward graph of micro batch {} without its forward graph", mb_id);
  parallel::device_watchdog().replay(pending_->bwd_ops, cuda::stream(), [&] { pending_->bwd->launch(); });
  ++replays_;
  if (!pending_counted_) count_replayed(groups_, pending_->bwd_bytes);
  mem::on_free(pending_->pool->bytes(), pool_role_);
  pending_ = nullptr;
  pending_id_ = -1;
}

#else  // no CUDA: never constructed (cuda_graph_refusal refuses), defined for the link

struct MicroBatchGraphs::Shape {};
MicroBatchGraphs::MicroBatchGraphs(model::GptChunk& chunk, std::vector<parallel::Communicator*> groups)
    : chunk_(chunk) {
  (void)groups;
}
MicroBatchGraphs::~MicroBatchGraphs() = default;
bool MicroBatchGraphs::capture(Shape&, int64_t, const model::TrainMicroBatch&) { return false; }
bool MicroBatchGraphs::forward(int64_t, const model::TrainMicroBatch&) { return false; }
void MicroBatchGraphs::backward(int64_t mb_id) {
  throw_runtime("backward graph of micro batch {} without CUDA", mb_id);
}

#endif

}  // namespace mtnlg::app
