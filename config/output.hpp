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
};

}  // namespace mtnlg
