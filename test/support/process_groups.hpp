// The process groups of a single process (every group a LocalCommunicator, one rank), for
// tests of code that takes ProcessGroups without running under mpirun. Header-only, so
// that only the test binaries that include it link the parallel layer.
#pragma once
#include <memory>
#include <utility>

#include "parallel/communicator.hpp"

namespace mtnlg::test {

// Every group of a one-process job, the embedding group included (pp == 1: the first stage
// is the last), each named as the trainer names it.
inline parallel::ProcessGroups single_process_groups() {
  parallel::ProcessGroups g;
  for (const auto& [group, name] :
       {std::pair{&g.world, "world"}, std::pair{&g.tp, "tp"}, std::pair{&g.pp, "pp"}, std::pair{&g.dp, "dp"},
        std::pair{&g.embedding, "embedding"}, std::pair{&g.mp, "mp"}})
    *group = std::make_shared<parallel::LocalCommunicator>(name);
  return g;
}

}  // namespace mtnlg::test
