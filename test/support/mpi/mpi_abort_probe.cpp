// A deliberately failing multi-rank program for the "dead rank" tests: rank 1 fails
// while the others wait in a collective. Mode "throw": rank 1 throws RuntimeError and
// the top level does what app/main does (print the one-line error, abort_world).
// Mode "die": rank 1 exits without MPI_Finalize. Either way mpirun must end every
// rank and exit non-zero (expect_abort.sh checks it happens within 30 s).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "parallel/communicator.hpp"

using namespace mtnlg;
using namespace mtnlg::parallel;

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "throw";
  try {
    auto world = init_world(detect_launch());
    world->barrier();
    const int64_t victim = world->size() > 1 ? 1 : 0;
    if (world->rank() == victim) {
      if (std::strcmp(mode, "die") == 0) std::_Exit(3);
      throw_runtime("rank {}: simulated failure in the middle of a step", world->rank());
    }
    std::vector<float> v(16, 1.f);
    world->all_reduce(v.data(), 16, ReduceOp::sum);  // never completes: the victim is gone
    world->barrier();
    std::printf("rank %lld: unexpectedly finished\n", static_cast<long long>(world->rank()));
    finalize_world();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    abort_world(e.exit_code());
  }
}
