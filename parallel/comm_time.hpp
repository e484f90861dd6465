// Time this thread has spent inside blocking communication (collectives, recv, waits
// on pending requests) of the MPI backend, in seconds, since the process started. The
// trainer subtracts it from a step's wall time to get the rank's own compute time, which
// straggler detection compares across ranks (a slow rank makes its peers wait inside
// collectives, so their wall times all equal the slowest one's). NCCL work is
// asynchronous on the device and not counted.
//
// The same scope charges its time to the step's parts (core/step_parts.hpp): the
// communicator passes the part of its group.
#pragma once
#include <chrono>

#include "core/step_parts.hpp"

namespace mtnlg::parallel {

double comm_blocked_seconds();
void add_comm_blocked_seconds(double s);

// Adds the lifetime of the scope to comm_blocked_seconds() and charges it to `part`
// (world collectives weakly: inside a checkpoint they stay checkpoint time).
class CommBlockedScope {
 public:
  explicit CommBlockedScope(timing::StepPart part = timing::StepPart::other)
      : part_(part, part == timing::StepPart::host_sync || part == timing::StepPart::other),
        t0_(std::chrono::steady_clock::now()) {}
  CommBlockedScope(const CommBlockedScope&) = delete;
  CommBlockedScope& operator=(const CommBlockedScope&) = delete;
  ~CommBlockedScope() {
    add_comm_blocked_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
  }

 private:
  timing::StepPartScope part_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace mtnlg::parallel
