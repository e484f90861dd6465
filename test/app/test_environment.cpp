// The environment through the binary (core/switches.hpp): a malformed switch and an
// OpenBLAS core this CPU cannot run are exit 2 with one line before any work, and
// `mtnlg --version --verbose` lists the switches set.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "test/support/bad_input.hpp"
#include "test/support/test_support.hpp"

using namespace mtnlg;
using Catch::Matchers::Contains;

namespace {

// Whether /proc/cpuinfo lists a flag (the kernel's view, independent of mtnlg's check).
bool cpuinfo_has(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("flags")) return (line + " ").find(" " + flag + " ") != std::string::npos;
  return false;
}

}  // namespace

TEST_CASE("environment: a malformed switch is exit 2 naming the variable, before any work", "[e2e]") {
  test::TempDir d("env-bad");
  test::write_file(d / "r.yaml", test::tiny_recipe_yaml(1));
  const std::string train = " " + std::string(MTNLG_BINARY) + " train " + (d / "r.yaml").string() +
                            " --set logging.dir=" + (d / "run").string();
  test::expect_exit2(test::run_command("MTNLG_DEBUG=maybe" + train),
                     {"mtnlg: error: environment variable MTNLG_DEBUG=\"maybe\": expected 1 or 0"},
                     test::ErrorLines::one);
  test::expect_exit2(test::run_command("MTNLG_EMU_MEMORY_BYTES=12GB " + std::string(MTNLG_BINARY) + " --version"),
                     {"MTNLG_EMU_MEMORY_BYTES=\"12GB\": expected a whole number"}, test::ErrorLines::one);
  CHECK_FALSE(std::filesystem::exists(d / "run"));  // refused before the run began
}

TEST_CASE("environment: mtnlg --version --verbose lists the switches set", "[e2e]") {
  auto plain = test::run_command("env -u MTNLG_DEBUG " + std::string(MTNLG_BINARY) + " --version");
  CHECK(plain.exit_code == 0);
  CHECK_THAT(plain.out, !Contains("environment switches"));
  auto v =
      test::run_command("MTNLG_DEBUG=1 MTNLG_NOT_A_SWITCH=1 " + std::string(MTNLG_BINARY) + " --version --verbose");
  INFO(v.out);
  CHECK(v.exit_code == 0);
  CHECK_THAT(v.out, Contains("CPU matmul: OpenBLAS") && Contains("environment switches set") &&
                        Contains("MTNLG_DEBUG=1: debug log lines") &&
                        Contains("MTNLG_NOT_A_SWITCH=1 (read by no mtnlg program"));
}

// OpenBLAS runs the kernels OPENBLAS_CORETYPE names whatever the CPU: SkylakeX's on a CPU
// without AVX-512 died of an illegal instruction at the first matmul (exit 132, no
// message). mtnlg refuses it at start, naming the core this CPU can run.
TEST_CASE("environment: OPENBLAS_CORETYPE naming a core this CPU cannot run is exit 2", "[e2e]") {
  test::TempDir d("env-blas");
  test::write_file(d / "r.yaml", test::tiny_recipe_yaml(1));
  const std::string train = " " + std::string(MTNLG_BINARY) + " train " + (d / "r.yaml").string() +
                            " --set logging.dir=" + (d / "run").string();
  // An AVX2 CPU without AVX-512, as MTNLG_TEST_CPU_FEATURES pretends one.
  test::expect_exit2(
      test::run_command("MTNLG_TEST_CPU_FEATURES=avx,avx2,fma OPENBLAS_CORETYPE=SkylakeX" + train),
      {"OPENBLAS_CORETYPE=SkylakeX: OpenBLAS's SkylakeX kernels need AVX-512 (F, BW, VL, DQ), which this "
       "CPU lacks",
       "this CPU can run Haswell: set OPENBLAS_CORETYPE=Haswell, or unset it"},
      test::ErrorLines::one);
  // The same without pretending, where this machine's CPU has no AVX-512 (what the check is for).
  if (!cpuinfo_has("avx512f")) {
    test::expect_exit2(test::run_command("OPENBLAS_CORETYPE=SkylakeX" + train), {"need AVX-512", "this CPU lacks"},
                       test::ErrorLines::one);
  } else {
    WARN("this CPU has AVX-512: OPENBLAS_CORETYPE=SkylakeX runs here, checked with MTNLG_TEST_CPU_FEATURES only");
    auto r = test::run_command("OPENBLAS_CORETYPE=SkylakeX" + train);
    INFO(r.out);
    CHECK(r.exit_code == 0);
  }
}
