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
// What the trainer does after it has replayed a step with a non-finite loss or gradient
// or a loss spike (app/train/forensics.hpp): stop with the report, drop the batch's
// update and go on (counted as skipped), or redo the step.
enum class SpikePolicy { stop, skip, rerun };


std::string to_string(Precision p);
std::string to_string(LrDecayStyle s);
std::string to_string(DeviceKind d);
std::string to_string(SpikePolicy p);

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
  // Spike and NaN forensics (Megatron's names where it has them): replay a step whose
  // loss or gradient is non-finite, or whose loss exceeds loss_spike_threshold times the
  // mean of the last loss_spike_window losses (0 = off), classify it and act by
  // spike_policy; every param_hash_interval iterations compare a hash of each
  // data-parallel replica's parameters (0 = off).
  bool check_for_nan_in_loss_and_grad = false;
  double loss_spike_threshold = 0;
  int64_t loss_spike_window = 10;
  SpikePolicy spike_policy = SpikePolicy::stop;
  int64_t param_hash_interval = 0;
  // On a GPU, each micro batch's forward and backward run as CUDA graphs (captured once per
  // micro-batch shape, then replayed): one launch instead of hundreds of kernel launches.
  // Megatron's --enable-cuda-graph. Layouts it does not cover are refused at start-up
  // (app/train/micro_batch_graphs.hpp says which and why).
  bool enable_cuda_graph = false;
  // Bitwise-reproducible kernels where a library offers a choice (Megatron's
  // --deterministic-mode): on a GPU, cuDNN's deterministic attention backward instead of
  // its default, which accumulates dQ in fp32 by atomic adds (docs/RELIABILITY.md).
  bool deterministic_mode = false;
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
  double clip_grad = 1.0;                    // 0 = no clipping
  double initial_loss_scale = 4294967296.0;  // 2^32, fp16 only
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  double min_loss_scale = 1.0;
};

}  // namespace mtnlg
