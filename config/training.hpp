// The training and optimizer sections of a recipe: precision, device, batch sizes and run
// length, the LR schedule, AdamW and fp16 loss scaling.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mtnlg {

enum class Precision { fp32, bf16, fp16 };
enum class LrDecayStyle { cosine, linear, constant };
// Where training runs. auto: the GPU (one per process, by local rank) when this build
// has CUDA and the machine a GPU, else the CPU. test: the test device (host memory
// treated as a device, core/tensor.hpp) that CI uses to run the device code path.
enum class DeviceKind { automatic, cpu, cuda, test };


std::string to_string(Precision p);
std::string to_string(LrDecayStyle s);
std::string to_string(DeviceKind d);

struct RampupBatchSize {
  int64_t start = 0;
  int64_t increment = 0;
  int64_t ramp_tokens = 0;
};

struct TrainingConfig {
  Precision precision = Precision::fp32;
  DeviceKind device = DeviceKind::automatic;
  int64_t micro_batch_size = 1;
  int64_t global_batch_size = 0;
  std::optional<RampupBatchSize> rampup_batch_size;
  int64_t train_iters = 0;
  int64_t train_samples = 0;
  int64_t train_tokens = 0;
  int64_t seed = 1234;
  double exit_duration_mins = 0;  // 0 = none
  int64_t exit_interval = 0;      // stop (saving) after an iteration divisible by it; 0 = none
  int64_t eval_interval = 0;      // 0 = no validation during training
  int64_t eval_iters = 10;
  int64_t num_threads = 0;  // CPU threads per process; 0 = all cores
  int64_t max_nonfinite_in_a_row = 10;
};

struct OptimizerConfig {
  double lr = 1e-4;
  double min_lr = 0.0;
  LrDecayStyle lr_decay_style = LrDecayStyle::cosine;
  int64_t lr_warmup_tokens = 0;
  int64_t lr_decay_tokens = 0;  // 0 -> the whole run
  double weight_decay = 0.01;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 1.0;  // 0 = no clipping
  double initial_loss_scale = 4294967296.0;  // 2^32, fp16 only
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  double min_loss_scale = 1.0;
};

}  // namespace mtnlg
