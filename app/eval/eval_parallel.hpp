// Evaluation across processes: the model split by tensor and pipeline parallelism
// (world = tp x pp, launched by mpirun/srun like training), each rank holding its shard
// of any-layout checkpoint weights. Every rank runs the same eval loop; each batch of
// requests goes through the pipeline (stage r receives activations from r-1, runs its
// layers, sends to r+1), the last stage's vocab-parallel head gives per-token
// log-probabilities and greedy flags, and the results reach every rank. On CUDA the
// groups are NCCL's (parallel::place_groups) under the device watchdog
// (app/process/device_watchdog.hpp), which cmd_eval starts: each scored batch sets the
// flight recorder's context (the batch number where training has its iteration).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "app/eval/eval_runner.hpp"
#include "app/train/fault_injection.hpp"
#include "config/recipe.hpp"
#include "model/gpt.hpp"
#include "parallel/communicator.hpp"

namespace mtnlg::app {

class ParallelScorer {
 public:
  // `r` is the checkpoint's recipe with the eval layout applied (parallel.*).
  // The model lives on `dev` (weights loaded to the host, then placed).
  ParallelScorer(const Recipe& r, const std::string& checkpoint_dir, const parallel::ProcessGroups& g, Device dev);
  ~ParallelScorer();
  std::vector<model::ScoreResult> operator()(const std::vector<const model::ScoreRequest*>& reqs);
  const model::GptConfig& config() const { return cfg_; }

 private:
  model::GptConfig cfg_;
  parallel::ProcessGroups g_;
  model::ParamStore store_;
  std::unique_ptr<model::GptChunk> chunk_;
  int64_t batches_ = 0;   // batches scored so far
  FaultInjection fault_;  // MTNLG_FAULT_INJECT (mode=hang only)
};

}  // namespace mtnlg::app
