// Parameters of one pipeline rank, in one flat fp32 buffer (weights) and a twin flat
// buffer (gradients), so the optimizer, the gradient-norm, the data-parallel buckets and
// ZeRO-1 sharding all work on contiguous ranges. Each parameter records its global
// shape and the slice this tensor-parallel rank holds, which is what checkpoints and
// layout conversion need.
//
// Initialisation is a pure function of (seed, parameter name, global element index):
// every layout draws the same global weights, so a tp=2 run starts from exactly the
// shards of the tp=1 run (DESIGN.md invariant 1).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace mtnlg::model {

enum class InitKind { normal, normal_scaled_output, zeros, ones };

struct ParamInfo {
  std::string name;      // global name, e.g. "layers.3.attention.qkv.weight"
  Shape shape;           // this rank's shard
  Shape global_shape;    // the whole parameter
  int64_t split_dim = -1;  // dimension sharded over tensor-parallel ranks, -1 replicated
  int64_t split_rank = 0;  // which shard this is
  int64_t split_count = 1;
  int64_t offset = 0;      // element offset in the flat buffers
  int64_t numel = 0;
  InitKind init = InitKind::normal;
  bool weight_decay = true;      // false for biases and norm weights
  bool tp_replicated = false;    // identical on every tp rank (count once in the grad norm)
  bool sp_grad_reduce = false;   // under sequence parallelism its grad is partial per tp rank
  bool word_embedding = false;   // tied between the first and the last stage
};

class ParamStore {
 public:
  // Declares a parameter; buffers are allocated by finalize().
  void add(ParamInfo p);
  void finalize(DType dt = DType::f32);
  // Draws every parameter from N(0, std) (or std/sqrt(2L) for output projections),
  // zeros and ones as declared, from global element indices.
  void initialize(uint64_t seed, double std, int64_t num_layers_total);

  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(const std::string& name) const;
  bool has(const std::string& name) const;
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  Tensor& params() { return params_; }
  Tensor& grads() { return grads_; }
  const Tensor& params() const { return params_; }
  const Tensor& grads() const { return grads_; }
  int64_t numel() const { return total_; }
  void zero_grads();

  // Global element index of local element i of parameter p (row-major in the global shape).
  static int64_t global_index(const ParamInfo& p, int64_t local);

 private:
  std::vector<ParamInfo> infos_;
  Tensor params_, grads_;
  int64_t total_ = 0;
};

// Standard normal for (key, global index) by Box-Muller on two Philox draws.
double normal_draw(uint64_t key, uint64_t index);
uint64_t name_key(uint64_t seed, const std::string& name);

}  // namespace mtnlg::model
