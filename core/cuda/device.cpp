// RAII CUDA resources and the backend state (device.hpp); the caching allocator is in
// allocator.cpp, the pinned memory and upload staging in staging.cpp. Host code only (no
// kernels), so it is a .cpp built by the host compiler.
#include "core/cuda/device.hpp"

#include <cublas_v2.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "core/cuda/cublas_classic.hpp"
#include "core/cuda/cuda_check.hpp"
#include "core/error.hpp"

namespace mtnlg::cuda {

// ---- RAII ------------------------------------------------------------------------

CudaStream::CudaStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
CudaStream::~CudaStream() {
  if (s_) cudaStreamDestroy(s_);  // no throw from a destructor
}
CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  std::swap(s_, o.s_);
  return *this;
}
void CudaStream::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(s_)); }

CudaEvent::CudaEvent(bool timing) {
  CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
CudaEvent::~CudaEvent() {
  if (e_) cudaEventDestroy(e_);
}
CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  std::swap(e_, o.e_);
  return *this;
}
void CudaEvent::record(cudaStream_t s) { CUDA_CHECK(cudaEventRecord(e_, s)); }
void CudaEvent::synchronize() const { CUDA_CHECK(cudaEventSynchronize(e_)); }
float CudaEvent::elapsed_ms(const CudaEvent& start) const {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

CublasLtHandle::CublasLtHandle() { CUBLAS_CHECK(cublasLtCreate(&h_)); }
CublasLtHandle::~CublasLtHandle() {
  if (h_) cublasLtDestroy(h_);
}
CublasLtHandle& CublasLtHandle::operator=(CublasLtHandle&& o) noexcept {
  std::swap(h_, o.h_);
  return *this;
}

namespace {

struct Backend {
  int device = -1;
  CudaStream stream;
  CublasLtHandle lt;
  cublasHandle_t blas = nullptr;  // classic cuBLAS (the GEMM fallback); never destroyed, as the backend
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  std::string name;
};
Backend* g_backend = nullptr;  // set once by init_backend, never destroyed
std::mutex g_backend_mu;

Backend& backend() {
  if (!g_backend) throw_runtime("the CUDA backend is not initialised: call cuda::init_backend(device) first");
  return *g_backend;
}

}  // namespace

// ---- backend ---------------------------------------------------------------------

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

int device_for_local_rank(int64_t local_rank) {
  const int n = device_count();
  if (n == 0)
    throw_runtime("no CUDA device is visible (CUDA_VISIBLE_DEVICES='{}')", [] {
      const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
      return std::string(v ? v : "<unset>");
    }());
  return static_cast<int>(local_rank % n);
}

void init_backend(int device) {
  std::lock_guard<std::mutex> lock(g_backend_mu);
  if (g_backend) {
    if (g_backend->device != device)
      throw_runtime("the CUDA backend already runs on device {}; cannot switch to device {}", g_backend->device,
                    device);
    return;
  }
  const int n = device_count();
  if (device < 0 || device >= n) throw_runtime("CUDA device {} does not exist ({} visible)", device, n);
  CUDA_CHECK(cudaSetDevice(device));
  auto b = std::make_unique<Backend>();
  b->device = device;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  b->name = fmt::format("{} (sm_{}{})", prop.name, prop.major, prop.minor);
  // 32 MiB: what cuBLASLt's heuristics want for large Hopper GEMMs.
  b->workspace_bytes = 32 << 20;
  CUDA_CHECK(cudaMalloc(&b->workspace, static_cast<size_t>(b->workspace_bytes)));
  // Classic cuBLAS, for the GEMMs cuBLASLt refuses: created here, not on the first
  // fallback (cublasCreate allocates device memory, which a CUDA graph capture running
  // then would refuse), on the backend stream, with the backend's workspace (set after
  // the stream: cublasSetStream resets a handle to cuBLAS's default workspace pool, which
  // CUDA >= 12.2 would allocate inside a captured graph). cuBLASLt and cuBLAS share the
  // workspace: both queue on the one backend stream, one GEMM after the other.
  CUBLAS_CHECK(cublasCreate(&b->blas));
  CUBLAS_CHECK(cublasSetStream(b->blas, b->stream.get()));
  CUBLAS_CHECK(cublasSetWorkspace(b->blas, b->workspace, static_cast<size_t>(b->workspace_bytes)));
  g_backend = b.release();
  install_allocator_hooks();
  install_staging_hooks();
}

bool backend_ready() { return g_backend != nullptr; }
int backend_device() { return g_backend ? g_backend->device : -1; }
cudaStream_t stream() { return backend().stream.get(); }
cublasLtHandle_t cublaslt() { return backend().lt.get(); }
cublasHandle_t cublas_classic() { return backend().blas; }
void* cublas_workspace() { return backend().workspace; }
int64_t cublas_workspace_bytes() { return backend().workspace_bytes; }
void synchronize() { backend().stream.synchronize(); }
const char* device_name() { return backend().name.c_str(); }

}  // namespace mtnlg::cuda
