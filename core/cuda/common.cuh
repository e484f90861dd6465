// Device helpers shared by the kernel files: fp32 load/store of the storage types,
// warp reductions, grid sizing and the dtype switch. Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/cuda_check.hpp"
#include "core/cuda/device.hpp"
#include "core/cuda/kernels.hpp"

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

// Grid for a grid-stride loop over n elements: enough blocks to fill any current GPU,
// capped so the grid stays small for huge n (each thread then loops).
inline unsigned grid_for(int64_t n, int threads, int64_t cap = 8192) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b);
}

}  // namespace mtnlg::cuda::k

// Runs the statement with `T` bound to the storage type of `dt`.
#define MTNLG_DT_SWITCH(dt, T, ...)                  \
  switch (dt) {                                      \
    case ::mtnlg::cuda::k::Dt::f32: {                \
      using T = float;                               \
      __VA_ARGS__;                                   \
      break;                                         \
    }                                                \
    case ::mtnlg::cuda::k::Dt::bf16: {               \
      using T = __nv_bfloat16;                       \
      __VA_ARGS__;                                   \
      break;                                         \
    }                                                \
    case ::mtnlg::cuda::k::Dt::f16: {                \
      using T = __half;                              \
      __VA_ARGS__;                                   \
      break;                                         \
    }                                                \
  }
