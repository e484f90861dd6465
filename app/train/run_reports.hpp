// The run's files beside the log line: rank 0's metrics.jsonl (every logged iteration's
// figures, what `mtnlg report` and `plan --calibrate` read), and with --memory-report /
// --comm-report every rank's tensor bytes by role (memory_rank<R>.jsonl) and bytes sent
// per group (bytes_rank<R>.jsonl). A write that fails is exit 1 naming logging.dir.
#pragma once
#include <cstdint>
#include <fstream>
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

}  // namespace mtnlg::app
