// SwiGLU, the gated MLP activation of the Llama family: the MLP's first linear layer
// writes [gate | up] side by side in each row (inp [N, 2F]; under tensor parallelism each
// rank's column shard holds its matching halves, [gate_local | up_local]), and
//   out[N, F] = silu(gate) * up,   silu(g) = g * sigmoid(g).
// The backward WRITES d[gate | up] (an activation gradient; there is no parameter):
//   dgate = dout * up * s (1 + g (1 - s)),  dup = dout * g s,  s = sigmoid(g).
// Checks once, one CUDA dispatch line (core/cuda/swiglu.cu), the CPU implementation;
// bf16/f16 run the f32 loop through Widened (fp32 arithmetic, one rounding per store).
#include "core/ops.hpp"

#include <cmath>

#include "core/ops/common.hpp"

namespace mtnlg::cpu {
namespace {

// exp_any: float through exp_vec (core/ops/common.hpp), so the rows vectorise.
template <typename T>
inline T sigmoid(T g) {
  return T(1) / (T(1) + exp_any(-g));
}

template <typename T>
void swiglu_forward(T* out, const T* inp, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* gate = inp + i * 2 * F;
    const T* up = gate + F;
    T* o = out + i * F;
#pragma omp simd
    for (int64_t c = 0; c < F; ++c) o[c] = gate[c] * sigmoid(gate[c]) * up[c];
  }
}

template <typename T>
void swiglu_backward(T* dinp, const T* dout, const T* inp, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* gate = inp + i * 2 * F;
    const T* up = gate + F;
    const T* dy = dout + i * F;
    T* dg = dinp + i * 2 * F;
    T* du = dg + F;
#pragma omp simd
    for (int64_t c = 0; c < F; ++c) {
      const T g = gate[c], s = sigmoid(g), u = up[c], d = dy[c];  // read before dinp (may alias inp) is written
      dg[c] = d * u * s * (T(1) + g * (T(1) - s));
      du[c] = d * g * s;
    }
  }
}

}  // namespace
}  // namespace mtnlg::cpu

namespace mtnlg::ops {

using namespace detail;

namespace {
// N and F of inp [N, 2F]; `out` [N, F] is checked by the caller.
void swiglu_shape(const char* op, const Tensor& inp, int64_t& N, int64_t& F) {
  MTNLG_CHECK(inp.ndim() >= 1, "{}: inp must have a channel dimension", op);
  const int64_t W = inp.dim(-1);
  if (W % 2 != 0) throw_runtime("{}: inp width {} is not 2 x F ([gate | up])", op, W);
  F = W / 2;
  N = W ? inp.numel() / W : 0;
}
}  // namespace

void swiglu_forward(Tensor& out, const Tensor& inp) {
  const char* op = "swiglu_forward";
  const bool cuda = same_device(op, {&out, &inp});
  const DType dt = act_dtype(op, {{"out", &out}, {"inp", &inp}});
  int64_t N, F;
  swiglu_shape(op, inp, N, F);
  expect_numel(op, "out", out, N * F);
  MTNLG_CUDA_DISPATCH(cuda, swiglu_forward(out, inp));
  if (is_low(dt)) {
    Widened wd;
    swiglu_forward(wd.out(out), wd.in(inp));
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::swiglu_forward<T>(out.kernel_data<T>(), inp.kernel_data<T>(), N, F);
  });
}

void swiglu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) {
  const char* op = "swiglu_backward";
  const bool cuda = same_device(op, {&dinp, &dout, &inp});
  const DType dt = act_dtype(op, {{"dinp", &dinp}, {"dout", &dout}, {"inp", &inp}});
  int64_t N, F;
  swiglu_shape(op, inp, N, F);
  expect_numel(op, "dinp", dinp, N * 2 * F);
  expect_numel(op, "dout", dout, N * F);
  MTNLG_CUDA_DISPATCH(cuda, swiglu_backward(dinp, dout, inp));
  if (is_low(dt)) {
    Widened wd;
    swiglu_backward(wd.out(dinp), wd.in(dout), wd.in(inp));
    return wd.store();
  }
  by_dtype(dt, [&](auto z) {
    using T = decltype(z);
    cpu::swiglu_backward<T>(dinp.kernel_data<T>(), dout.kernel_data<T>(), inp.kernel_data<T>(), N, F);
  });
}

}  // namespace mtnlg::ops
