// Elementwise ops (fill, copy, convert, add, scale, GELU, dropout): the checks, the one
// CUDA dispatch line (core/cuda/elementwise.cu) and the CPU implementation.
// bf16/f16 storage on the CPU runs the f32 loop through Widened (fp32 arithmetic,
// round-to-nearest-even stores), as the CUDA kernels do.
#include "core/ops.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/half.hpp"

#include "core/ops/common.hpp"

namespace mtnlg::cpu {
namespace {

constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi)

// GELU with 0.5 (1 + tanh(u)) written as the logistic s = 1 / (1 + exp(-2u)) (the same
// function, without the cancellation of 1 + tanh near -1): y = x s, and
// dy/dx = s + 2 x s (1 - s) du/dx. Float uses exp_vec (vectorises; core/ops/common.hpp);
// double std::exp.
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T x = inp[i];
    T u = static_cast<T>(kGeluC) * (x + T(0.044715) * x * x * x);
    out[i] = x / (T(1) + exp_any(T(-2) * u));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T x = inp[i];
    T u = static_cast<T>(kGeluC) * (x + T(0.044715) * x * x * x);
    T sg = T(1) / (T(1) + exp_any(T(-2) * u));
    T du = static_cast<T>(kGeluC) * (T(1) + T(3 * 0.044715) * x * x);
    dinp[i] = dout[i] * (sg + T(2) * x * sg * (T(1) - sg) * du);
  }
}

template <typename T>
void dropout(T* out, const T* inp, int64_t n, double p, uint64_t key, uint64_t base) {
  if (p <= 0) {
    if (out != inp)
      for (int64_t i = 0; i < n; ++i) out[i] = inp[i];
    return;
  }
  T s = static_cast<T>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = keep(key, base + i, p) ? inp[i] * s : T(0);
}

}  // namespace
}  // namespace mtnlg::cpu

namespace mtnlg::ops {

using namespace detail;

void fill(Tensor& x, double value) {
  MTNLG_CUDA_DISPATCH(same_device("fill", {&x}), fill(x, value));
  switch (x.dtype()) {
    case DType::f32: {
      float* p = x.kernel_data<float>();
      float v = static_cast<float>(value);
      for (int64_t i = 0; i < x.numel(); ++i) p[i] = v;
      break;
    }
    case DType::f64: {
      double* p = x.kernel_data<double>();
      for (int64_t i = 0; i < x.numel(); ++i) p[i] = value;
      break;
    }
    case DType::i32: {
      int32_t* p = x.kernel_data<int32_t>();
      for (int64_t i = 0; i < x.numel(); ++i) p[i] = static_cast<int32_t>(value);
      break;
    }
    case DType::bf16:
    case DType::f16: {
      const float f = static_cast<float>(value);
      const uint16_t h = x.dtype() == DType::bf16 ? half::f32_to_bf16(f) : half::f32_to_f16(f);
      uint16_t* p = x.kernel_data<uint16_t>();
      for (int64_t i = 0; i < x.numel(); ++i) p[i] = h;
      break;
    }
  }
}

void copy(Tensor& dst, const Tensor& src) {
  const bool cuda = same_device("copy", {&dst, &src});
  expect_numel("copy", "src", src, dst.numel());
  if (dst.dtype() != src.dtype())
    throw_runtime("copy: dtype {} -> {} needs ops::convert", to_string(src.dtype()), to_string(dst.dtype()));
  MTNLG_CUDA_DISPATCH(cuda, copy(dst, src));
  std::memmove(dst.raw(), src.raw(), static_cast<size_t>(dst.nbytes()));
}
void swap_axes(Tensor& out, const Tensor& in, int64_t P, int64_t a, int64_t b) {
  const bool cuda = same_device("swap_axes", {&out, &in});
  expect_numel("swap_axes", "in", in, out.numel());
  if (out.dtype() != in.dtype())
    throw_runtime("swap_axes: dtype {} -> {} needs ops::convert", to_string(in.dtype()), to_string(out.dtype()));
  if (P < 1 || a < 1 || b < 1 || out.numel() % (P * a * b) != 0)
    throw_runtime("swap_axes: {} elements are not [{}, {}, {}, inner]", out.numel(), P, a, b);
  MTNLG_CUDA_DISPATCH(cuda, swap_axes(out, in, P, a, b));
  const int64_t e = dtype_size(in.dtype()), run = out.numel() / (P * a * b) * e;
  const char* src = in.kernel_data<char>();
  char* dst = out.kernel_data<char>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t p = 0; p < P; ++p)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t i = 0; i < a; ++i)
        std::memcpy(dst + ((p * b + j) * a + i) * run, src + ((p * a + i) * b + j) * run, static_cast<size_t>(run));
}

namespace {
double load_as_double(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return t.kernel_data<float>()[i];
    case DType::f64: return t.kernel_data<double>()[i];
    case DType::bf16: return half::bf16_to_f32(t.kernel_data<uint16_t>()[i]);
    case DType::f16: return half::f16_to_f32(t.kernel_data<uint16_t>()[i]);
    case DType::i32: return t.kernel_data<int32_t>()[i];
  }
  return 0;
}
void store_double(Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32: t.kernel_data<float>()[i] = static_cast<float>(v); break;
    case DType::f64: t.kernel_data<double>()[i] = v; break;
    case DType::bf16: t.kernel_data<uint16_t>()[i] = half::f32_to_bf16(static_cast<float>(v)); break;
    case DType::f16: t.kernel_data<uint16_t>()[i] = half::f32_to_f16(static_cast<float>(v)); break;
    case DType::i32: t.kernel_data<int32_t>()[i] = static_cast<int32_t>(v); break;
  }
}
}  // namespace

void convert(Tensor& dst, const Tensor& src) {
  const bool cuda = same_device("convert", {&dst, &src});
  expect_numel("convert", "src", src, dst.numel());
  if (dst.dtype() == src.dtype()) return copy(dst, src);
  MTNLG_CUDA_DISPATCH(cuda, convert(dst, src));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < dst.numel(); ++i) store_double(dst, i, load_as_double(src, i));
}

// Every op below: CUDA tensors go to the CUDA backend; on the CPU the dtype roles are
// checked once (act_dtype), bf16/f16 activations run the f32 kernel through Widened,
// and f32/f64 run the kernel instantiated for their type.

void add(Tensor& out, const Tensor& a, const Tensor& b) {
  const bool cuda = same_device("add", {&out, &a, &b});
  const DType dt = act_dtype("add", {{"out", &out}, {"a", &a}, {"b", &b}});
  expect_numel("add", "a", a, out.numel());
  expect_numel("add", "b", b, out.numel());
  MTNLG_CUDA_DISPATCH(cuda, add(out, a, b));
  if (is_low(dt)) {
    Widened w;
    add(w.out(out), w.in(a), w.in(b));
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    T* o = out.kernel_data<T>();
    const T *x = a.kernel_data<T>(), *y = b.kernel_data<T>();
    int64_t n = out.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  });
}

void add_inplace(Tensor& acc, const Tensor& x) { add(acc, acc, x); }

void scale(Tensor& x, double s) {
  MTNLG_CUDA_DISPATCH(same_device("scale", {&x}), scale(x, s));
  const DType dt = act_dtype("scale", {{"x", &x}});
  if (is_low(dt)) {
    Widened w;
    scale(w.out(x, true), s);
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    T* p = x.kernel_data<T>();
    T ts = static_cast<T>(s);
    int64_t n = x.numel();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) p[i] *= ts;
  });
}

void gelu_forward(Tensor& out, const Tensor& inp) {
  const bool cuda = same_device("gelu_forward", {&out, &inp});
  const DType dt = act_dtype("gelu_forward", {{"out", &out}, {"inp", &inp}});
  expect_numel("gelu_forward", "out", out, inp.numel());
  MTNLG_CUDA_DISPATCH(cuda, gelu_forward(out, inp));
  if (is_low(dt)) {
    Widened wd;
    gelu_forward(wd.out(out), wd.in(inp));
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::gelu_forward<T>(out.kernel_data<T>(), inp.kernel_data<T>(), inp.numel());
  });
}

void gelu_backward(Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const bool cuda = same_device("gelu_backward", {&dinp, &inp, &dout});
  const DType dt = act_dtype("gelu_backward", {{"dinp", &dinp}, {"inp", &inp}, {"dout", &dout}});
  expect_numel("gelu_backward", "dinp", dinp, inp.numel());
  expect_numel("gelu_backward", "dout", dout, inp.numel());
  MTNLG_CUDA_DISPATCH(cuda, gelu_backward(dinp, inp, dout));
  if (is_low(dt)) {
    Widened wd;
    gelu_backward(wd.out(dinp), wd.in(inp), wd.in(dout));
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::gelu_backward<T>(dinp.kernel_data<T>(), inp.kernel_data<T>(), dout.kernel_data<T>(), inp.numel());
  });
}

void dropout_forward(Tensor& out, const Tensor& inp, double p, uint64_t key, uint64_t base_index,
                     [[maybe_unused]] const DeviceKey& dkey) {  // CUDA only
  const bool cuda = same_device("dropout_forward", {&out, &inp});
  const DType dt = act_dtype("dropout_forward", {{"out", &out}, {"inp", &inp}});
  expect_numel("dropout_forward", "out", out, inp.numel());
  if (p <= 0) {  // identity: no widening, no copy when in place
    if (out.raw() != inp.raw()) copy(out, inp);
    return;
  }
  MTNLG_CUDA_DISPATCH(cuda, dropout_forward(out, inp, p, key, base_index, dkey));
  if (is_low(dt)) {
    Widened wd;
    dropout_forward(wd.out(out), wd.in(inp), p, key, base_index);
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::dropout<T>(out.kernel_data<T>(), inp.kernel_data<T>(), inp.numel(), p, key, base_index);
  });
}

void dropout_backward(Tensor& dinp, const Tensor& dout, double p, uint64_t key, uint64_t base_index,
                      const DeviceKey& dkey) {
  // The mask and scale are the same as forward: dinp = dout * mask / (1-p).
  dropout_forward(dinp, dout, p, key, base_index, dkey);
}

}  // namespace mtnlg::ops
