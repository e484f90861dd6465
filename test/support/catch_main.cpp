// Catch2 v2 (Debian bookworm ships 2.13) main, compiled once into mtnlg_testlib. Before the
// first case it selects OpenBLAS's kernels exactly as mtnlg's own main() does (one place:
// core/blas_core.hpp), so that an in-process reference and the mtnlg binary a test starts
// multiply with the same kernels, and it names them on stderr.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>

#include "core/blas_core.hpp"
#include "core/switches.hpp"

int main(int argc, char** argv) {
  mtnlg::start_process(argv);  // may re-execute this binary (same pid, arguments, environment)
  const char* slash = std::strrchr(argv[0], '/');
  std::fprintf(stderr, "%s: CPU matmul: %s\n", slash ? slash + 1 : argv[0], mtnlg::blas_description().c_str());
  return Catch::Session().run(argc, argv);
}
