#include "core/blas_core.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/log.hpp"

extern "C" char* openblas_get_corename(void);

namespace mtnlg {

namespace {
// Set for the re-executed process only, to the core the library chose at first; read once
// and removed, so that the processes this one starts do not inherit it (they inherit
// OPENBLAS_CORETYPE and load the selected core directly).
constexpr const char* kMarker = "MTNLG_BLAS_REEXEC";

const std::string& library_choice() {  // "" unless this process was re-executed
  static const std::string chose = [] {
    const char* m = std::getenv(kMarker);
    std::string s = m ? m : "";
    ::unsetenv(kMarker);
    return s;
  }();
  return chose;
}
}  // namespace

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
  if (const char* t = std::getenv("MTNLG_TEST_BLAS_CORE"); t && *t && library_choice().empty()) return t;
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
}

void select_blas_core(char** argv) {
  if (!library_choice().empty()) return;  // already re-executed once
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
  // exec failed (no /proc): carry on with the slow kernels, but say so (and leave the
  // environment as it was, so that this process's children load what it loaded)
  ::unsetenv(kMarker);
  ::unsetenv("OPENBLAS_CORETYPE");
  log::warn("OpenBLAS chose its generic {} kernels on a CPU with {} support and re-running with OPENBLAS_CORETYPE={} "
            "failed ({}): set OPENBLAS_CORETYPE={} yourself for several times the sgemm speed",
            loaded, want, want, std::strerror(errno), want);
}

std::string blas_description() {
  const char* c = openblas_get_corename();
  std::string s = std::string("OpenBLAS ") + (c ? c : "unknown");
  if (!library_choice().empty())
    s += " (selected by mtnlg: the library chose " + library_choice() + ")";
  else if (blas_core_is_generic(c ? c : "") && !blas_core_for_cpu().empty())
    s += " (generic kernels: slow on this CPU)";
  return s;
}

}  // namespace mtnlg
