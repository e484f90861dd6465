// Elementwise kernels (fill, copy, convert, add, scale, GELU, dropout). CPU reference:
// core/ops/elementwise.cpp.
//
// Gradient contract: gelu_backward and dropout (used for dropout_backward too) WRITE
// their outputs. All loops are grid-stride over int64 indices; arithmetic in fp32; add,
// GELU and dropout move 16-byte packs when their pointers allow (map2 below).
// Dropout uses the CPU's counter mapping exactly (cpu::keep() in core/ops/common.hpp): element e is
// kept iff philox_uniform(key, 0, base + e) >= float(p), and kept values are multiplied
// by float(1/(1-p)), so fp32 outputs are bit-identical to the CPU's.
#include <cstdint>
#include <type_traits>

#include "core/cuda/common.cuh"
#include "core/rng.hpp"

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)

template <typename T>
__global__ void fill_kernel(T* x, int64_t n, float v) {
  const T tv = from_f<T>(v);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = tv;
}

__global__ void fill_i32_kernel(int32_t* x, int64_t n, int32_t v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = v;
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

// out [P, b, a, C] = in [P, a, b, C], one thread per element of out, W = the element's bits.
template <typename W>
__global__ void swap_axes_kernel(W* out, const W* in, int64_t P, int64_t a, int64_t b, int64_t C) {
  const int64_t n = P * a * b * C;
  for (int64_t o = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; o < n; o += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = o % C, i = o / C % a, j = o / (C * a) % b, p = o / (C * a * b);
    out[o] = in[((p * a + i) * b + j) * C + c];
  }
}

// f32 <-> f64 (the f64 router's tensors beside f32 ones): a plain cast.
template <typename D, typename S>
__global__ void convert_wide_kernel(D* dst, const S* src, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = D(src[i]);
}

__global__ void fill_f64_kernel(double* x, int64_t n, double v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = v;
}

// The memory-bound elementwise ops as one loop: out[i] = f(i, a[i], b[i]) in fp32 (b is a
// again for one-input ops), over n elements. With `packed` (every pointer 16-byte
// aligned) each thread moves 16 bytes per load and store — 4 floats or 8 bf16/fp16 — and
// the tail past the last whole pack runs element by element; f sees the same (i, values)
// either way, so the same bits.
template <typename T>
struct alignas(16) Pack16 {
  T v[16 / sizeof(T)];
};

template <typename T, typename F>
__global__ void map2_kernel(T* out, const T* a, const T* b, int64_t n, bool packed, F f) {
  const int64_t tid = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, stride = int64_t(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if (packed) {
    constexpr int P = static_cast<int>(16 / sizeof(T));
    const int64_t packs = n / P;
    for (int64_t j = tid; j < packs; j += stride) {
      const Pack16<T> x = reinterpret_cast<const Pack16<T>*>(a)[j], y = reinterpret_cast<const Pack16<T>*>(b)[j];
      Pack16<T> z;
      for (int k = 0; k < P; ++k) z.v[k] = from_f<T>(f(j * P + k, to_f(x.v[k]), to_f(y.v[k])));
      reinterpret_cast<Pack16<T>*>(out)[j] = z;
    }
    done = packs * P;
  }
  for (int64_t i = done + tid; i < n; i += stride) out[i] = from_f<T>(f(i, to_f(a[i]), to_f(b[i])));
}

struct AddOp {
  __device__ __forceinline__ float operator()(int64_t, float x, float y) const { return x + y; }
};

struct GeluOp {  // y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  __device__ __forceinline__ float operator()(int64_t, float x, float) const {
    const float u = kGeluC * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};

struct GeluBackwardOp {  // (x = the GELU's input, g = the gradient of its output)
  __device__ __forceinline__ float operator()(int64_t, float x, float g) const {
    const float u = kGeluC * (x + 0.044715f * x * x * x);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    const float du = kGeluC * (1.0f + float(3 * 0.044715) * x * x);
    return g * (0.5f * (1.0f + th) + 0.5f * x * sech2 * du);
  }
};

struct DropoutOp {
  float p, s;
  uint64_t key, base;
  DeviceKey dkey;  // key and base from device memory when set
  __device__ __forceinline__ float operator()(int64_t i, float x, float) const {
    return philox_uniform(dkey.key(key), 0, dkey.offset(base) + static_cast<uint64_t>(i)) >= p ? x * s : 0.0f;
  }
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, typename F>
void map2(T* out, const T* a, const T* b, int64_t n, F f, const char* name) {
  const bool packed = aligned16(out) && aligned16(a) && aligned16(b);
  constexpr int64_t P = static_cast<int64_t>(16 / sizeof(T));
  const int64_t work = packed ? n / P + n % P : n;
  MTNLG_LAUNCH(grid_for(work, kThreads), kThreads, 0, stream(), map2_kernel<T, F>)(out, a, b, n, packed, f);
  MTNLG_CUDA_LAUNCH_CHECK(name);
}

}  // namespace

void fill(void* x, DType dt, int64_t n, float value) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(
      dt, T, MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), fill_kernel<T>)(static_cast<T*>(x), n, value));
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
                  map2(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n, AddOp{}, "add"));
}

void scale(void* x, DType dt, int64_t n, float s) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(
      dt, T, MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), scale_kernel<T>)(static_cast<T*>(x), n, s));
  MTNLG_CUDA_LAUNCH_CHECK("scale_kernel");
}

void convert(void* dst, DType ddt, const void* src, DType sdt, int64_t n) {
  if (n <= 0) return;
  if (ddt == DType::f64 || sdt == DType::f64) {
    auto launch = [&](auto* d, const auto* s) {
      using D = std::remove_pointer_t<decltype(d)>;
      using S = std::remove_const_t<std::remove_pointer_t<decltype(s)>>;
      MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), convert_wide_kernel<D, S>)(d, s, n);
    };
    if (ddt == DType::f64 && sdt == DType::f32)
      launch(static_cast<double*>(dst), static_cast<const float*>(src));
    else if (ddt == DType::f32 && sdt == DType::f64)
      launch(static_cast<float*>(dst), static_cast<const double*>(src));
    else if (ddt == DType::f64 && sdt == DType::f64)
      launch(static_cast<double*>(dst), static_cast<const double*>(src));
    else
      fail("convert on CUDA: f64 converts to and from f32 only");
    MTNLG_CUDA_LAUNCH_CHECK("convert_wide_kernel");
    return;
  }
  MTNLG_DT_SWITCH(ddt, D,
                  MTNLG_DT_SWITCH(sdt, S,
                                  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), convert_kernel<D, S>)(
                                      static_cast<D*>(dst), static_cast<const S*>(src), n)));
  MTNLG_CUDA_LAUNCH_CHECK("convert_kernel");
}

template <typename W>
void swap_axes_as(void* out, const void* in, int64_t P, int64_t a, int64_t b, int64_t C) {
  MTNLG_LAUNCH(grid_for(P * a * b * C, kThreads), kThreads, 0, stream(), swap_axes_kernel<W>)
  (static_cast<W*>(out), static_cast<const W*>(in), P, a, b, C);
  MTNLG_CUDA_LAUNCH_CHECK("swap_axes_kernel");
}

void swap_axes(void* out, const void* in, int64_t esize, int64_t P, int64_t a, int64_t b, int64_t C) {
  if (P * a * b * C <= 0) return;
  switch (esize) {
    case 2: return swap_axes_as<uint16_t>(out, in, P, a, b, C);
    case 4: return swap_axes_as<uint32_t>(out, in, P, a, b, C);
    case 8: return swap_axes_as<uint64_t>(out, in, P, a, b, C);
    default: throw_runtime("swap_axes: elements of {} bytes", esize);
  }
}

void fill_f64(double* x, int64_t n, double value) {
  if (n <= 0) return;
  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), fill_f64_kernel)(x, n, value);
  MTNLG_CUDA_LAUNCH_CHECK("fill_f64_kernel");
}

void gelu_forward(void* out, const void* inp, DType dt, int64_t n) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(
      dt, T,
      map2(static_cast<T*>(out), static_cast<const T*>(inp), static_cast<const T*>(inp), n, GeluOp{}, "gelu_forward"));
}

void gelu_backward(void* dinp, const void* inp, const void* dout, DType dt, int64_t n) {
  if (n <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  map2(static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n,
                       GeluBackwardOp{}, "gelu_backward"));
}

void dropout(void* out, const void* inp, DType dt, int64_t n, double p, uint64_t key, uint64_t base,
             const DeviceKey& dkey) {
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
                  map2(static_cast<T*>(out), static_cast<const T*>(inp), static_cast<const T*>(inp), n,
                       DropoutOp{fp, s, key, base, dkey}, "dropout"));
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

void fill(Tensor& x, double value) {
  if (x.dtype() == DType::i32)
    return k::fill_i32(static_cast<int32_t*>(x.raw()), x.numel(), static_cast<int32_t>(value));
  if (x.dtype() == DType::f64) return k::fill_f64(static_cast<double*>(x.raw()), x.numel(), value);  // step statistics
  k::fill(x.raw(), cuda_dtype("fill", "x", x.dtype()), x.numel(), static_cast<float>(value));
}

void copy(Tensor& dst, const Tensor& src) {
  if (dst.nbytes() == 0 || dst.raw() == src.raw()) return;
  CUDA_CHECK(
      cudaMemcpyAsync(dst.raw(), src.raw(), static_cast<size_t>(dst.nbytes()), cudaMemcpyDeviceToDevice, stream()));
}

void swap_axes(Tensor& out, const Tensor& in, int64_t P, int64_t a, int64_t b) {
  k::swap_axes(out.raw(), in.raw(), dtype_size(in.dtype()), P, a, b, out.numel() / (P * a * b));
}

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  const DType dt = cuda_dtype("add", "out", out.dtype());
  k::add(out.raw(), a.raw(), b.raw(), dt, out.numel());
}

void scale(Tensor& x, double s) {
  k::scale(x.raw(), cuda_dtype("scale", "x", x.dtype()), x.numel(), static_cast<float>(s));
}

void convert(Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  if (dst.dtype() == DType::f64 || src.dtype() == DType::f64)  // the f64 router's: f32 <-> f64
    return k::convert(dst.raw(), dst.dtype(), src.raw(), src.dtype(), dst.numel());
  k::convert(dst.raw(), cuda_dtype("convert", "dst", dst.dtype()), src.raw(), cuda_dtype("convert", "src", src.dtype()),
             dst.numel());
}

void gelu_forward(Tensor& out, const Tensor& inp) {
  const DType dt = cuda_dtype("gelu_forward", "out", out.dtype());
  k::gelu_forward(out.raw(), inp.raw(), dt, inp.numel());
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const DType dt = cuda_dtype("gelu_backward", "dinp", dinp.dtype());
  k::gelu_backward(dinp.raw(), inp.raw(), dout.raw(), dt, inp.numel());
}

void dropout_forward(Tensor& out, const Tensor& inp, double p_drop, uint64_t key, uint64_t base_index,
                     const DeviceKey& dkey) {
  const DType dt = cuda_dtype("dropout_forward", "out", out.dtype());
  k::dropout(out.raw(), inp.raw(), dt, inp.numel(), p_drop, key, base_index, dkey);
}

}  // namespace mtnlg::cuda
