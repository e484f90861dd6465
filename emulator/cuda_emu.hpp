// Force-included (g++ -include) into every core/cuda/*.cu file when the build is
// configured with -DMTNLG_CUDA=EMULATE: what nvcc would provide to a kernel, provided
// to g++ by the emulated CUDA backend instead.
//
//   - __shared__ arrays are `static thread_local`: one block runs at a time on one
//     executor thread (its CUDA threads are fibers on that OS thread), so a
//     thread-local static is exactly one block's shared memory;
//   - dynamic shared memory (MTNLG_DYNAMIC_SHARED) is a per-block buffer that ends at
//     a guard page;
//   - threadIdx, blockIdx, blockDim, gridDim read the executor's current fiber/block;
//   - __syncthreads and the __shfl_*_sync family switch fibers; both check that every
//     thread they need is there (else a fatal error naming the kernel);
//   - MTNLG_LAUNCH(grid, block, smem, stream, kernel)(args...) enqueues the grid on the
//     stream (nvcc: kernel<<<grid, block, smem, stream>>>(args...)).
// Kernel code itself is unchanged: the same source compiles under nvcc and here.
#pragma once
#define MTNLG_CUDA_EMULATE 1
#undef __shared__
#undef __launch_bounds__
#define __shared__ static thread_local
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace mtnlg::emu {

struct LaunchSpec {
  const char* name = "";
  const void* fn = nullptr;  // the kernel function (cudaFuncSetAttribute's key)
  dim3 grid, block;
  size_t dynamic_smem = 0;
  cudaStream_t stream = nullptr;
};
// Checks the launch against sm_90's limits (an over-limit launch sets the error that
// cudaGetLastError returns and runs nothing, as the driver refuses it) and enqueues a
// grid whose every CUDA thread calls `body`.
void launch(const LaunchSpec& spec, std::function<void()> body);
// A pointer argument of a launch must be device memory (or null): a fatal error
// naming the kernel and the argument otherwise.
void check_kernel_pointer(const char* kernel, int index, const void* p);

struct SimtThread;  // the executor's per-CUDA-thread state
extern thread_local SimtThread* tl_thread;
extern thread_local uint3 tl_block_idx;
extern thread_local dim3 tl_block_dim;
extern thread_local dim3 tl_grid_dim;
uint3 thread_idx();
void syncthreads(const char* file, int line);
// One warp exchange: this lane offers `bits` and receives the value of lane `src`
// (absolute lane in the warp); every lane named in `mask` must take part.
uint64_t warp_exchange(unsigned mask, uint64_t bits, int src_lane, int width, const char* what, const char* file,
                       int line);
int lane_id();
void* dynamic_shared();

template <typename... P>
struct Launcher {
  void (*fn)(P...);
  LaunchSpec spec;
  template <typename... A>
  void operator()(A&&... a) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launch: wrong number of arguments");
    std::tuple<std::decay_t<P>...> args(std::forward<A>(a)...);
    check_pointers(args, std::index_sequence_for<P...>{});
    launch(spec, [f = fn, args]() { std::apply(f, args); });
  }
  template <typename Tuple, size_t... I>
  void check_pointers(const Tuple& t, std::index_sequence<I...>) const {
    (check_one(static_cast<int>(I), std::get<I>(t)), ...);
  }
  template <typename V>
  void check_one(int i, const V& v) const {
    if constexpr (std::is_pointer_v<V>) check_kernel_pointer(spec.name, i, static_cast<const void*>(v));
  }
};
template <typename... P>
Launcher<P...> make_launcher(const char* name, void (*fn)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s) {
  return Launcher<P...>{fn, LaunchSpec{name, reinterpret_cast<const void*>(fn), grid, block, smem, s}};
}

template <typename T>
T shfl_value(unsigned mask, T v, int src, int width, const char* what, const char* file, int line) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffle of a type over 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_exchange(mask, bits, src, width, what, file, line);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace mtnlg::emu

#define threadIdx (::mtnlg::emu::thread_idx())
#define blockIdx (::mtnlg::emu::tl_block_idx)
#define blockDim (::mtnlg::emu::tl_block_dim)
#define gridDim (::mtnlg::emu::tl_grid_dim)
#define warpSize 32
#define __syncthreads() ::mtnlg::emu::syncthreads(__FILE__, __LINE__)

#define MTNLG_EMU_SEG_START(width) (::mtnlg::emu::lane_id() & ~((width)-1))
#define __shfl_sync(mask, v, src, ...)                                                             \
  ::mtnlg::emu::shfl_value(mask, v, ::mtnlg::emu::detail_shfl_idx(src __VA_OPT__(, ) __VA_ARGS__), \
                           ::mtnlg::emu::detail_width(0 __VA_OPT__(+) __VA_ARGS__), "__shfl_sync", __FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, lm, ...)                                                                        \
  ::mtnlg::emu::shfl_value(mask, v, ::mtnlg::emu::detail_shfl_xor(lm __VA_OPT__(, ) __VA_ARGS__),                \
                           ::mtnlg::emu::detail_width(0 __VA_OPT__(+) __VA_ARGS__), "__shfl_xor_sync", __FILE__, \
                           __LINE__)
#define __shfl_down_sync(mask, v, d, ...)                                                                         \
  ::mtnlg::emu::shfl_value(mask, v, ::mtnlg::emu::detail_shfl_down(d __VA_OPT__(, ) __VA_ARGS__),                 \
                           ::mtnlg::emu::detail_width(0 __VA_OPT__(+) __VA_ARGS__), "__shfl_down_sync", __FILE__, \
                           __LINE__)
#define __shfl_up_sync(mask, v, d, ...)                                                                         \
  ::mtnlg::emu::shfl_value(mask, v, ::mtnlg::emu::detail_shfl_up(d __VA_OPT__(, ) __VA_ARGS__),                 \
                           ::mtnlg::emu::detail_width(0 __VA_OPT__(+) __VA_ARGS__), "__shfl_up_sync", __FILE__, \
                           __LINE__)

namespace mtnlg::emu {
// Source lanes of the shuffle variants (width: a power of two <= 32, default 32; a
// source outside the caller's width-segment yields the caller's own value).
inline int detail_width(int w) { return w == 0 ? 32 : w; }
inline int detail_shfl_idx(int src, int width = 32) { return (lane_id() & ~(width - 1)) + (src & (width - 1)); }
inline int detail_shfl_xor(int lm, int width = 32) {
  const int l = lane_id(), s = l ^ lm, seg = l & ~(width - 1);
  return (s >= seg && s < seg + width) ? s : l;
}
inline int detail_shfl_down(int d, int width = 32) {
  const int l = lane_id(), seg = l & ~(width - 1);
  return (l - seg) + d < width ? l + d : l;
}
inline int detail_shfl_up(int d, int width = 32) {
  const int l = lane_id(), seg = l & ~(width - 1);
  return (l - seg) - d >= 0 ? l - d : l;
}

// Atomics: the blocks of a grid run on several OS threads, so these are real atomics.
template <typename T>
T atomic_add(T* p, T v) {
  std::atomic_ref<T> r(*p);
  T old = r.load();
  while (!r.compare_exchange_weak(old, old + v)) {}
  return old;
}
}  // namespace mtnlg::emu

inline float atomicAdd(float* p, float v) { return ::mtnlg::emu::atomic_add(p, v); }
inline double atomicAdd(double* p, double v) { return ::mtnlg::emu::atomic_add(p, v); }
inline int atomicAdd(int* p, int v) { return ::mtnlg::emu::atomic_add(p, v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return ::mtnlg::emu::atomic_add(p, v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return ::mtnlg::emu::atomic_add(p, v);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)::mtnlg::emu::warp_exchange(mask, 0, ::mtnlg::emu::lane_id(), 32, "__syncwarp", __FILE__, __LINE__);
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
// Round-to-nearest product, never contracted into an FMA (g++ here contracts nothing anyway).
inline float __fmul_rn(float a, float b) { return a * b; }

// nvcc's template overload (the kernel itself as the key), for host-compiled kernels.
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

#define MTNLG_LAUNCH(grid, block, smem, stream, ...) \
  ::mtnlg::emu::make_launcher(#__VA_ARGS__, __VA_ARGS__, grid, block, smem, stream)
#define MTNLG_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::mtnlg::emu::dynamic_shared())
