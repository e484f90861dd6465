// The device's side of the step-parts clock (core/step_parts.hpp): where the GPU's time
// goes, read from CUDA events on the compute stream. Every change of the training thread's
// current part records an event (timing on) on the backend stream; the GPU time between
// two consecutive events is charged to the part that began at the first. The host clock
// says where the host waited; this one says what the GPU was running (or idling for, when
// the host fell behind) in each part. Reading synchronises on the last event, so the
// trainer reads it only at log iterations, never inside a step.
#pragma once
#include "core/step_parts.hpp"

namespace mtnlg::cuda {

// Starts marking this thread's part changes on the backend stream (after init_backend).
void start_device_step_parts();
// Stops marking; the events are released.
void stop_device_step_parts();
// The GPU seconds per part since the previous read (or the start), zeroing them; waits for
// the GPU to reach the last mark.
timing::StepPartTimes read_device_step_parts();

}  // namespace mtnlg::cuda
