// The training loop: wires recipe -> topology and process groups -> this rank's model
// chunks -> data loader -> pipeline schedule executor -> data-parallel reduction and
// optimizer -> LR and batch schedules -> log line, metrics.jsonl.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "app/train/iteration_stats.hpp"
#include "config/recipe.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

struct TrainOptions {
  bool quiet = false;
  // Called on every rank after each iteration (tests use it to collect losses).
  std::function<void(const IterationStats&)> on_iteration;
  // Every rank writes its bytes sent per group and iteration to LOGDIR/bytes_rank<R>.jsonl
  // (`mtnlg train --comm-report`; checked against the planner's formulas in tests).
  bool comm_report = false;
  // Every rank writes its tensor bytes by role each iteration to LOGDIR/memory_rank<R>.jsonl
  // (`mtnlg train --memory-report`; checked against `mtnlg plan` in tests).
  bool memory_report = false;
};

struct TrainSummary {
  std::vector<IterationStats> iterations;
  int64_t consumed_samples = 0, consumed_tokens = 0;
  bool interrupted = false;  // stopped early (signal, exit_duration_mins) after saving
};

// Runs training for `recipe` on the process groups of this rank.
TrainSummary train(const Recipe& recipe, const parallel::ProcessGroups& groups, const TrainOptions& opts = {});

}  // namespace mtnlg::app
