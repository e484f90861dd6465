// Global batch size ramp and run length (Megatron's --rampup-batch-size rule, with
// the ramp length given in tokens). Pure functions of consumed samples, so a
// resumed run recomputes the same batch sizes.
#pragma once
#include <cstdint>

#include "config/training.hpp"

namespace mtnlg::schedules {

// Global batch size for the iteration that starts after `consumed_samples`.
// No ramp (or an empty one) -> global_batch_size. With a ramp:
//   ramp_samples = ramp_tokens / seq_length (integer division)
//   steps        = (gbs - start) / increment             (validate() makes it exact)
//   per_step     = ramp_samples / steps                   (double, as Megatron)
//   consumed <= ramp_samples: start + floor(consumed / per_step) * increment (capped at gbs)
//   consumed >  ramp_samples: gbs
// MT-NLG: start 32, increment 32, gbs 1920, 12e9 tokens at seq 2048 -> 5,859,375 ramp
// samples, 59 steps of ~99,311.4 samples.
int64_t global_batch_size(const TrainingConfig& t, int64_t seq_length, int64_t consumed_samples);

struct RunLength {
  int64_t iterations = 0;
  int64_t samples = 0;  // sum of the global batch sizes of all iterations
  int64_t tokens = 0;   // samples * seq_length
};

// Turns whichever of train_iters | train_samples | train_tokens is set into all three
// by simulating the ramp. For samples/tokens the run goes on until consumed samples
// (tokens) reach the target, so the last iteration is a whole batch and the run may
// overshoot by less than one batch. Throws InputError when none is set or seq_length < 1.
// The loop runs only over the ramp; the constant-batch tail is computed in closed form.
RunLength run_length(const TrainingConfig& t, int64_t seq_length);

}  // namespace mtnlg::schedules
