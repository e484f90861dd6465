// Elementwise kernels. CPU references: core/ops.cpp (fill, add, scale, convert,
// sum_squares) and core/cpu/ops_cpu.cpp (gelu_forward/backward, dropout,
// bias_add_forward, position_forward).
//
// Gradient contract: gelu_backward and dropout (used for dropout_backward too) WRITE
// their outputs. All loops are grid-stride over int64 indices; arithmetic in fp32.
// Dropout uses the CPU's counter mapping exactly (ops_cpu.cpp keep()): element e is
// kept iff philox_uniform(key, 0, base + e) >= float(p), and kept values are multiplied
// by float(1/(1-p)), so fp32 outputs are bit-identical to the CPU's.
#include "core/cuda/common.cuh"
#include "core/rng.hpp"

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

template <typename T>
__global__ void fill_kernel(T* x, int64_t n, float v) {
  const T tv = from_f<T>(v);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = tv;
}

__global__ void fill_i32_kernel(int32_t* x, int64_t n, int32_t v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = v;
}

template <typename T>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_f<T>(to_f(x[i]) * s);
}

template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = from_f<D>(to_f(src[i]));
}

// Block-level sum in a fixed tree order (deterministic).
__device__ double block_sum_double(double v, double* sh) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  return sh[0];
}

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

__global__ void fill_f64_kernel(double* x, int64_t n, double v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = v;
}

__global__ void xent_loss_kernel(double* acc, const float* rowmax, const float* sumexp, const float* target,
                                 const float* mask, int64_t N) {
  __shared__ double sh[kThreads];
  double loss = 0, count = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const double w = mask ? double(mask[i]) : 1.0;
    loss += w * (log(double(sumexp[i])) + double(rowmax[i]) - double(target[i]));
    count += w;
  }
  const double l = block_sum_double(loss, sh);
  __syncthreads();
  const double c = block_sum_double(count, sh);
  if (threadIdx.x == 0) {
    acc[0] += l;
    acc[1] += c;
  }
}

template <typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = to_f(inp[i]);
    const float u = kGeluC * (x + 0.044715f * x * x * x);
    out[i] = from_f<T>(0.5f * x * (1.0f + tanhf(u)));
  }
}

template <typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = to_f(inp[i]);
    const float u = kGeluC * (x + 0.044715f * x * x * x);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float du = kGeluC * (1.0f + float(3 * 0.044715) * x * x);
    dinp[i] = from_f<T>(to_f(dout[i]) * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du));
  }
}

template <typename T>
__global__ void dropout_kernel(T* out, const T* inp, int64_t n, float p, float s, uint64_t key, uint64_t base) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const bool kept = philox_uniform(key, 0, base + static_cast<uint64_t>(i)) >= p;
    out[i] = kept ? from_f<T>(to_f(inp[i]) * s) : from_f<T>(0.0f);
  }
}

template <typename T>
__global__ void bias_add_kernel(T* x, const T* b, int64_t N, int64_t C) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_f<T>(to_f(x[i]) + to_f(b[i % C]));
}

template <typename T>
__global__ void position_forward_kernel(T* x, const T* pos, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len) {
  const int64_t n = rows * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / C, c = i % C;
    x[i] = from_f<T>(to_f(x[i]) + to_f(pos[((row_start + r) % seq_len) * C + c]));
  }
}

}  // namespace

void fill(void* x, Dt dt, int64_t n, float value) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T, fill_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(static_cast<T*>(x), n, value));
  MTNLG_CUDA_LAUNCH_CHECK("fill_kernel");
}

void fill_i32(int32_t* x, int64_t n, int32_t value) {
  if (n <= 0) return;
  fill_i32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, n, value);
  MTNLG_CUDA_LAUNCH_CHECK("fill_i32_kernel");
}

void add(void* out, const void* a, const void* b, Dt dt, int64_t n) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  add_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
                      static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n));
  MTNLG_CUDA_LAUNCH_CHECK("add_kernel");
}

void scale(void* x, Dt dt, int64_t n, float s) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T, scale_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(static_cast<T*>(x), n, s));
  MTNLG_CUDA_LAUNCH_CHECK("scale_kernel");
}

void convert(void* dst, Dt ddt, const void* src, Dt sdt, int64_t n) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(ddt, D,
                  MTNLG_DT_SWITCH(sdt, S,
                                  convert_kernel<D, S><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
                                      static_cast<D*>(dst), static_cast<const S*>(src), n)));
  MTNLG_CUDA_LAUNCH_CHECK("convert_kernel");
}

double sum_squares(const void* x, Dt dt, int64_t n) {
  if (n <= 0) return 0.0;
  // The grid depends on n only, so the summation order (and the result) is the same
  // on every GPU.
  const unsigned blocks = grid_for(n, kThreads, 1024);
  DeviceBuffer<double> partial(blocks + 1);
  MTNLG_DT_SWITCH(dt, T,
                  sumsq_partial_kernel<T><<<blocks, kThreads, 0, stream()>>>(partial.data(), static_cast<const T*>(x), n));
  MTNLG_CUDA_LAUNCH_CHECK("sumsq_partial_kernel");
  sumsq_final_kernel<<<1, kThreads, 0, stream()>>>(partial.data() + blocks, partial.data(), blocks);
  MTNLG_CUDA_LAUNCH_CHECK("sumsq_final_kernel");
  double out = 0;
  CUDA_CHECK(cudaMemcpyAsync(&out, partial.data() + blocks, sizeof(double), cudaMemcpyDeviceToHost, stream()));
  CUDA_CHECK(cudaStreamSynchronize(stream()));
  return out;
}

void sum_squares_accumulate(double* acc, const void* x, Dt dt, int64_t n) {
  if (n <= 0) return;
  const unsigned blocks = grid_for(n, kThreads, 1024);
  DeviceBuffer<double> partial(blocks);
  MTNLG_DT_SWITCH(dt, T,
                  sumsq_partial_kernel<T><<<blocks, kThreads, 0, stream()>>>(partial.data(), static_cast<const T*>(x), n));
  MTNLG_CUDA_LAUNCH_CHECK("sumsq_partial_kernel");
  sumsq_accumulate_kernel<<<1, kThreads, 0, stream()>>>(acc, partial.data(), blocks);
  MTNLG_CUDA_LAUNCH_CHECK("sumsq_accumulate_kernel");
}

void fill_f64(double* x, int64_t n, double value) {
  if (n <= 0) return;
  fill_f64_kernel<<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, n, value);
  MTNLG_CUDA_LAUNCH_CHECK("fill_f64_kernel");
}

void xent_loss_accumulate(double* acc, const float* rowmax, const float* sumexp, const float* target, const float* mask,
                          int64_t N) {
  if (N <= 0) return;
  xent_loss_kernel<<<1, kThreads, 0, stream()>>>(acc, rowmax, sumexp, target, mask, N);
  MTNLG_CUDA_LAUNCH_CHECK("xent_loss_kernel");
}

void gelu_forward(void* out, const void* inp, Dt dt, int64_t n) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  gelu_forward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
                      static_cast<T*>(out), static_cast<const T*>(inp), n));
  MTNLG_CUDA_LAUNCH_CHECK("gelu_forward_kernel");
}

void gelu_backward(void* dinp, const void* inp, const void* dout, Dt dt, int64_t n) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  gelu_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
                      static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n));
  MTNLG_CUDA_LAUNCH_CHECK("gelu_backward_kernel");
}

void dropout(void* out, const void* inp, Dt dt, int64_t n, double p, uint64_t key, uint64_t base) {
  if (n <= 0) return;
  if (p <= 0) {
    if (out != inp) {
      const int64_t bytes = n * (dt == Dt::f32 ? 4 : 2);
      CUDA_CHECK(cudaMemcpyAsync(out, inp, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream()));
    }
    return;
  }
  const float fp = static_cast<float>(p), s = static_cast<float>(1.0 / (1.0 - p));  // as the CPU rounds them
  MTNLG_DT_SWITCH(dt, T,
                  dropout_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
                      static_cast<T*>(out), static_cast<const T*>(inp), n, fp, s, key, base));
  MTNLG_CUDA_LAUNCH_CHECK("dropout_kernel");
}

void bias_add_forward(void* x, const void* b, Dt dt, int64_t N, int64_t C) {
  if (N * C <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  bias_add_kernel<T><<<grid_for(N * C, kThreads), kThreads, 0, stream()>>>(
                      static_cast<T*>(x), static_cast<const T*>(b), N, C));
  MTNLG_CUDA_LAUNCH_CHECK("bias_add_kernel");
}

void position_forward(void* x, const void* pos, Dt dt, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len) {
  if (rows * C <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  position_forward_kernel<T><<<grid_for(rows * C, kThreads), kThreads, 0, stream()>>>(
                      static_cast<T*>(x), static_cast<const T*>(pos), rows, C, row_start, seq_len));
  MTNLG_CUDA_LAUNCH_CHECK("position_forward_kernel");
}

}  // namespace mtnlg::cuda::k
