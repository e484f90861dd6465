// Parameters of one pipeline rank, in flat buffers with one element layout, so the
// optimizer, the gradient-norm, the data-parallel buckets and ZeRO-1 sharding all work
// on contiguous ranges. Dtype roles:
//   params()  the fp32 master weights (what the optimizer updates and checkpoints hold)
//   weights() the compute copy the model reads: bf16/f16 under mixed precision, at the
//             same element offsets; the master itself when the compute dtype is the
//             master's (fp32 runs, f64 tests). The optimizer writes it as it steps;
//             sync_weights() rebuilds it after initialisation or a checkpoint load.
//   grads()   fp32 gradients (accumulated by the model's backward). Each parameter records its global
// shape and the slice this tensor-parallel rank holds, which is what checkpoints and
// layout conversion need.
//
// Initialisation is a pure function of (seed, parameter name, global element index):
// every layout draws the same global weights, so a tp=2 run starts from exactly the
// shards of the tp=1 run (layout invariance, docs/ARCHITECTURE.md "Invariants").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace mtnlg::model {

enum class InitKind { normal, normal_scaled_output, zeros, ones };

struct ParamInfo {
  std::string name;        // global name, e.g. "layers.3.attention.qkv.weight"
  Shape shape;             // this rank's shard
  Shape global_shape;      // the whole parameter
  int64_t split_dim = -1;  // dimension sharded over tensor-parallel ranks, -1 replicated
  int64_t split_rank = 0;  // which shard this is
  int64_t split_count = 1;
  // The split dimension is `split_parts` equal parts one after the other, each split over
  // the ranks on its own: a SwiGLU expert's fc1 [gate; up] is 2 parts, and each rank holds
  // its slice of the gate then its slice of the up projection.
  int64_t split_parts = 1;
  int64_t offset = 0;  // element offset in the flat buffers
  int64_t numel = 0;
  InitKind init = InitKind::normal;
  bool weight_decay = true;     // false for biases and norm weights
  bool tp_replicated = false;   // identical on every tp rank (count once in the grad norm)
  bool sp_grad_reduce = false;  // under sequence parallelism its grad is partial per tp rank
  bool tp_grad_reduce = false;  // replicated, but its grad is partial per tp rank always (qk_norm's weights)
  bool word_embedding = false;  // tied between the first and the last stage
  // Dimension 0 is the vocabulary, padded to make_vocab_size_divisible_by x tp: a
  // checkpoint of another tp (another padding) loads its real rows (the word embedding,
  // the untied output layer).
  bool vocab_rows = false;
  // A routed expert's weight (an MoE layer's): it belongs to the expert grid, not the
  // attention grid, and sits after every other parameter in the flat buffers
  // (ParamStore::finalize), so the two regions reduce and shard over their own groups.
  bool expert = false;
};

class ParamStore {
 public:
  // Declares a parameter; buffers are allocated by finalize().
  void add(ParamInfo p);
  // Allocates the master and gradient buffers in `master` and, when `compute` differs,
  // the compute copy (bf16 or f16), all on `dev`. Zero-filled.
  // Routed experts' parameters (ParamInfo::expert) are moved after all the others first,
  // each region keeping the declaration order: [0, expert_offset()) and the experts.
  void finalize(DType master, DType compute, Device dev);
  // Where the experts' region starts (numel() when there is none).
  int64_t expert_offset() const { return expert_offset_; }
  void finalize(DType master = DType::f32) { finalize(master, master, Device::cpu); }
  Device device() const { return params_.device(); }
  // Moves every buffer to `dev` (a model loaded on the host, run on a device).
  void place(Device dev);
  // The compute copy := the master, rounded to nearest even (nothing when they alias).
  void sync_weights();
  // Draws every parameter from N(0, std) (or std/sqrt(2L) for output projections),
  // zeros and ones as declared, from global element indices.
  void initialize(uint64_t seed, double std, int64_t num_layers_total);

  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(const std::string& name) const;
  bool has(const std::string& name) const;
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  Tensor weight(const std::string& name) const;  // the compute copy of a parameter
  Tensor& params() { return params_; }
  Tensor& grads() { return grads_; }
  const Tensor& params() const { return params_; }
  const Tensor& grads() const { return grads_; }
  Tensor& weights() { return weights_; }
  const Tensor& weights() const { return weights_; }
  DType compute_dtype() const { return weights_.dtype(); }
  bool has_compute_copy() const { return weights_.defined() && weights_.raw() != params_.raw(); }
  int64_t numel() const { return total_; }
  void zero_grads();

  // Global element index of local element i of parameter p (row-major in the global shape).
  static int64_t global_index(const ParamInfo& p, int64_t local);

 private:
  std::vector<ParamInfo> infos_;
  Tensor params_, grads_, weights_;
  int64_t total_ = 0;
  int64_t expert_offset_ = 0;
};

// A coordinate along a split dimension (ParamInfo::split_dim) of `parts` parts: this
// shard's `local` (of `extent` local rows) -> the global one, for shard `rank` of `count`.
inline int64_t split_global_coord(int64_t local, int64_t extent, int64_t rank, int64_t count, int64_t parts) {
  const int64_t part_local = extent / parts;
  return (local / part_local) * part_local * count + rank * part_local + local % part_local;
}
// The inverse: the local coordinate of `global` in that shard, -1 when another shard holds it.
inline int64_t split_local_coord(int64_t global, int64_t extent, int64_t rank, int64_t count, int64_t parts) {
  const int64_t part_local = extent / parts, part_global = part_local * count;
  const int64_t part = global / part_global, within = global % part_global;
  if (part >= parts || within / part_local != rank) return -1;
  return part * part_local + within % part_local;
}

// Standard normal for (key, global index) by Box-Muller on two Philox draws.
double normal_draw(uint64_t key, uint64_t index);
uint64_t name_key(uint64_t seed, const std::string& name);

}  // namespace mtnlg::model
