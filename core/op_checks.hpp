// Shape checks of the op entries, shared by the dispatchers of core/ops/ and the CUDA
// entries of core/cuda/: each throws RuntimeError naming the op and the argument.
#pragma once
#include <cstdint>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace mtnlg::op_checks {

inline void expect_numel(const char* op, const char* name, const Tensor& t, int64_t n) {
  if (t.numel() != n)
    throw_runtime("{}: {} has {} elements, expected {} (shape {})", op, name, t.numel(), n, shape_str(t.shape()));
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
// The attention's packed qkv [B, T, G*(H/G+2)*D] (groups G, query heads H, head size D):
// per group, its H/G query heads, then its key, then its value (G == H: per head [q | k | v]).
struct QkvShape {
  int64_t B = 0, T = 0, H = 0, G = 0, D = 0;
  int64_t per_group() const { return H / G; }               // query heads per group
  int64_t group_width() const { return (H / G + 2) * D; }   // a group's columns in a row
  int64_t row() const { return G * group_width(); }         // a qkv row
  int64_t normed_heads() const { return G * (H / G + 1); }  // a row's query and key heads
};
// groups 0 means heads (one key/value head per query head).
inline QkvShape qkv_shape(const char* op, const Tensor& qkv, int64_t heads, int64_t groups) {
  if (qkv.ndim() != 3) throw_runtime("{}: qkv must be [B, T, G*(H/G+2)*D], got {}", op, shape_str(qkv.shape()));
  QkvShape s;
  s.H = heads;
  s.G = groups ? groups : heads;
  if (s.H <= 0 || s.G <= 0 || s.H % s.G != 0)
    throw_runtime("{}: heads {} is not a positive multiple of the query groups {}", op, s.H, s.G);
  const int64_t blocks = s.G * (s.H / s.G + 2);
  if (qkv.dim(2) % blocks != 0)
    throw_runtime("{}: qkv width {} is not groups ({}) x (heads/groups + 2) x head size", op, qkv.dim(2), s.G);
  s.B = qkv.dim(0);
  s.T = qkv.dim(1);
  s.D = qkv.dim(2) / blocks;
  return s;
}

// The f64 step-statistics accumulator of n values.
inline void expect_acc(const char* op, const Tensor& acc, int64_t n) {
  if (acc.dtype() != DType::f64 || acc.numel() != n)
    throw_runtime("{}: acc must be f64 with {} elements, got {} {}", op, n, to_string(acc.dtype()),
                  shape_str(acc.shape()));
}

}  // namespace mtnlg::op_checks
