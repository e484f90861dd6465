// Argument checks and the low-precision adapter shared by the op dispatchers
// (core/ops.cpp, core/ops_attention.cpp).
//
// Dtype roles (the same on the CPU and on CUDA): the activations of one call and the
// forward weights share one dtype, the "activation dtype" (f32, bf16 or f16; f64 on
// the CPU for finite-difference tests). Statistics (mean, rstd, lse, row max, sum of
// exp, target logit, dloss) and parameter gradients are "wide": f64 when the
// activations are f64, f32 otherwise.
#pragma once
#include <deque>
#include <initializer_list>
#include <utility>
#include <vector>

#include "core/tensor.hpp"

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

}  // namespace mtnlg::ops::detail
