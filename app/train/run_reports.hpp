// The run's files beside the log line: rank 0's metrics.jsonl (every logged iteration's
// figures, what `mtnlg report` and `plan --calibrate` read), and with --memory-report /
// --comm-report every rank's tensor bytes by role (memory_rank<R>.jsonl) and bytes sent
// per group (bytes_rank<R>.jsonl). A write that fails is exit 1 naming logging.dir.
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <string>

#include "app/train/iteration_stats.hpp"
#include "config/recipe.hpp"
#include "parallel/communicator.hpp"
#include "model/moe.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/topology.hpp"

namespace mtnlg::app {

// metrics.jsonl, appended (a resumed run goes on in the same file); inactive off rank 0.
class MetricsWriter {
 public:
  MetricsWriter(const std::string& dir, bool active, const parallel::Topology& topo);
  void write(const IterationStats& s, const Recipe& r, double loss_scale);

 private:
  bool active_;
  parallel::Topology topo_;
  std::ofstream out_;
};

// --memory-report: this rank's tensor bytes by role per iteration (core/mem_account.hpp).
class MemoryReport {
 public:
  MemoryReport(const std::string& dir, const parallel::ProcessGroups& g, bool active);
  void write(const IterationStats& s);

 private:
  const parallel::ProcessGroups& g_;
  std::ofstream out_;
};

// --comm-report: this rank's bytes sent per group this iteration. The byte convention is
// the ring model of parallel/communicator.hpp; docs/PLANNER.md ("Measured bytes") relates
// it to the planner's comm_bytes_per_iteration.
class CommReport {
 public:
  CommReport(const std::string& dir, const parallel::ProcessGroups& g, bool active);
  // Zero every group's counter at the start of an iteration.
  void reset();
  // The iteration's bytes per group, and under context parallelism the seconds this rank
  // spent in attention across the cp group (cp_attention_s) and of them blocked in its
  // exchange (cp_wait_s), wall-clock and (_cpu_s) this thread's CPU time: their
  // difference is the rank's own attention work.
  void write(int64_t iteration, int64_t global_batch, int64_t micro_batches, int64_t dp_buckets,
             int64_t dp_buckets_early);

 private:
  const parallel::ProcessGroups& g_;
  std::ofstream out_;
  parallel::CpAttentionTimes cp_at_reset_;  // parallel::cp_attention_times() at the last reset
  model::MoeDispatchTimes moe_at_reset_;    // model::moe_dispatch_times() at the last reset
};

// MoE models (IterationStats::moe), "balance you can see". The log line's part: the
// balancing and z losses apart from the LM loss, then the load of the worst layers in one
// piece however many MoE layers there are — the highest max/mean and the lowest min/mean
// with their layers, and with a capacity (`capacity`) the slots dropped over all layers:
//   " | load balancing loss: 1.02E+00 | z loss: 3.1E+00 | expert load max/mean: 1.97 (layer 2),
//   min/mean: 0.19 (layer 1) | dropped slots: 12"
// "" for a dense model.
std::string moe_log_part(const IterationStats& s, bool capacity);
// The TensorBoard scalars of the same (the trainer writes them under "moe/" and
// "moe-vs-tokens/"): load_balancing_loss and z_loss where on, and per MoE layer
// layer<L>/max_over_mean, layer<L>/min_over_mean and with a capacity layer<L>/dropped
// (L zero-padded to the widest layer index, so TensorBoard lists layers in order).
std::map<std::string, double> moe_tensorboard_scalars(const IterationStats& s, bool capacity);

}  // namespace mtnlg::app
