// The parallel section of a recipe: the layout, recompute and gradient buckets.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtnlg {

enum class RecomputeGranularity { none, selective, full };
std::string to_string(RecomputeGranularity r);

// How the ranks of a context-parallel group share attention (docs/specs/context-parallel.md):
// a ring passing K/V blocks, an all-to-all of heads, an all-gather of K/V, or all-to-all
// inside groups of hierarchical_context_parallel_sizes[0] ranks with a ring across them.
enum class CpCommType { p2p, a2a, all_gather, a2a_p2p };
std::string to_string(CpCommType c);  // p2p, a2a, all_gather, a2a+p2p

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
  // Context parallelism: each sequence split over this many ranks (tp-cp-dp-pp rank order;
  // not yet wired into training: `train` refuses a size above 1).
  int64_t context_parallel_size = 1;
  CpCommType cp_comm_type = CpCommType::p2p;
  std::vector<int64_t> hierarchical_context_parallel_sizes;  // [a2a size, p2p size] for a2a+p2p; empty = none
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
