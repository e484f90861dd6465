// CUDA device resources: RAII wrappers (move-only CudaStream, CudaEvent,
// CublasLtHandle) and the backend state (device, compute stream, cuBLASLt handle and
// workspace), in device.cpp. The caching device allocator, DeviceBuffer<T> and the CUDA
// graph pools are declared in allocator.hpp, the pinned upload staging in staging.hpp;
// both are included here, so this is the one header users of the backend include.
//
// Backend state. The op set (core/ops.hpp) has no context argument, so the CUDA
// backend keeps one process-wide state, created by init_backend(device) and never
// destroyed (tensors may outlive main's locals; freeing at static-destruction time
// would race the CUDA runtime's own teardown). init_backend also installs the
// allocator into cuda_allocator_hooks() (core/tensor.hpp), after which
// Tensor::empty(shape, dt, Device::cuda) works. One process drives one device,
// chosen by the launcher's local rank: init_backend(device_for_local_rank(local_rank)).
//
// Stream order. Every kernel, cuBLASLt call and allocator-backed copy runs on the one
// backend stream, so host code never synchronises between ops; only reads back to the
// host (Tensor::to(cpu), sum_squares, all_finite) wait. The caching allocator relies
// on this: a block freed on the host while kernels that use it are still queued is
// handed out again only to work queued later on the same stream. Work on any other
// stream (NCCL sends, the overlapped gradient reduction) registers its buffers with
// record_stream(), and a freed block it used waits for that work before it is reused.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/cuda/allocator.hpp"
#include "core/cuda/staging.hpp"

namespace mtnlg::cuda {

class CudaStream {
 public:
  CudaStream();  // a non-blocking stream on the current device
  ~CudaStream();
  CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  CudaStream& operator=(CudaStream&& o) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

class CudaEvent {
 public:
  explicit CudaEvent(bool timing = false);
  ~CudaEvent();
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s);
  void synchronize() const;
  // Milliseconds from `start` to this event (both recorded with timing = true).
  float elapsed_ms(const CudaEvent& start) const;

 private:
  cudaEvent_t e_ = nullptr;
};

class CublasLtHandle {
 public:
  CublasLtHandle();
  ~CublasLtHandle();
  CublasLtHandle(CublasLtHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  CublasLtHandle& operator=(CublasLtHandle&& o) noexcept;
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;
  cublasLtHandle_t get() const { return h_; }

 private:
  cublasLtHandle_t h_ = nullptr;
};

// ---- backend ---------------------------------------------------------------------
// Number of visible devices; 0 when there is none or no driver (never throws).
int device_count();
// local_rank % device_count(); RuntimeError when there is no device.
int device_for_local_rank(int64_t local_rank);
// Selects `device`, creates the stream, cuBLASLt handle and workspace and installs the
// allocator hooks. Idempotent for the same device; RuntimeError for another one.
void init_backend(int device);
bool backend_ready();
int backend_device();
cudaStream_t stream();  // the backend stream (RuntimeError before init_backend)
cublasLtHandle_t cublaslt();
void* cublas_workspace();
int64_t cublas_workspace_bytes();
void synchronize();  // waits for the backend stream
// Name and compute capability of the backend device, e.g. "NVIDIA H100 80GB HBM3 (sm_90)".
const char* device_name();

}  // namespace mtnlg::cuda
