// Batch-size ramp and run-length simulation (see batch_schedule.hpp).
#include "schedules/batch_schedule.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace mtnlg::schedules {

namespace {

// Ramp length in samples; 0 when there is no (effective) ramp.
int64_t ramp_samples(const TrainingConfig& t, int64_t seq_length) {
  if (!t.rampup_batch_size) return 0;
  const auto& rb = *t.rampup_batch_size;
  if (rb.increment <= 0 || rb.start >= t.global_batch_size) return 0;
  return rb.ramp_tokens / seq_length;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t global_batch_size(const TrainingConfig& t, int64_t seq_length, int64_t consumed_samples) {
  if (seq_length < 1) throw_input("model.seq_length ({}) must be at least 1", seq_length);
  const int64_t gbs = t.global_batch_size;
  const int64_t ramp = ramp_samples(t, seq_length);
  if (ramp <= 0 || consumed_samples > ramp) return gbs;
  const auto& rb = *t.rampup_batch_size;
  const int64_t steps = (gbs - rb.start) / rb.increment;
  if (steps <= 0) return gbs;
  const double per_step = static_cast<double>(ramp) / static_cast<double>(steps);
  const auto k = static_cast<int64_t>(std::floor(static_cast<double>(consumed_samples) / per_step));
  return std::min(gbs, rb.start + k * rb.increment);
}

RunLength run_length(const TrainingConfig& t, int64_t seq_length) {
  if (seq_length < 1) throw_input("model.seq_length ({}) must be at least 1", seq_length);
  if (t.global_batch_size < 1) throw_input("training.global_batch_size ({}) must be at least 1", t.global_batch_size);
  if (t.train_iters <= 0 && t.train_samples <= 0 && t.train_tokens <= 0)
    throw_input("set one of training.train_iters, training.train_samples, training.train_tokens");
  const int64_t gbs = t.global_batch_size;
  const int64_t ramp = ramp_samples(t, seq_length);
  // Target: either a number of iterations or a number of samples (tokens rounded up).
  const bool by_iters = t.train_iters > 0;
  const int64_t target_samples = t.train_samples > 0 ? t.train_samples : ceil_div(t.train_tokens, seq_length);

  int64_t iters = 0, consumed = 0;
  auto done = [&] { return by_iters ? iters >= t.train_iters : consumed >= target_samples; };
  // Walk the ramp one iteration at a time (at most steps * per_step / start iterations).
  while (!done() && ramp > 0 && consumed <= ramp) {
    consumed += global_batch_size(t, seq_length, consumed);
    ++iters;
  }
  // Constant tail: every remaining iteration takes gbs samples.
  if (!done()) {
    const int64_t more = by_iters ? t.train_iters - iters : ceil_div(target_samples - consumed, gbs);
    iters += more;
    consumed += more * gbs;
  }
  return RunLength{iters, consumed, consumed * seq_length};
}

}  // namespace mtnlg::schedules
