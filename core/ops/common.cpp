// The shared pieces of the op dispatchers (core/ops/common.hpp): device and dtype-role
// checks and the low-precision adapter.
#include "core/ops/common.hpp"

#include "core/ops.hpp"

namespace mtnlg::ops::detail {

// True when the tensors live on the CUDA device (then the caller hands the op to the
// CUDA backend, core/cuda/ops_cuda.hpp); without the backend that is an error.
bool same_device(const char* op, std::initializer_list<const Tensor*> ts) {
  Device d = Device::cpu;
  bool first = true;
  for (auto* t : ts) {
    if (!t || !t->defined()) continue;
    if (first) {
      d = t->device();
      first = false;
    } else if (t->device() != d) {
      throw_runtime("{}: tensors on different devices ({} and {}): place every tensor of an op on one device", op,
                    to_string(d), to_string(t->device()));
    }
  }
#ifndef MTNLG_HAVE_CUDA
  if (d == Device::cuda)
    throw_runtime("{}: this build has no CUDA implementation of the op (the CUDA backend is enabled with MTNLG_CUDA)",
                  op);
#endif
  return d == Device::cuda;
}

void same_float_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  DType d = DType::f32;
  bool first = true;
  for (auto* t : ts) {
    if (!t || !t->defined()) continue;
    if (first) {
      d = t->dtype();
      first = false;
    } else if (t->dtype() != d) {
      throw_runtime("{}: mixed dtypes {} and {}", op, to_string(d), to_string(t->dtype()));
    }
  }
  if (d != DType::f32 && d != DType::f64) throw_runtime("{}: dtype {} not supported on the CPU", op, to_string(d));
}

DType act_dtype(const char* op, std::initializer_list<Named> acts, std::initializer_list<Named> wide) {
  const Tensor* first = nullptr;
  const char* first_name = "";
  for (auto& [name, t] : acts) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      first_name = name;
    } else if (t->dtype() != first->dtype()) {
      throw_runtime("{}: {} is {} but {} is {} (activations and forward weights share one dtype)", op, name,
                    to_string(t->dtype()), first_name, to_string(first->dtype()));
    }
  }
  MTNLG_CHECK(first != nullptr, "{}: no activation tensor given", op);
  const DType act = first->dtype();
  if (act == DType::i32) throw_runtime("{}: {} is i32, expected a floating dtype", op, first_name);
  const DType w = wide_dtype(act);
  for (auto& [name, t] : wide)
    if (t && t->defined() && t->dtype() != w)
      throw_runtime("{}: {} must be {} with {} activations (statistics and parameter gradients are wide), got {}", op,
                    name, to_string(w), to_string(act), to_string(t->dtype()));
  return act;
}

const Tensor& Widened::in(const Tensor& t) {
  if (!is_low(t.dtype())) return t;
  Tensor& w = keep_.emplace_back(Tensor::empty(t.shape(), DType::f32, t.device()));
  ops::convert(w, t);
  return w;
}

Tensor& Widened::out(Tensor& t, bool read) {
  if (!is_low(t.dtype())) return t;
  Tensor& w = keep_.emplace_back(Tensor::empty(t.shape(), DType::f32, t.device()));
  if (read) ops::convert(w, t);
  outs_.emplace_back(&t, &w);
  return w;
}

void Widened::store() {
  for (auto& [low, wide] : outs_) ops::convert(*low, *wide);
  outs_.clear();
}

}  // namespace mtnlg::ops::detail
