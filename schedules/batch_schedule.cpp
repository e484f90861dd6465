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

int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// The run-length key that was set, for messages.
std::string length_key(const TrainingConfig& t) {
  if (t.train_iters > 0) return fmt::format("training.train_iters ({})", t.train_iters);
  if (t.train_samples > 0) return fmt::format("training.train_samples ({})", t.train_samples);
  return fmt::format("training.train_tokens ({})", t.train_tokens);
}

[[noreturn]] void too_long(const TrainingConfig& t, int64_t seq_length) {
  throw_input(
      "{} with training.global_batch_size {} and model.seq_length {}: the run's samples x seq_length overflow a "
      "64-bit token count (at most {:.3g} tokens)",
      length_key(t), t.global_batch_size, seq_length, 9.223372036854775807e18);
}

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
  if (ramp > 0 && ramp / std::max<int64_t>(1, t.rampup_batch_size->start) > 1'000'000'000)
    throw_input(
        "training.rampup_batch_size.ramp_tokens ({}): a ramp of more than 1e9 iterations (starting at {} "
        "samples per batch) is not a schedule mtnlg can walk",
        t.rampup_batch_size->ramp_tokens, t.rampup_batch_size->start);
  while (!done() && ramp > 0 && consumed <= ramp) {
    consumed += global_batch_size(t, seq_length, consumed);
    ++iters;
  }
  // Constant tail: every remaining iteration takes gbs samples.
  if (!done()) {
    const int64_t more = by_iters ? t.train_iters - iters : ceil_div(target_samples - consumed, gbs);
    iters += more;
    int64_t more_samples = 0;
    if (__builtin_mul_overflow(more, gbs, &more_samples) || __builtin_add_overflow(consumed, more_samples, &consumed))
      too_long(t, seq_length);
  }
  int64_t tokens = 0;
  if (__builtin_mul_overflow(consumed, seq_length, &tokens)) too_long(t, seq_length);
  if (iters < 1 || consumed < 1) throw_input("{}: a run of no iterations", length_key(t));
  return RunLength{iters, consumed, tokens};
}

}  // namespace mtnlg::schedules
