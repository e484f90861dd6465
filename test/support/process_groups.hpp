// The process groups of a single process (every group a LocalCommunicator, one rank), for
// tests of code that takes ProcessGroups without running under mpirun. Header-only, so
// that only the test binaries that include it link the parallel layer.
#pragma once
#include <memory>

#include "parallel/communicator.hpp"

namespace mtnlg::test {

inline parallel::ProcessGroups single_process_groups() {
  parallel::ProcessGroups g;
  for (auto* c : {&g.world, &g.tp, &g.pp, &g.dp, &g.mp}) *c = std::make_shared<parallel::LocalCommunicator>("world");
  return g;
}

}  // namespace mtnlg::test
