#include "app/process/blas_core.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/log.hpp"

extern "C" char* openblas_get_corename(void);

namespace mtnlg::app {

namespace {
constexpr const char* kMarker = "MTNLG_BLAS_REEXEC";  // set on the re-executed process: the library chose this
}

std::string blas_core_for_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return "";
}

bool blas_core_is_generic(const std::string& core) {
  static const char* kSlow[] = {"Prescott", "Core2",  "Penryn",   "Dunnington", "Nehalem",  "Atom",        "Katmai",
                                "Coppermine", "Northwood", "Banias", "Opteron", "Opteron_SSE3", "Barcelona", "Bobcat",
                                "Sandybridge", "Bulldozer", "Piledriver", "Steamroller", "Excavator", "Unknown"};
  for (const char* s : kSlow)
    if (strcasecmp(core.c_str(), s) == 0) return true;
  return false;
}

std::string blas_loaded_core() {
  if (const char* t = std::getenv("MTNLG_TEST_BLAS_CORE"); t && *t && !std::getenv(kMarker)) return t;
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
}

void ensure_fast_blas_core(char** argv) {
  if (std::getenv(kMarker)) return;  // already re-executed once
  const std::string loaded = blas_loaded_core(), want = blas_core_for_cpu();
  if (want.empty() || !blas_core_is_generic(loaded)) return;
  if (const char* user = std::getenv("OPENBLAS_CORETYPE"); user && *user) {
    log::warn("OPENBLAS_CORETYPE={} selects OpenBLAS's generic {} kernels on a CPU with {} support: sgemm runs several "
              "times slower (unset it, or set OPENBLAS_CORETYPE={})",
              user, loaded, want == "SkylakeX" ? "AVX-512" : "AVX2", want);
    return;
  }
  ::setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
  ::setenv(kMarker, loaded.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // exec failed (no /proc): carry on with the slow kernels, but say so
  ::unsetenv(kMarker);
  log::warn("OpenBLAS chose its generic {} kernels on a CPU with {} support and re-running with OPENBLAS_CORETYPE={} "
            "failed ({}): set OPENBLAS_CORETYPE={} yourself for several times the sgemm speed",
            loaded, want, want, std::strerror(errno), want);
}

std::string blas_description() {
  const char* c = openblas_get_corename();
  std::string s = std::string("OpenBLAS ") + (c ? c : "unknown");
  if (const char* was = std::getenv(kMarker); was && *was)
    s += std::string(" (selected by mtnlg: the library chose ") + was + ")";
  else if (blas_core_is_generic(c ? c : "") && !blas_core_for_cpu().empty())
    s += " (generic kernels: slow on this CPU)";
  return s;
}

}  // namespace mtnlg::app
