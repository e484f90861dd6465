// Error checks for CUDA, cuBLAS(Lt) and NCCL calls. One generator macro
// (MTNLG_GPU_CHECK_GEN) expands into CUDA_CHECK / CUBLAS_CHECK / NCCL_CHECK; all of
// them call one [[noreturn]] reporter that throws mtnlg::RuntimeError with the failing
// statement, file:line, the current device and the rank (when the communicator layer
// has told us, see set_error_rank).
//
// The reporter is defined in cuda_check.cpp, so the macros stay small at every call
// site (each .cu file expands dozens of them). fmt v9's headers compile under nvcc
// only with FMT_USE_CONSTEXPR=1, which core/CMakeLists.txt sets for every unit.
//
// Debug sync-check: MTNLG_CUDA_LAUNCH_CHECK() after every kernel launch always checks
// cudaGetLastError (cheap, catches bad launch configurations); when the environment
// variable MTNLG_CUDA_SYNC_CHECK=1 is set, or the code is compiled with
// -DMTNLG_CUDA_SYNC_CHECK, it also synchronises the device so that an asynchronous
// fault is reported at the launch that caused it instead of at some later call.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace mtnlg::cuda {

// Throws mtnlg::RuntimeError("<api> error <code> (<what>) in `<stmt>` at file:line on
// device d[, rank r]").
[[noreturn]] void report_gpu_error(const char* api, int64_t code, const char* what, const char* stmt, const char* file,
                                   int line);

// Throws mtnlg::RuntimeError(msg). For .cu files, which cannot include core/error.hpp.
[[noreturn]] void fail(const char* msg);

// log::warn(msg) (rank-prefixed, stderr). For .cu files: the host logger stays out of nvcc.
void warn(const char* msg);

// The global rank printed in error messages (-1 = unknown, not printed). Set once by
// whoever knows it (the trainer, NcclCommunicator). Diagnostic only.
void set_error_rank(int64_t rank);
int64_t error_rank();

// True when MTNLG_CUDA_SYNC_CHECK=1 in the environment (read once) or compiled in.
bool sync_check_enabled();
// cudaGetLastError, plus cudaDeviceSynchronize when sync_check_enabled().
void launch_check(const char* what, const char* file, int line);

}  // namespace mtnlg::cuda

#define MTNLG_GPU_CHECK_GEN(stmt, api, success, to_str)                                                       \
  do {                                                                                                        \
    auto mtnlg_status_ = (stmt);                                                                              \
    if (mtnlg_status_ != (success))                                                                           \
      ::mtnlg::cuda::report_gpu_error(api, static_cast<int64_t>(mtnlg_status_), to_str(mtnlg_status_), #stmt, \
                                      __FILE__, __LINE__);                                                    \
  } while (0)

#define CUDA_CHECK(stmt) MTNLG_GPU_CHECK_GEN(stmt, "CUDA", cudaSuccess, cudaGetErrorString)
// cublasStatus_t is shared by cuBLAS and cuBLASLt; needs <cublas_api.h> where used.
#define CUBLAS_CHECK(stmt) MTNLG_GPU_CHECK_GEN(stmt, "cuBLAS", CUBLAS_STATUS_SUCCESS, cublasGetStatusString)
// Needs <nccl.h> where used (parallel/ only).
#define NCCL_CHECK(stmt) MTNLG_GPU_CHECK_GEN(stmt, "NCCL", ncclSuccess, ncclGetErrorString)

#define MTNLG_CUDA_LAUNCH_CHECK(what) ::mtnlg::cuda::launch_check(what, __FILE__, __LINE__)
