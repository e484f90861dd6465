// Time this thread has spent inside blocking communication (collectives, recv, waits
// on pending requests) of the MPI backend, in seconds, since the process started. The
// trainer subtracts it from a step's wall time to get the rank's own compute time, which
// straggler detection compares across ranks (a slow rank makes its peers wait inside
// collectives, so their wall times all equal the slowest one's). NCCL work is
// asynchronous on the device and not counted.
#pragma once
#include <chrono>

namespace mtnlg::parallel {

double comm_blocked_seconds();
void add_comm_blocked_seconds(double s);

// Adds the lifetime of the scope to comm_blocked_seconds().
class CommBlockedScope {
 public:
  CommBlockedScope() : t0_(std::chrono::steady_clock::now()) {}
  CommBlockedScope(const CommBlockedScope&) = delete;
  CommBlockedScope& operator=(const CommBlockedScope&) = delete;
  ~CommBlockedScope() { add_comm_blocked_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count()); }

 private:
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace mtnlg::parallel
