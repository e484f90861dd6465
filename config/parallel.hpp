// The parallel section of a recipe: the layout, recompute and gradient buckets.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtnlg {

enum class RecomputeGranularity { none, selective, full };
std::string to_string(RecomputeGranularity r);

struct ParallelConfig {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  // Mixture of experts: experts split over expert_model_parallel_size ranks, each expert
  // split over expert_tensor_parallel_size (0 -> tensor_model_parallel_size).
  int64_t expert_model_parallel_size = 1;
  int64_t expert_tensor_parallel_size = 0;
  int64_t num_layers_per_virtual_pipeline_stage = 0;  // 0 = no interleaving
  std::vector<int64_t> pipeline_layers;               // layers per stage; empty = even split
  bool sequence_parallel = false;
  bool use_distributed_optimizer = false;
  RecomputeGranularity recompute_granularity = RecomputeGranularity::none;
  int64_t ddp_bucket_size = 0;  // elements per gradient bucket; 0 = max(40M, 1M*dp)
  // Collective watchdog (parallel/watchdog.hpp): a host-side collective or transfer that
  // waits longer ends the job naming the rank that did not arrive; 0 = off.
  double distributed_timeout_minutes = 10;
  // The NCCL watchdog's liveness service (parallel/liveness.hpp): a rank that sends no
  // heartbeat for this long (its process alive but stopped or unreachable) ends the run;
  // a pause of the whole job (every rank stopped) never counts. 0 = off; otherwise >= 1.
  double heartbeat_timeout_minutes = 10;
};

}  // namespace mtnlg
