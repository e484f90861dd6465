// Device helpers shared by the kernel files: fp32 load/store of the storage types,
// warp reductions, grid sizing and the dtype switch. Included by .cu files only.
//
// Each core/cuda/<family>.cu holds its kernels, their raw launchers (namespace
// cuda::k: plain pointers, sizes and the storage DType; used only by that file) and, at
// its end, the family's Tensor-level entry declared in core/cuda/ops_cuda.hpp. Every
// launcher enqueues on cuda::stream() and returns without synchronising, except those
// that return a value to the host (sum_squares). Arithmetic is fp32 whatever the
// storage dtype (f32, bf16, f16); statistics and parameter gradients are fp32.
// Gradient contract: parameter gradients (dw, db, dtable, dpos) ACCUMULATE (+=);
// activation gradients are WRITTEN (=) unless the launcher takes `accumulate`.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/cuda_check.hpp"
#include "core/cuda/device.hpp"
#include "core/cuda/ops_cuda.hpp"
#include "core/error.hpp"
#include "core/op_checks.hpp"
#include "core/tensor.hpp"

// Kernel launches and dynamic shared memory, written once for both builds: nvcc's
// syntax here; the emulated backend (emulator/cuda_emu.hpp, force-included by g++ when
// the build is configured with -DMTNLG_CUDA=EMULATE) defines them to run on the CPU.
#ifndef MTNLG_LAUNCH
#define MTNLG_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<grid, block, smem, stream>>>
#define MTNLG_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace mtnlg::cuda::k {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-level sum in a fixed tree order (deterministic).
__device__ __forceinline__ double block_sum_double(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  return sh[0];
}

// Grid for a grid-stride loop over n elements: enough blocks to fill any current GPU,
// capped so the grid stays small for huge n (each thread then loops).
inline unsigned grid_for(int64_t n, int threads, int64_t cap = 8192) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b);
}

// One thread per column of a C-column matrix (kernels that own a column and loop over
// its rows): ceil(C / threads) blocks, uncapped.
inline unsigned col_blocks(int64_t C, int threads) { return static_cast<unsigned>((C + threads - 1) / threads); }

// Column-major strided-batched D_i = alpha op(A_i) op(B_i) + beta D_i, i < count, through
// cuBLASLt (core/cuda/gemm.cu: fp32 accumulation, its candidate list and fallback), all
// three matrices of storage dtype dt; matrix i starts i * stride elements after the first.
// beta 0 never reads D.
void gemm_strided_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* A, int64_t lda,
                          int64_t stride_a, const void* B, int64_t ldb, int64_t stride_b, void* D, int64_t ldd,
                          int64_t stride_d, int64_t count, DType dt, float beta = 0.0f);

}  // namespace mtnlg::cuda::k

// Host helpers of the Tensor-level entries at the end of each .cu file.
namespace mtnlg::cuda::detail {

// `d` itself when the kernels store it (f32, bf16, f16); RuntimeError naming the op
// and the argument otherwise.
inline DType cuda_dtype(const char* op, const char* name, DType d) {
  if (d == DType::f32 || d == DType::bf16 || d == DType::f16) return d;
  throw_runtime("{}: {} has dtype {}, which the CUDA backend does not support (f32, bf16, f16)", op, name,
                to_string(d));
}
inline void need_f32(const char* op, const char* name, const Tensor* t) {
  if (t && t->defined() && t->dtype() != DType::f32)
    throw_runtime("{}: {} must be f32 on CUDA (statistics and parameter gradients are fp32), got {}", op, name,
                  to_string(t->dtype()));
}
using op_checks::expect_numel;
// The device pointer of an optional tensor (nullptr when absent).
template <typename T = void>
T* p(const Tensor* t) {
  return (t && t->defined()) ? static_cast<T*>(t->raw()) : nullptr;
}
inline float* f(const Tensor& t) { return static_cast<float*>(t.raw()); }
inline const int32_t* ip(const Tensor& t) { return static_cast<const int32_t*>(t.raw()); }

}  // namespace mtnlg::cuda::detail

// Runs the statement with `T` bound to the storage type of `dt` (f32, bf16 or f16: the
// Tensor-level entries check it with cuda_dtype first; anything else is a logic error).
#define MTNLG_DT_SWITCH(dt, T, ...)                                                                    \
  switch (dt) {                                                                                        \
    case ::mtnlg::DType::f32: {                                                                        \
      using T = float;                                                                                 \
      __VA_ARGS__;                                                                                     \
      break;                                                                                           \
    }                                                                                                  \
    case ::mtnlg::DType::bf16: {                                                                       \
      using T = __nv_bfloat16;                                                                         \
      __VA_ARGS__;                                                                                     \
      break;                                                                                           \
    }                                                                                                  \
    case ::mtnlg::DType::f16: {                                                                        \
      using T = __half;                                                                                \
      __VA_ARGS__;                                                                                     \
      break;                                                                                           \
    }                                                                                                  \
    default: ::mtnlg::cuda::fail("CUDA kernel called with a storage dtype other than f32, bf16, f16"); \
  }
