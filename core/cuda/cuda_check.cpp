// Reporter behind CUDA_CHECK / CUBLAS_CHECK / NCCL_CHECK (core/cuda/cuda_check.hpp).
// Compiled by the host compiler so it can use fmt and core/error.hpp.
#include "core/cuda/cuda_check.hpp"

#include "core/cuda/device.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"
#include "core/refused.hpp"
#include "core/log.hpp"
#include "core/switches.hpp"

namespace mtnlg::cuda {

namespace {
std::atomic<int64_t> g_error_rank{-1};  // diagnostic only: printed in error messages
}

void set_error_rank(int64_t rank) { g_error_rank.store(rank); }
int64_t error_rank() { return g_error_rank.load(); }

void report_gpu_error(const char* api, int64_t code, const char* what, const char* stmt, const char* file, int line) {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
  std::string where = fmt::format("device {}", dev);
  if (int64_t r = error_rank(); r >= 0) where += fmt::format(", rank {}", r);
  // The runtime declining an operation because a stream capture is running: a refusal
  // (the capture's work then runs eagerly, CudaGraph), not a fault.
  if (std::strcmp(api, "CUDA") == 0) switch (static_cast<cudaError_t>(code)) {
      case cudaErrorStreamCaptureUnsupported:
      case cudaErrorStreamCaptureInvalidated:
      case cudaErrorStreamCaptureImplicit:
      case cudaErrorCapturedEvent:
      case cudaErrorStreamCaptureIsolation:
      case cudaErrorStreamCaptureUnjoined:
        throw Refused(fmt::format("{} error {} ({}) in `{}` at {}:{} on {}", api, code, what ? what : "?", stmt, file,
                                  line, where));
      default: break;
    }
  throw RuntimeError(
      fmt::format("{} error {} ({}) in `{}` at {}:{} on {}", api, code, what ? what : "?", stmt, file, line, where));
}

void fail(const char* msg) { throw RuntimeError(msg); }

void warn(const char* msg) { log::warn("{}", msg); }

bool sync_check_enabled() {
#ifdef MTNLG_CUDA_SYNC_CHECK
  return true;
#else
  static const bool on = switches::on(Switch::cuda_sync_check);  // 1/0 or a boolean spelling
  return on;
#endif
}

void launch_check(const char* what, const char* file, int line) {
  cudaError_t e = cudaGetLastError();
  // Not inside a CUDA graph capture: a synchronisation there would invalidate it (the
  // kernels are checked when the graph runs).
  if (e == cudaSuccess && sync_check_enabled() && !capturing()) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) report_gpu_error("CUDA", static_cast<int64_t>(e), cudaGetErrorString(e), what, file, line);
}

}  // namespace mtnlg::cuda
