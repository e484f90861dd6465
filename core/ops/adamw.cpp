// AdamW on the fp32 master parameters, with the optional low-precision copy-out (the
// compute weights): checks once, one CUDA dispatch line (core/cuda/adamw.cu), the CPU
// implementation.
#include "core/ops.hpp"

#include <cmath>

#include "core/ops/common.hpp"

namespace mtnlg::cpu {
namespace {

template <typename T>
void adamw(T* param, const T* grad, T* m, T* v, int64_t n, double lr, double b1, double b2, double eps, double wd,
           int64_t step, double grad_scale) {
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  const T tb1 = static_cast<T>(b1), tb2 = static_cast<T>(b2), gs = static_cast<T>(grad_scale);
  const T step_size = static_cast<T>(lr / bc1), inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bc2));
  const T teps = static_cast<T>(eps), decay = static_cast<T>(lr * wd);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i] * gs;
    T mi = tb1 * m[i] + (T(1) - tb1) * g;
    T vi = tb2 * v[i] + (T(1) - tb2) * g * g;
    m[i] = mi;
    v[i] = vi;
    T denom = std::sqrt(vi) * inv_sqrt_bc2 + teps;
    param[i] -= step_size * mi / denom + decay * param[i];
  }
}

}  // namespace
}  // namespace mtnlg::cpu

namespace mtnlg::ops {

using namespace detail;

namespace {

// Checks shared by both devices; true when the tensors live on CUDA.
bool check_adamw(const char* op, Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p,
                 const std::vector<AdamWSegment>& segments, Tensor* copy_out) {
  const bool on_cuda = same_device(op, {&param, &grad, &m, &v, copy_out});
  same_float_dtype(op, {&param, &grad, &m, &v});
  const int64_t n = param.numel();
  expect_numel(op, "grad", grad, n);
  expect_numel(op, "m", m, n);
  expect_numel(op, "v", v, n);
  if (copy_out && copy_out->defined()) expect_numel(op, "copy_out", *copy_out, n);
  if (p.step < 1) throw_runtime("{}: step must be >= 1 (bias correction), got {}", op, p.step);
  int64_t end = 0;
  for (const auto& s : segments) {
    if (s.numel <= 0) continue;
    if (s.offset < 0 || s.offset + s.numel > n)
      throw_runtime("{}: segment [{}, {}) lies outside the flat buffer of {} elements", op, s.offset,
                    s.offset + s.numel, n);
    if (s.offset < end)
      throw_runtime("{}: segment [{}, {}) overlaps the one before it or is out of order", op, s.offset,
                    s.offset + s.numel);
    end = s.offset + s.numel;
  }
  return on_cuda;
}

}  // namespace

void adamw_flat(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p,
                const std::vector<AdamWSegment>& segments, Tensor* copy_out) {
  if (copy_out && copy_out->defined() && copy_out->raw() == param.raw()) copy_out = nullptr;  // the master is the copy
  const bool on_cuda = check_adamw("adamw", param, grad, m, v, p, segments, copy_out);
  MTNLG_CUDA_DISPATCH(on_cuda, adamw_flat(param, grad, m, v, p, segments, copy_out));
  by_dtype(param.dtype(), [&](auto z) {
    using T = decltype(z);
    for (const auto& s : segments) {
      if (s.numel <= 0) continue;
      const int64_t o = s.offset;
      cpu::adamw<T>(param.kernel_data<T>() + o, grad.kernel_data<T>() + o, m.kernel_data<T>() + o,
                    v.kernel_data<T>() + o, s.numel, p.lr, p.beta1, p.beta2, p.eps,
                    s.weight_decay ? p.weight_decay : 0.0, p.step, p.grad_scale);
      if (copy_out && copy_out->defined()) {
        Tensor dst = copy_out->flat(o, s.numel);
        convert(dst, param.flat(o, s.numel));  // the compute copy, rounded to nearest even
      }
    }
  });
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p, Tensor* copy_out) {
  adamw_flat(param, grad, m, v, p, {AdamWSegment{0, param.numel(), true}}, copy_out);
}

}  // namespace mtnlg::ops
