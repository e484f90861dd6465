// The checkpoint and logging sections of a recipe.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtnlg {

struct CheckpointConfig {
  std::string save;
  std::string load;
  int64_t save_interval = 0;
  int64_t keep_last = 0;  // 0 = keep all
};

struct LoggingConfig {
  std::string dir;  // "" -> runs/<recipe name>
  int64_t log_interval = 1;
  bool tensorboard = true;
  // Peak TFLOP/s per device for MFU. 0 = the GPU's dense bf16 peak on CUDA, and on the
  // CPU the sgemm rate measured at start-up (the log names which).
  double peak_tflops = 0;
  // Straggler detection (docs/RELIABILITY.md): a rank whose compute time per step exceeds
  // the median of its peers by this factor for straggler_intervals log intervals in a
  // row is named once. Either 0 turns it off.
  double straggler_margin = 1.2;
  int64_t straggler_intervals = 3;
  // Each rank times its step in parts (compute, exposed communication per group, bubble,
  // optimizer, data, checkpoint, host syncs); metrics.jsonl carries them per rank and
  // `mtnlg report --explain` compares them with the plan (docs/OPERATIONS.md).
  bool step_timing = true;
  // On a GPU: the GPU time of each op family (GEMMs, attention, LayerNorm, cross-entropy,
  // the optimizer, ...) from CUDA events around every op, per iteration at log iterations
  // (metrics.jsonl "gpu_profile"). Costs two events per op: for a few steps, not a run.
  bool gpu_profile = false;
};

}  // namespace mtnlg
