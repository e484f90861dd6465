// Elementwise kernels (fill, copy, convert, add, scale, GELU, dropout). CPU reference:
// core/ops/elementwise.cpp.
//
// Gradient contract: gelu_backward and dropout (used for dropout_backward too) WRITE
// their outputs. All loops are grid-stride over int64 indices; arithmetic in fp32.
// Dropout uses the CPU's counter mapping exactly (cpu::keep() in core/ops/common.hpp): element e is
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

__global__ void fill_f64_kernel(double* x, int64_t n, double v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = v;
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


}  // namespace

void fill(void* x, DType dt, int64_t n, float value) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T, MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), fill_kernel<T>)(static_cast<T*>(x), n, value));
  MTNLG_CUDA_LAUNCH_CHECK("fill_kernel");
}

void fill_i32(int32_t* x, int64_t n, int32_t value) {
  if (n <= 0) return;
  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), fill_i32_kernel)(x, n, value);
  MTNLG_CUDA_LAUNCH_CHECK("fill_i32_kernel");
}

void add(void* out, const void* a, const void* b, DType dt, int64_t n) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), add_kernel<T>)(
                      static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n));
  MTNLG_CUDA_LAUNCH_CHECK("add_kernel");
}

void scale(void* x, DType dt, int64_t n, float s) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T, MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), scale_kernel<T>)(static_cast<T*>(x), n, s));
  MTNLG_CUDA_LAUNCH_CHECK("scale_kernel");
}

void convert(void* dst, DType ddt, const void* src, DType sdt, int64_t n) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(ddt, D,
                  MTNLG_DT_SWITCH(sdt, S,
                                  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), convert_kernel<D, S>)(
                                      static_cast<D*>(dst), static_cast<const S*>(src), n)));
  MTNLG_CUDA_LAUNCH_CHECK("convert_kernel");
}

void fill_f64(double* x, int64_t n, double value) {
  if (n <= 0) return;
  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), fill_f64_kernel)(x, n, value);
  MTNLG_CUDA_LAUNCH_CHECK("fill_f64_kernel");
}

void gelu_forward(void* out, const void* inp, DType dt, int64_t n) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), gelu_forward_kernel<T>)(
                      static_cast<T*>(out), static_cast<const T*>(inp), n));
  MTNLG_CUDA_LAUNCH_CHECK("gelu_forward_kernel");
}

void gelu_backward(void* dinp, const void* inp, const void* dout, DType dt, int64_t n) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), gelu_backward_kernel<T>)(
                      static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n));
  MTNLG_CUDA_LAUNCH_CHECK("gelu_backward_kernel");
}

void dropout(void* out, const void* inp, DType dt, int64_t n, double p, uint64_t key, uint64_t base) {
  if (n <= 0) return;
  if (p <= 0) {
    if (out != inp) {
      const int64_t bytes = n * (dt == DType::f32 ? 4 : 2);
      CUDA_CHECK(cudaMemcpyAsync(out, inp, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream()));
    }
    return;
  }
  const float fp = static_cast<float>(p), s = static_cast<float>(1.0 / (1.0 - p));  // as the CPU rounds them
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), dropout_kernel<T>)(
                      static_cast<T*>(out), static_cast<const T*>(inp), n, fp, s, key, base));
  MTNLG_CUDA_LAUNCH_CHECK("dropout_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

void fill(Tensor& x, double value) {
  if (x.dtype() == DType::i32) return k::fill_i32(static_cast<int32_t*>(x.raw()), x.numel(), static_cast<int32_t>(value));
  if (x.dtype() == DType::f64) return k::fill_f64(static_cast<double*>(x.raw()), x.numel(), value);  // step statistics
  k::fill(x.raw(), cuda_dtype("fill", "x", x.dtype()), x.numel(), static_cast<float>(value));
}

void copy(Tensor& dst, const Tensor& src) {
  if (dst.nbytes() == 0 || dst.raw() == src.raw()) return;
  CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), static_cast<size_t>(dst.nbytes()), cudaMemcpyDeviceToDevice, stream()));
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  const DType dt = cuda_dtype("add", "out", out.dtype());
  k::add(out.raw(), a.raw(), b.raw(), dt, out.numel());
}

void scale(Tensor& x, double s) { k::scale(x.raw(), cuda_dtype("scale", "x", x.dtype()), x.numel(), static_cast<float>(s)); }

void convert(Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  k::convert(dst.raw(), cuda_dtype("convert", "dst", dst.dtype()), src.raw(), cuda_dtype("convert", "src", src.dtype()), dst.numel());
}

void gelu_forward(Tensor& out, const Tensor& inp) {
  const DType dt = cuda_dtype("gelu_forward", "out", out.dtype());
  k::gelu_forward(out.raw(), inp.raw(), dt, inp.numel());
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const DType dt = cuda_dtype("gelu_backward", "dinp", dinp.dtype());
  k::gelu_backward(dinp.raw(), inp.raw(), dout.raw(), dt, inp.numel());
}

void dropout_forward(Tensor& out, const Tensor& inp, double p_drop, uint64_t key, uint64_t base_index) {
  const DType dt = cuda_dtype("dropout_forward", "out", out.dtype());
  k::dropout(out.raw(), inp.raw(), dt, inp.numel(), p_drop, key, base_index);
}

}  // namespace mtnlg::cuda
