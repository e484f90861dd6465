// Catch2 runner for the multi-rank tests (every rank runs the same cases in the same
// order, so collectives inside test cases match up). MPI is initialised once here,
// before any case, and the process exits non-zero on every rank if any rank failed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "core/blas_core.hpp"
#include "core/switches.hpp"
#include "test/support/mpi/mpi_test_world.hpp"

namespace mtnlg::test {
std::shared_ptr<parallel::Communicator>& mpi_test_world() {
  static std::shared_ptr<parallel::Communicator> w;
  return w;
}
}  // namespace mtnlg::test

int main(int argc, char** argv) {
  mtnlg::start_process(argv);  // before MPI starts: the switches checked, the kernels mtnlg itself would use
  using namespace mtnlg::parallel;
  int64_t failed = 0;
  try {
    auto info = detect_launch();
    mtnlg::test::mpi_test_world() = init_world(info);
    Catch::Session session;
    failed = session.run(argc, argv) != 0;
    mtnlg::test::mpi_test_world()->all_reduce(&failed, 1, ReduceOp::max);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_mpi_comm: %s\n", e.what());
    abort_world(1);
  }
  mtnlg::test::mpi_test_world().reset();
  finalize_world();
  return failed ? 1 : 0;
}
