// SwiGLU forward/backward on CUDA: out[N, F] = silu(gate) * up from inp [N, 2F] = [gate | up].
// CPU reference: core/ops/swiglu.cpp.
//
// Gradient contract: dinp (d[gate | up]) is WRITTEN; no parameters. One grid-stride loop
// over the N*F (gate, up) pairs, fp32 arithmetic, one rounding per stored value.
#include "core/cuda/common.cuh"

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoidf(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* inp, int64_t N, int64_t F) {
  const int64_t n = N * F;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / F, c = e % F;
    const float g = to_f(inp[i * 2 * F + c]), u = to_f(inp[i * 2 * F + F + c]);
    out[e] = from_f<T>(g * sigmoidf(g) * u);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dinp, const T* dout, const T* inp, int64_t N, int64_t F) {
  const int64_t n = N * F;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / F, c = e % F;
    const float g = to_f(inp[i * 2 * F + c]), u = to_f(inp[i * 2 * F + F + c]), d = to_f(dout[e]);
    const float s = sigmoidf(g);
    dinp[i * 2 * F + c] = from_f<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dinp[i * 2 * F + F + c] = from_f<T>(d * g * s);
  }
}

}  // namespace

void swiglu_forward(void* out, const void* inp, DType dt, int64_t N, int64_t F) {
  if (N * F <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid_for(N * F, kThreads), kThreads, 0, stream(), swiglu_forward_kernel<T>)(
                      static_cast<T*>(out), static_cast<const T*>(inp), N, F));
  MTNLG_CUDA_LAUNCH_CHECK("swiglu_forward_kernel");
}

void swiglu_backward(void* dinp, const void* dout, const void* inp, DType dt, int64_t N, int64_t F) {
  if (N * F <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid_for(N * F, kThreads), kThreads, 0, stream(), swiglu_backward_kernel<T>)(
                      static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), N, F));
  MTNLG_CUDA_LAUNCH_CHECK("swiglu_backward_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

void swiglu_forward(Tensor& out, const Tensor& inp) {
  const DType dt = cuda_dtype("swiglu_forward", "out", out.dtype());
  const int64_t F = inp.dim(-1) / 2, N = F ? inp.numel() / (2 * F) : 0;
  k::swiglu_forward(out.raw(), inp.raw(), dt, N, F);
}

void swiglu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const DType dt = cuda_dtype("swiglu_backward", "dinp", dinp.dtype());
  const int64_t F = inp.dim(-1) / 2, N = F ? inp.numel() / (2 * F) : 0;
  k::swiglu_backward(dinp.raw(), dout.raw(), inp.raw(), dt, N, F);
}

}  // namespace mtnlg::cuda
