// The time explainer's measuring side (logging.step_timing, docs/OPERATIONS.md). Every
// rank's training thread runs the step-parts clock (core/step_parts.hpp); after each
// step the trainer adds what the clock charged since the previous step, so an
// iteration's parts cover the time from the end of the previous step to the end of this
// one (its logging, validation and checkpoint stalls included) and sum to it. At a log
// iteration one all-reduce over the world of a [world x parts] vector, where each rank
// fills its own row with its mean over the log interval, gives every rank every rank's
// parts; rank 0 writes them into metrics.jsonl as "step_parts". On a GPU the device's
// clock runs beside it (core/cuda/step_events.hpp: CUDA events at every change of part):
// at a log iteration the GPU seconds per part over the interval are read (one wait for
// the GPU, outside any step) and gathered the same way, "step_parts_gpu".
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/output.hpp"
#include "parallel/communicator.hpp"
#include "core/step_parts.hpp"

namespace mtnlg::app {

class StepTiming {
 public:
  StepTiming(const LoggingConfig& c, const parallel::ProcessGroups& g);
  bool enabled() const { return enabled_; }
  // Starts the clock (before the first step; the set-up is not a step's).
  void start();
  // After a step: adds what the clock charged since the previous call.
  void after_step();
  // At a log iteration (every rank, collective when on): the world's mean parts per
  // iteration over the interval, [world x kStepParts] seconds, rank-major, the host's and
  // (on a GPU, else empty) the device's; both empty when off.
  struct Parts {
    std::vector<double> host, gpu;
    // logging.gpu_profile on a GPU: this rank's GPU seconds per iteration of each op family.
    std::vector<std::pair<std::string, double>> ops;
  };
  Parts at_log();
  ~StepTiming();

 private:
  std::vector<double> gathered(const timing::StepPartTimes& sum) const;
  const parallel::ProcessGroups& g_;
  bool enabled_ = false, device_ = false, ops_ = false;
  timing::StepPartTimes sum_{};
  int64_t count_ = 0, op_steps_ = 0;
};

// metrics.jsonl's "step_parts": {"ranks": [{"rank": R, "tp_rank", "pp_rank", "dp_rank",
// "<part>": seconds per iteration, ...}, ...]} from at_log()'s vector.
nlohmann::json step_parts_json(const std::vector<double>& parts, const parallel::Topology& topo);

}  // namespace mtnlg::app
