// training.enable_cuda_graph: a micro batch's forward and its backward each run as one
// CUDA graph instead of a few hundred kernel launches (core/cuda/device.hpp, CudaGraph).
//
// Per micro-batch shape (samples, whether a loss mask is used), in this order:
//   1. the first micro batch of the shape runs eagerly: it warms what is made on first
//      use (cuBLASLt algorithms, cuDNN plans, the allocator's free lists);
//   2. the next one is captured: its forward into one graph, then its backward into
//      another, both allocating from one private pool (cuda::GraphPool); nothing runs
//      during the captures, so the two graphs are then launched for this micro batch;
//   3. every later one copies its inputs (token ids, labels, the embedding grouping, the
//      loss gradient and mask: the chunk's model::PlacedInputs, GptChunk::stage_inputs)
//      into the buffers the capture read, and launches the two graphs.
// Kernel arguments are fixed at capture, so everything that changes between micro batches
// must come from device memory: the inputs above do, the step's dropout key and the micro
// batch's first sample among them (the dropout kernels derive their keys and mask offsets
// from those on the device: DeviceKey, core/rng.hpp). The forward and backward graphs share the pool
// and are launched in capture order (the saved activations are pool blocks the forward
// graph writes and the backward graph reads), which the layouts below guarantee.
//
// Covered: one pipeline stage (pipeline parallel size 1, no virtual stages), any tensor
// parallel size (its NCCL collectives run on the compute stream and are captured with the
// rest; a replay counts the bytes they counted at capture), any context parallel size (the
// K/V ring's sends and receives run on side streams that fork from the compute stream
// and join it again by events, which a capture records as graph dependencies; the host
// never waits inside cp attention), MoE layers with fixed-size expert groups on one
// expert-parallel rank (moe_graph_refusal; their plan made on the device, their routing
// record kept there, the MoE losses' weight read from PlacedInputs) and any data parallel size; no
// no spike forensics or poison fault (their layer observer runs host code between layers). With data parallelism the step's last micro batch runs
// eagerly, since its backward starts the gradient reduction bucket by bucket as layers
// finish. Steps that profile op families (logging.gpu_profile) run eagerly. A capture
// the CUDA runtime refuses is reported once and the shape runs eagerly from then on.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/recipe.hpp"
#include "core/mem_account.hpp"
#include "model/gpt.hpp"

namespace mtnlg::app {

// Why training.enable_cuda_graph cannot run this recipe ("" = it can). `device` is where
// training runs, `observer` whether the chunks get a layer observer (forensics, poison).
std::string cuda_graph_refusal(const Recipe& r, Device device, bool observer);
// The MoE part of it: graphs capture MoE layers with fixed-size expert groups (a capacity,
// padded to it) on one expert-parallel rank, balanced by aux_loss, seq_aux_loss or none.
std::string moe_graph_refusal(const MoeConfig& m, int64_t ep, int64_t etp);

class MicroBatchGraphs {
 public:
  // `groups`: the groups whose operations the graphs capture (the chunk's tensor- and
  // context-parallel groups; null entries are skipped): a replay counts their bytes.
  MicroBatchGraphs(model::GptChunk& chunk, std::vector<parallel::Communicator*> groups);
  ~MicroBatchGraphs();
  MicroBatchGraphs(const MicroBatchGraphs&) = delete;
  MicroBatchGraphs& operator=(const MicroBatchGraphs&) = delete;

  // Runs micro batch `mb`'s forward and queues its backward through graphs, or returns
  // false: then the caller runs chunk.forward and chunk.backward itself (warm-up, a shape
  // whose capture failed). After true, backward() launches the backward graph.
  bool forward(int64_t mb_id, const model::TrainMicroBatch& mb);
  void backward(int64_t mb_id);

  // Activation bytes the forward graph leaves for the backward graph (measured at capture).
  int64_t saved_bytes() const { return last_saved_; }
  int64_t replays() const { return replays_; }
  // What happened, for the log: "" until a shape is captured or refused.
  const std::string& note() const { return note_; }

 private:
  struct Shape;
  using Key = std::pair<int64_t, bool>;  // (samples, loss mask)
  bool capture(Shape& sh, int64_t mb_id, const model::TrainMicroBatch& mb);

  model::GptChunk& chunk_;
  std::vector<parallel::Communicator*> groups_;
  std::map<Key, std::unique_ptr<Shape>> shapes_;
  Shape* pending_ = nullptr;  // the shape whose backward graph is due
  int64_t pending_id_ = -1;
  bool pending_counted_ = false;  // its bytes were counted by its capture
  int64_t last_saved_ = 0, replays_ = 0;
  mem::Role pool_role_ = mem::Role::workspace;  // what the pending pool's bytes were counted as
  std::string note_;
};

}  // namespace mtnlg::app
