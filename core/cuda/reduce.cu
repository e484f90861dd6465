// Sums of squares for the step statistics (the gradient norm, the non-finite check). CPU
// reference: core/ops/reduce.cpp.
//
// Deterministic: a grid that depends on n only, per-block sums in a fixed tree order,
// then one ordered second pass; sum_squares returns to the host (synchronises),
// sum_squares_accumulate adds into a device f64 accumulator (no synchronisation).
#include <cmath>

#include "core/cuda/common.cuh"

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void sumsq_partial_kernel(double* partial, const T* x, int64_t n) {
  __shared__ double sh[kThreads];
  double acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = to_f(x[i]);
    acc += v * v;
  }
  const double s = block_sum_double(acc, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(double* out, const double* partial, int64_t m) {
  __shared__ double sh[kThreads];
  double acc = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) acc += partial[i];
  const double s = block_sum_double(acc, sh);
  if (threadIdx.x == 0) *out = s;
}

__global__ void sumsq_accumulate_kernel(double* acc, const double* partial, int64_t m) {
  __shared__ double sh[kThreads];
  double a = 0;
  for (int64_t i = threadIdx.x; i < m; i += blockDim.x) a += partial[i];
  const double s = block_sum_double(a, sh);
  if (threadIdx.x == 0) *acc += s;
}

}  // namespace

double sum_squares(const void* x, DType dt, int64_t n) {
  if (n <= 0) return 0.0;
  // The grid depends on n only, so the summation order (and the result) is the same
  // on every GPU.
  const unsigned blocks = grid_for(n, kThreads, 1024);
  DeviceBuffer<double> partial(blocks + 1);
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(blocks, kThreads, 0, stream(), sumsq_partial_kernel<T>)(partial.data(),
                                                                                       static_cast<const T*>(x), n));
  MTNLG_CUDA_LAUNCH_CHECK("sumsq_partial_kernel");
  MTNLG_LAUNCH(1, kThreads, 0, stream(), sumsq_final_kernel)(partial.data() + blocks, partial.data(), blocks);
  MTNLG_CUDA_LAUNCH_CHECK("sumsq_final_kernel");
  double out = 0;
  CUDA_CHECK(cudaMemcpyAsync(&out, partial.data() + blocks, sizeof(double), cudaMemcpyDeviceToHost, stream()));
  CUDA_CHECK(cudaStreamSynchronize(stream()));
  return out;
}

void sum_squares_accumulate(double* acc, const void* x, DType dt, int64_t n) {
  if (n <= 0) return;
  const unsigned blocks = grid_for(n, kThreads, 1024);
  DeviceBuffer<double> partial(blocks);
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(blocks, kThreads, 0, stream(), sumsq_partial_kernel<T>)(partial.data(),
                                                                                       static_cast<const T*>(x), n));
  MTNLG_CUDA_LAUNCH_CHECK("sumsq_partial_kernel");
  MTNLG_LAUNCH(1, kThreads, 0, stream(), sumsq_accumulate_kernel)(acc, partial.data(), blocks);
  MTNLG_CUDA_LAUNCH_CHECK("sumsq_accumulate_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

double sum_squares(const Tensor& x) {
  return k::sum_squares(x.raw(), cuda_dtype("sum_squares", "x", x.dtype()), x.numel());
}

bool all_finite(const Tensor& x) { return std::isfinite(sum_squares(x)); }

void sum_squares_accumulate(Tensor& acc, const Tensor& x) {
  k::sum_squares_accumulate(static_cast<double*>(acc.raw()), x.raw(),
                            cuda_dtype("sum_squares_accumulate", "x", x.dtype()), x.numel());
}

}  // namespace mtnlg::cuda
