// OpenBLAS picks its kernels once, when the library loads (before main): a CPU model it
// does not know (Debian's 0.3.21 on Sapphire/Emerald Rapids under KVM) gets the generic
// "Prescott" kernels, ~4x slower sgemm, silently. main() calls ensure_fast_blas_core()
// first: when the loaded core is a generic one and the CPU has AVX2/AVX-512, it sets
// OPENBLAS_CORETYPE to the matching kernel family and re-executes the binary (once; the
// process keeps its pid, arguments and environment). A core type set by the user is kept,
// with a warning when it is the slow one.
#pragma once
#include <string>

namespace mtnlg::app {

// Kernel family for this CPU's vector units: "SkylakeX" (AVX-512 F/BW/VL/DQ), "Haswell"
// (AVX2 + FMA), or "" (nothing better than what OpenBLAS detects).
std::string blas_core_for_cpu();
// True for OpenBLAS cores without AVX2 kernels (Prescott, Core2, Nehalem, Sandybridge, ...).
bool blas_core_is_generic(const std::string& core);
// The core OpenBLAS loaded (MTNLG_TEST_BLAS_CORE pretends another, for tests).
std::string blas_loaded_core();
// Re-executes with OPENBLAS_CORETYPE set when that is needed (see above); returns otherwise.
void ensure_fast_blas_core(char** argv);
// For banners: "OpenBLAS SkylakeX (selected by mtnlg: the library chose Prescott)".
std::string blas_description();

}  // namespace mtnlg::app
