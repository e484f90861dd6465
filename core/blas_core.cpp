#include "core/blas_core.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/switches.hpp"

extern "C" char* openblas_get_corename(void);

namespace mtnlg {

namespace {
// MTNLG_BLAS_REEXEC: set for the re-executed process only, to the core the library chose
// at first; read once and removed, so that the processes this one starts do not inherit it
// (they inherit OPENBLAS_CORETYPE and load the selected core directly).
const char* marker() { return switch_spec(Switch::blas_reexec).name; }

const std::string& library_choice() {  // "" unless this process was re-executed
  static const std::string chose = [] {
    std::string s = switches::text(Switch::blas_reexec).value_or("");
    ::unsetenv(marker());
    return s;
  }();
  return chose;
}

// What OpenBLAS's kernels for a core need of the CPU, for the x86-64 cores whose kernels
// use instructions beyond x86-64-v2 (what mtnlg itself is built for), best first.
struct CoreNeeds {
  const char* core;
  std::initializer_list<const char*> features;  // cpu_has names
  const char* what;
};
const CoreNeeds kCoreNeeds[] = {
    {"Cooperlake", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16"}, "AVX-512 (F, BW, VL, DQ, BF16)"},
    {"SkylakeX", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}, "AVX-512 (F, BW, VL, DQ)"},
    {"Haswell", {"avx2", "fma"}, "AVX2 and FMA"},
    {"Zen", {"avx2", "fma"}, "AVX2 and FMA"},
    {"Sandybridge", {"avx"}, "AVX"},
};

bool runs(const CoreNeeds& c) {
  for (const char* f : c.features)
    if (!cpu_has(f)) return false;
  return true;
}
}  // namespace

bool cpu_has(const std::string& feature) {
  if (const auto pretend = switches::text(Switch::test_cpu_features))
    return ("," + *pretend + ",").find("," + feature + ",") != std::string::npos;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (feature == "avx") return __builtin_cpu_supports("avx");
  if (feature == "avx2") return __builtin_cpu_supports("avx2");
  if (feature == "fma") return __builtin_cpu_supports("fma");
  if (feature == "avx512f") return __builtin_cpu_supports("avx512f");
  if (feature == "avx512bw") return __builtin_cpu_supports("avx512bw");
  if (feature == "avx512vl") return __builtin_cpu_supports("avx512vl");
  if (feature == "avx512dq") return __builtin_cpu_supports("avx512dq");
  if (feature == "avx512bf16") return __builtin_cpu_supports("avx512bf16");
#endif
  return false;
}

std::string blas_core_for_cpu() {
  if (cpu_has("avx512f") && cpu_has("avx512bw") && cpu_has("avx512vl") && cpu_has("avx512dq")) return "SkylakeX";
  if (cpu_has("avx2") && cpu_has("fma")) return "Haswell";
  return "";
}

void check_blas_coretype() {
  const auto user = switches::text(Switch::openblas_coretype);
  if (!user) return;
  for (const CoreNeeds& c : kCoreNeeds) {
    if (strcasecmp(user->c_str(), c.core) != 0 || runs(c)) continue;
    std::string can = blas_core_for_cpu();
    for (const CoreNeeds& d : kCoreNeeds)
      if (can.empty() && runs(d)) can = d.core;
    throw_input(
        "OPENBLAS_CORETYPE={}: OpenBLAS's {} kernels need {}, which this CPU lacks (the process would die of "
        "an illegal instruction at its first matmul); {}",
        *user, c.core, c.what,
        can.empty() ? "unset it: OpenBLAS then picks a core this CPU runs"
                    : fmt::format("this CPU can run {}: set OPENBLAS_CORETYPE={}, or unset it", can, can));
  }
}

bool blas_core_is_generic(const std::string& core) {
  static const char* kSlow[] = {"Prescott",  "Core2",        "Penryn",      "Dunnington", "Nehalem",
                                "Atom",      "Katmai",       "Coppermine",  "Northwood",  "Banias",
                                "Opteron",   "Opteron_SSE3", "Barcelona",   "Bobcat",     "Sandybridge",
                                "Bulldozer", "Piledriver",   "Steamroller", "Excavator",  "Unknown"};
  for (const char* s : kSlow)
    if (strcasecmp(core.c_str(), s) == 0) return true;
  return false;
}

std::string blas_loaded_core() {
  if (const auto t = switches::text(Switch::test_blas_core); t && library_choice().empty()) return *t;
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
}

void select_blas_core(char** argv) {
  if (!library_choice().empty()) return;  // already re-executed once
  const std::string loaded = blas_loaded_core(), want = blas_core_for_cpu();
  if (want.empty() || !blas_core_is_generic(loaded)) return;
  if (const auto user = switches::text(Switch::openblas_coretype)) {
    log::warn(
        "OPENBLAS_CORETYPE={} selects OpenBLAS's generic {} kernels on a CPU with {} support: sgemm runs several "
        "times slower (unset it, or set OPENBLAS_CORETYPE={})",
        *user, loaded, want == "SkylakeX" ? "AVX-512" : "AVX2", want);
    return;
  }
  ::setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
  ::setenv(marker(), loaded.c_str(), 1);
  ::execv("/proc/self/exe", argv);
  // exec failed (no /proc): carry on with the slow kernels, but say so (and leave the
  // environment as it was, so that this process's children load what it loaded)
  ::unsetenv(marker());
  ::unsetenv("OPENBLAS_CORETYPE");
  log::warn(
      "OpenBLAS chose its generic {} kernels on a CPU with {} support and re-running with OPENBLAS_CORETYPE={} "
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
