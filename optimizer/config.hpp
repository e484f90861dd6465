// The optimizer's own configuration: what AdamW, its clipping and the fp16 loss scaler
// need, and nothing of the recipe (app/process/module_configs.* fills these from the
// recipe's optimizer section; the learning rate comes per step from schedules/).
#pragma once
#include <cstdint>

namespace mtnlg::optimizer {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;  // decoupled (AdamW), on the segments that take it
  double clip_grad = 1.0;      // global gradient-norm clipping; 0 = none
};

// fp16 dynamic loss scaling, Megatron's rules (optimizer/loss_scaler.hpp).
struct LossScalerConfig {
  double initial_scale = 4294967296.0;  // 2^32
  int64_t window = 1000;                // clean steps before growing
  int64_t hysteresis = 2;               // overflows tolerated before backing off
  double min_scale = 1.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
};

}  // namespace mtnlg::optimizer
