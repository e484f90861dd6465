// The device collectives' watchdog and flight recorder (parallel/flight_recorder.hpp) for
// a command whose tensor groups are NCCL's (CUDA, more than one process) with a
// collective timeout > 0: `train` (its groups) and `eval` under mpirun (the scorer's
// groups). Started by the constructor once the groups are placed, stopped by the
// destructor. The token that tells this run's files from an earlier run's in the same
// directory is rank 0's clock, shared over world (a host all-reduce: every rank
// constructs it). MTNLG_NCCL_WATCHDOG=0 turns it off alone (the benchmarks' A/B; the MPI
// watchdog stays).
#pragma once
#include <string>

#include "parallel/communicator.hpp"

namespace mtnlg::app {

class DeviceWatchdogRun {
 public:
  // Dumps, marker and heartbeats go to RUN_DIR/flight_recorder.
  DeviceWatchdogRun(const std::string& run_dir, const parallel::ProcessGroups& g);
  ~DeviceWatchdogRun();
  DeviceWatchdogRun(const DeviceWatchdogRun&) = delete;
  DeviceWatchdogRun& operator=(const DeviceWatchdogRun&) = delete;
  const bool on;
};

}  // namespace mtnlg::app
