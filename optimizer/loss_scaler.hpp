// Dynamic loss scaling for fp16 training (optimizer policy; the trainer owns one), with Megatron-LM's rules
// (megatron/core/optimizer/grad_scaler.py, DynamicGradScaler). Host-side state only:
// the caller scales the loss by scale() before backward, checks the gradients for
// inf/NaN (ops::all_finite on the flat gradient buffer, all-reduced over the model-
// and data-parallel groups so every rank decides the same), unscales them by
// 1/scale() (AdamWParams::grad_scale) and calls update(found_overflow):
//
//   overflow: the optimizer step is skipped (update returns false, skipped_steps()+1),
//             the growth tracker resets to 0 and the hysteresis tracker drops by 1;
//             when it reaches 0 the scale is multiplied by backoff_factor (0.5), never
//             below min_scale. The hysteresis tracker is NOT refilled by clean steps:
//             once it has run out, every further overflow halves the scale until the
//             next growth.
//   clean:    the growth tracker counts up; after `window` consecutive clean steps
//             the scale is multiplied by growth_factor (2), the growth tracker resets
//             to 0 and the hysteresis tracker is refilled to `hysteresis`.
//
// bf16 and fp32 need no scaling: use a scaler only for fp16.
#pragma once
#include <cstdint>

#include "optimizer/config.hpp"

namespace mtnlg::optimizer {

class DynamicLossScaler {
 public:
  // InputError when a value is out of range (scale <= 0, window < 1, hysteresis < 1,
  // min_scale <= 0 or above the initial scale, growth <= 1, backoff not in (0,1)).
  explicit DynamicLossScaler(const LossScalerConfig& cfg);

  double scale() const { return scale_; }
  double inv_scale() const { return 1.0 / scale_; }
  // Records one step's outcome; returns true when the optimizer step may be applied.
  bool update(bool found_overflow);

  int64_t skipped_steps() const { return skipped_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t hysteresis_tracker() const { return hysteresis_tracker_; }

  // Checkpointed state (Megatron saves scale, growth and hysteresis trackers).
  struct State {
    double scale = 0;
    int64_t growth_tracker = 0, hysteresis_tracker = 0, skipped_steps = 0;
  };
  State state() const { return {scale_, growth_tracker_, hysteresis_tracker_, skipped_}; }
  // InputError when the state is inconsistent with the config (resuming a corrupt file).
  void load_state(const State& s);

 private:
  LossScalerConfig cfg_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
  int64_t skipped_ = 0;
};

}  // namespace mtnlg::optimizer
