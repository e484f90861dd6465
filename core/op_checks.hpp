// Shape checks of the op entries, shared by the dispatchers of core/ops/ and the CUDA
// entries of core/cuda/: each throws RuntimeError naming the op and the argument.
#pragma once
#include <cstdint>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace mtnlg::op_checks {

inline void expect_numel(const char* op, const char* name, const Tensor& t, int64_t n) {
  if (t.numel() != n) throw_runtime("{}: {} has {} elements, expected {} (shape {})", op, name, t.numel(), n, shape_str(t.shape()));
}
inline void expect_ndim(const char* op, const char* name, const Tensor& t, int64_t nd) {
  if (t.ndim() != nd) throw_runtime("{}: {} must have {} dimensions, got shape {}", op, name, nd, shape_str(t.shape()));
}
inline void expect_i32(const char* op, const char* name, const Tensor& t) {
  if (t.dtype() != DType::i32) throw_runtime("{}: {} must be i32, got {}", op, name, to_string(t.dtype()));
}
inline void expect_positions(const char* op, int64_t seq_len, int64_t table_rows) {
  if (seq_len <= 0 || seq_len > table_rows)
    throw_runtime("{}: sequence {} outside the position table (1..{})", op, seq_len, table_rows);
}
// The f64 step-statistics accumulator of n values.
inline void expect_acc(const char* op, const Tensor& acc, int64_t n) {
  if (acc.dtype() != DType::f64 || acc.numel() != n)
    throw_runtime("{}: acc must be f64 with {} elements, got {} {}", op, n, to_string(acc.dtype()), shape_str(acc.shape()));
}

}  // namespace mtnlg::op_checks
