// What every op family file (core/ops/<family>.cpp) shares: the argument checks, the
// dtype roles, the low-precision adapter of the CPU kernels and the one dispatch line.
//
// An op family lives in two files: core/ops/<family>.cpp (the public ops:: functions of
// core/ops.hpp: shapes and dtype roles checked once for both devices, then one
// MTNLG_CUDA_DISPATCH line, then the CPU implementation) and core/cuda/<family>.cu (the
// CUDA kernels and their Tensor-level entry, core/cuda/ops_cuda.hpp).
//
// Dtype roles (the same on the CPU and on CUDA): the activations of one call and the
// forward weights share one dtype, the "activation dtype" (f32, bf16 or f16; f64 on
// the CPU for finite-difference tests). Statistics (mean, rstd, lse, row max, sum of
// exp, target logit, dloss) and parameter gradients are "wide": f64 when the
// activations are f64, f32 otherwise.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <deque>
#include <type_traits>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/op_checks.hpp"
#include "core/rng.hpp"
#include "core/tensor.hpp"

#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/ops_cuda.hpp"
#include "core/cuda/step_events.hpp"
// The one dispatch line of an op, after its shape and dtype checks:
// `if (tensors are on CUDA) return cuda::<call>;`, timed for logging.gpu_profile under
// this file's family (core/cuda/step_events.hpp: nothing but a branch when off).
#define MTNLG_CUDA_DISPATCH(on_cuda, call)                  \
  if (on_cuda) {                                            \
    const ::mtnlg::cuda::OpScope mtnlg_op_scope_(__FILE__); \
    return ::mtnlg::cuda::call;                             \
  }
#else
// same_device() throws for CUDA tensors in a CPU-only build.
#define MTNLG_CUDA_DISPATCH(on_cuda, call) (void)(on_cuda)
#endif

namespace mtnlg::ops::detail {

// True when the (defined) tensors live on the CUDA device — the caller then hands the op
// to the CUDA backend; mixed devices, or CUDA tensors in a CPU-only build, throw.
bool same_device(const char* op, std::initializer_list<const Tensor*> ts);
// The defined tensors share one dtype, and it is f32 or f64 (what the CPU kernels take).
void same_float_dtype(const char* op, std::initializer_list<const Tensor*> ts);

inline bool is_low(DType d) { return d == DType::bf16 || d == DType::f16; }
// Statistics and parameter gradients of activations in `act`: f64 for f64, else f32.
inline DType wide_dtype(DType act) { return act == DType::f64 ? DType::f64 : DType::f32; }

using Named = std::pair<const char*, const Tensor*>;
// The activation dtype shared by the defined tensors of `acts` (f32, f64, bf16, f16);
// every defined tensor of `wide` must have wide_dtype of it. RuntimeError naming the
// op and the tensor otherwise.
DType act_dtype(const char* op, std::initializer_list<Named> acts, std::initializer_list<Named> wide = {});

// bf16/f16 storage on the CPU: an op runs its f32 kernel on widened copies of its
// low-precision inputs, and store() rounds the f32 results into the low-precision
// outputs (round to nearest even) — fp32 arithmetic with low-precision storage, which
// is what the CUDA kernels do. Wide tensors (f32 statistics, gradients) pass through.
// Aliasing is safe: inputs are copied before any output is written back.
class Widened {
 public:
  Widened() = default;
  Widened(const Widened&) = delete;
  Widened& operator=(const Widened&) = delete;
  const Tensor& in(const Tensor& t);
  const Tensor* in(const Tensor* t) { return (t && t->defined()) ? &in(*t) : t; }
  // `read`: the op also reads the output (accumulates into it).
  Tensor& out(Tensor& t, bool read = false);
  Tensor* out(Tensor* t, bool read = false) { return (t && t->defined()) ? &out(*t, read) : t; }
  void store();

 private:
  std::deque<Tensor> keep_;
  std::vector<std::pair<Tensor*, Tensor*>> outs_;  // (low-precision tensor, its f32 scratch)
};

// The shape checks (core/op_checks.hpp), shared with the CUDA entries.
using op_checks::expect_acc;
using op_checks::expect_i32;
using op_checks::expect_ndim;
using op_checks::expect_numel;
using op_checks::expect_positions;

// ---- CPU kernel helpers ------------------------------------------------------------------
// Runs f(T{}) with T the C++ type of a wide dtype (f32 -> float, f64 -> double).
template <typename F>
void by_dtype(DType d, F&& f) {
  if (d == DType::f32)
    f(float{});
  else
    f(double{});
}
// The kernel pointer of an optional tensor (nullptr when absent).
template <typename T>
T* ptr(const Tensor* t) {
  return (t && t->defined()) ? t->kernel_data<T>() : nullptr;
}

}  // namespace mtnlg::ops::detail

namespace mtnlg::cpu {
// exp(x) for float in plain arithmetic, so loops that call it vectorise (glibc's vector
// math is only declared under -ffast-math). Cephes' polynomial on [-ln2/2, ln2/2] after
// x = n ln2 + r; about 1 ulp, input clamped to the finite range.
inline float exp_vec(float x) {
  x = std::min(88.3762626647949f, std::max(-87.3365447505531f, x));
  const float m = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + m) - m;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  const float y = p * r * r + r + 1.0f;
  return y * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// exp for the CPU kernels' float (exp_vec, vectorises) and double (std::exp).
template <typename T>
inline T exp_any(T v) {
  if constexpr (std::is_same_v<T, float>)
    return exp_vec(v);
  else
    return std::exp(v);
}

// Dropout keep-mask of the CPU kernels (core/cuda/elementwise.cu and attention.cu draw
// the same bits): element e is kept when its uniform draw >= p.
inline bool keep(uint64_t key, uint64_t e, double p) { return philox_uniform(key, 0, e) >= static_cast<float>(p); }
}  // namespace mtnlg::cpu
