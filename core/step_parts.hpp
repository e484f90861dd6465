// Where a training step's time goes, measured on each rank: a per-thread clock that
// charges every moment to exactly one part. Code marks what it does with a
// StepPartScope (forward, backward, recompute, optimizer, data, checkpoint, host sync,
// validation); the communicators charge the time they sit blocked to their group (tp,
// pp sends, the pipeline bubble for pp receives, dp, embedding, mp, cp, and world
// collectives as host syncs). Scopes nest and the innermost wins, so a tp all-reduce
// inside a forward is tp time and not forward time, and the parts of an interval sum
// exactly to its wall time; what no scope covers is `other`.
//
// Off (the default until set_step_parts_enabled(true); logging.step_timing: false in a
// recipe) a scope costs one branch. The clock is per thread: the loader's prefetch
// thread and the checkpoint writer's thread charge nothing to the step.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace mtnlg::timing {

enum class StepPart : uint8_t {
  forward,     // forward compute (less the tp communication inside it)
  backward,    // backward compute
  recompute,   // the forward re-run inside the backward (recompute_granularity: full)
  tp,          // tensor-parallel collectives blocked
  pp,          // pipeline sends waited for
  bubble,      // pipeline receives: waiting on the peer stage (includes the transfer)
  dp,          // data-parallel gradient reduction (and ZeRO-1 reduce-scatter / all-gather)
  embedding,   // tied word-embedding gradient all-reduce between first and last stage
  mp,          // model-parallel collectives (the gradient norm)
  cp,          // attention's exchange across the context-parallel group blocked
  optimizer,   // clipping and the AdamW update
  data,        // waiting for the batch (the loader prefetches in a thread)
  checkpoint,  // checkpoint copies and commits on the training thread
  host_sync,   // the step's host read and world collectives (loss, flags, timings)
  validation,  // training.eval_interval forward passes
  other,       // everything else (logging, the schedule's bookkeeping, fault injection)
  count
};
constexpr int kStepParts = static_cast<int>(StepPart::count);

// Stable names, as in metrics.jsonl ("forward", "bubble", "host_sync", ...).
const char* step_part_name(StepPart p);
// Words for people ("dp reduce", "pipeline bubble", ...).
const char* step_part_label(StepPart p);

using StepPartTimes = std::array<double, kStepParts>;  // seconds per part

// This thread's clock. Off, scopes do nothing and read_step_parts() returns zeros.
void set_step_parts_enabled(bool on);
bool step_parts_enabled();
// Charges the time since the last charge to the current part and returns the seconds
// per part since the previous read (or since the clock was switched on), zeroing them.
StepPartTimes read_step_parts();

// The device's clock beside the host's: a marker, when set (a CUDA run, core/cuda/
// step_events.hpp), is called with the part that starts at every change of this thread's
// current part, so that the device can mark the point in its stream where that part's
// work begins; the device time between two marks is the time the device spent on the
// work the host queued in that part (and waiting for it). Null: no device marks.
using DeviceMarker = void (*)(StepPart starting);
void set_device_marker(DeviceMarker m);

namespace detail {
struct StepClock {
  StepPartTimes acc{};
  std::chrono::steady_clock::time_point since{};
  StepPart current = StepPart::other;
  bool on = false;
  DeviceMarker mark = nullptr;
};
StepClock& step_clock();
inline void charge(StepClock& c, std::chrono::steady_clock::time_point now) {
  c.acc[static_cast<size_t>(c.current)] += std::chrono::duration<double>(now - c.since).count();
  c.since = now;
}
}  // namespace detail

// Charges the scope's lifetime to `part` (time in nested scopes goes to theirs).
// `weak`: only when the enclosing part is `other` (a world collective inside a
// checkpoint stays checkpoint time; in the loop's own code it is a host sync).
class StepPartScope {
 public:
  explicit StepPartScope(StepPart part, bool weak = false) {
    auto& c = detail::step_clock();
    if (!c.on || (weak && c.current != StepPart::other)) return;
    active_ = true;
    detail::charge(c, std::chrono::steady_clock::now());
    prev_ = c.current;
    c.current = part;
    if (c.mark && part != prev_) c.mark(part);
  }
  StepPartScope(const StepPartScope&) = delete;
  StepPartScope& operator=(const StepPartScope&) = delete;
  ~StepPartScope() {
    if (!active_) return;
    auto& c = detail::step_clock();
    detail::charge(c, std::chrono::steady_clock::now());
    if (c.mark && c.current != prev_) c.mark(prev_);
    c.current = prev_;
  }

 private:
  bool active_ = false;
  StepPart prev_ = StepPart::other;
};

// The part a communicator charges its blocked time to, from its group's name
// ("tp", "pp", "dp", "embedding", "mp", "world"; other names: other). `recv`: a
// blocking receive (on "pp": the bubble).
StepPart comm_step_part(const std::string& group, bool recv = false);

}  // namespace mtnlg::timing
