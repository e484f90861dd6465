// The device collectives' watchdog and flight recorder (parallel/flight_recorder.hpp) for
// a command whose tensor groups are NCCL's (CUDA, more than one process) with a
// collective timeout > 0: `train` (its groups), `eval` and `generate` under mpirun (their
// groups). Started by the constructor once the groups are placed, stopped by the
// destructor. Rank 0 also serves the run's liveness service (parallel/liveness.hpp),
// which every rank's watchdog connects to. The token that tells this run's files from an
// earlier run's in the same directory is rank 0's clock; it and the service's address
// are shared over world (a host all-reduce: every rank constructs it).
// MTNLG_NCCL_WATCHDOG=0 turns it off alone (the benchmarks' A/B; the MPI watchdog stays);
// MTNLG_WATCHDOG_STATS=1 prints each rank's watchdog cost when it stops (the benchmark's).
#pragma once
#include <memory>
#include <string>

#include "parallel/communicator.hpp"
#include "parallel/liveness.hpp"

namespace mtnlg::app {

class DeviceWatchdogRun {
 public:
  // Dumps and the report go to RUN_DIR/flight_recorder; a rank silent for longer than
  // `heartbeat_timeout_s` (0 = never judged) ends the run.
  DeviceWatchdogRun(const std::string& run_dir, const parallel::ProcessGroups& g, double heartbeat_timeout_s);
  ~DeviceWatchdogRun();
  DeviceWatchdogRun(const DeviceWatchdogRun&) = delete;
  DeviceWatchdogRun& operator=(const DeviceWatchdogRun&) = delete;
  const bool on;

 private:
  std::unique_ptr<parallel::LivenessServer> server_;  // rank 0's
  int64_t rank_ = 0;
};

}  // namespace mtnlg::app
