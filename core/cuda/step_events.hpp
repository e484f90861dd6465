// The device's side of the step-parts clock (core/step_parts.hpp): where the GPU's time
// goes, read from CUDA events on the compute stream. Every change of the training thread's
// current part records an event (timing on) on the backend stream; the GPU time between
// two consecutive events is charged to the part that began at the first. The host clock
// says where the host waited; this one says what the GPU was running (or idling for, when
// the host fell behind) in each part. Reading synchronises on the last event, so the
// trainer reads it only at log iterations, never inside a step.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/step_parts.hpp"

namespace mtnlg::cuda {

// Starts marking this thread's part changes on the backend stream (after init_backend).
void start_device_step_parts();
// Stops marking; the events are released.
void stop_device_step_parts();
// The GPU seconds per part since the previous read (or the start), zeroing them; waits for
// the GPU to reach the last mark.
timing::StepPartTimes read_device_step_parts();

// logging.gpu_profile: the GPU time of each op family, from a pair of CUDA events around
// every op call on the compute stream while on. An op's family is the core/ops/<family>.cpp
// its dispatch line is in (gemm, attention, layernorm, xent, adamw, elementwise, embedding,
// reduce); an op that runs another op through its CUDA entry counts that one as its own.
void set_op_profile(bool on);
bool op_profile_on();
class OpScope {
 public:
  explicit OpScope(const char* file);  // __FILE__ of the dispatch line
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  const char* file_ = nullptr;
  void* start_ = nullptr;  // the start event while profiling, else null
};
// GPU seconds per family since the previous read, largest first; waits for the GPU.
std::vector<std::pair<std::string, double>> read_op_profile();

}  // namespace mtnlg::cuda
