// Argument checks shared by the op dispatchers (core/ops.cpp, core/ops_attention.cpp).
#pragma once
#include <initializer_list>

#include "core/tensor.hpp"

namespace mtnlg::ops::detail {

// True when the (defined) tensors live on the CUDA device — the caller then hands the op
// to the CUDA backend; mixed devices, or CUDA tensors in a CPU-only build, throw.
bool same_device(const char* op, std::initializer_list<const Tensor*> ts);
// The defined tensors share one dtype, and it is f32 or f64 (what the CPU kernels take).
void same_float_dtype(const char* op, std::initializer_list<const Tensor*> ts);

}  // namespace mtnlg::ops::detail
