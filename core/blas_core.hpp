// Which OpenBLAS kernels a process computes with, decided in one place for every binary
// that does CPU matmuls (mtnlg, the test binaries, the benchmarks), so that a test and the
// mtnlg it starts multiply with the same kernels and get the same bits.
//
// OpenBLAS picks its kernels once, when the library loads (before main): a CPU model it
// does not know (Debian's 0.3.21 on Sapphire/Emerald Rapids or on newer AMD EPYC, under
// KVM) gets the generic "Prescott" kernels, ~4x slower sgemm, silently. Each main() calls
// select_blas_core(argv) first: when the loaded core is a generic one and the CPU has
// AVX2/AVX-512, it sets OPENBLAS_CORETYPE to the matching kernel family and re-executes the
// binary (once; the process keeps its pid, arguments and environment, and its children
// inherit the variable, so they load the same core without re-executing). A core type set
// by the user is kept, with a warning when it is the slow one.
#pragma once
#include <string>

namespace mtnlg {

// Whether this CPU has a vector feature (GCC's __builtin_cpu_supports names: avx, avx2,
// fma, avx512f, avx512bw, avx512vl, avx512dq, avx512bf16); MTNLG_TEST_CPU_FEATURES pretends
// a CPU with only the features it lists.
bool cpu_has(const std::string& feature);
// Kernel family for this CPU's vector units: "SkylakeX" (AVX-512 F/BW/VL/DQ), "Haswell"
// (AVX2 + FMA), or "" (nothing better than what OpenBLAS detects).
std::string blas_core_for_cpu();
// True for OpenBLAS cores without AVX2 kernels (Prescott, Core2, Nehalem, Sandybridge, ...).
bool blas_core_is_generic(const std::string& core);
// The core OpenBLAS loaded (MTNLG_TEST_BLAS_CORE pretends another, for tests).
std::string blas_loaded_core();
// OPENBLAS_CORETYPE, when set, names a core this CPU can run: InputError otherwise, naming
// what the core needs and the core this CPU can run (OpenBLAS would run the kernels
// anyway and the process die of an illegal instruction, exit 132, at its first matmul).
// Called by check_environment (core/switches.hpp), first in every main.
void check_blas_coretype();
// Re-executes with OPENBLAS_CORETYPE set when that is needed (see above); returns otherwise.
// Call it first in main(), before any thread starts.
void select_blas_core(char** argv);
// For banners and --version: "OpenBLAS SkylakeX (selected by mtnlg: the library chose Prescott)".
std::string blas_description();

}  // namespace mtnlg
