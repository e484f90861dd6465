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

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p, Tensor* copy_out) {
  MTNLG_CUDA_DISPATCH(same_device("adamw_step", {&param, &grad, &m, &v, copy_out}), adamw_step(param, grad, m, v, p, copy_out));
  same_float_dtype("adamw_step", {&param, &grad, &m, &v});
  int64_t n = param.numel();
  expect_numel("adamw_step", "grad", grad, n);
  expect_numel("adamw_step", "m", m, n);
  expect_numel("adamw_step", "v", v, n);
  by_dtype(param.dtype(), [&](auto z) {
    using T = decltype(z);
    cpu::adamw<T>(param.kernel_data<T>(), grad.kernel_data<T>(), m.kernel_data<T>(), v.kernel_data<T>(), n, p.lr, p.beta1, p.beta2, p.eps,
                  p.weight_decay, p.step, p.grad_scale);
  });
  if (copy_out && copy_out->defined() && copy_out->raw() != param.raw()) {
    expect_numel("adamw_step", "copy_out", *copy_out, n);
    convert(*copy_out, param);  // the compute copy of the weights, rounded to nearest even
  }
}

}  // namespace mtnlg::ops
