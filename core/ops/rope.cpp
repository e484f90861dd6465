// Rotary position embedding (RoPE) on the q and k heads of the attention's packed qkv:
// checks once, one CUDA dispatch line (core/cuda/rope.cu), the CPU implementation.
//
// Head vector x of a query or key at position pos = past + t (t the row's position in its
// sample; the attention sees whole sequences, so no sequence-parallel offset), its first
// rot_dim = D * percent dims rotated in pairs (x_a, x_b) by angle pos * inv_freq[i]:
//   x_a' = x_a cos - x_b sin,  x_b' = x_b cos + x_a sin,
// pairs (i, i + rot_dim/2) (rotate-half, Megatron-Core's and Hugging Face's default) or
// (2i, 2i+1) (interleaved), i < rot_dim/2; the other dims and the values pass through.
// The angle and its cos/sin are fp32 (the f32 kernel: float(pos) * float(inv_freq), then
// cosf/sinf, as Megatron-Core and Hugging Face compute them), fp64 for f64 tensors.
// The backward is the same rotation by -angle (a rotation's transpose). Nothing is saved.
// Gradient contract: no parameters; dqkv is WRITTEN.
#include "core/ops.hpp"

#include <cmath>
#include <vector>

#include "core/ops/common.hpp"

namespace mtnlg::cpu {
namespace {

// Rotates, in place, the q and k heads of x [B, T, G*(Q+2)*D] (Q query heads per group);
// sign -1 rotates by -angle.
template <typename T>
void rope_inplace(T* x, const op_checks::QkvShape& s, int64_t rot, const ops::RopeParams& p, int64_t past, int sign) {
  const int64_t half = rot / 2, Q = s.per_group(), row = s.row();
  std::vector<T> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[static_cast<size_t>(i)] = static_cast<T>(p.inv_freq(i, rot));
#pragma omp parallel
  {
    std::vector<T> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < s.B * s.T; ++r) {
      const T pos = static_cast<T>(past + r % s.T);
      for (int64_t i = 0; i < half; ++i) {
        const T a = pos * inv[static_cast<size_t>(i)];
        cs[static_cast<size_t>(i)] = std::cos(a);
        sn[static_cast<size_t>(i)] = sign > 0 ? std::sin(a) : -std::sin(a);
      }
      for (int64_t g = 0; g < s.G; ++g)
        for (int64_t blk = 0; blk <= Q; ++blk) {  // the group's query heads and its key
          T* h = x + r * row + (g * (Q + 2) + blk) * s.D;
          for (int64_t i = 0; i < half; ++i) {
            const int64_t ia = p.interleaved ? 2 * i : i, ib = p.interleaved ? 2 * i + 1 : i + half;
            const T xa = h[ia], xb = h[ib], c = cs[static_cast<size_t>(i)], sv = sn[static_cast<size_t>(i)];
            h[ia] = xa * c - xb * sv;
            h[ib] = xb * c + xa * sv;
          }
        }
    }
  }
}

}  // namespace
}  // namespace mtnlg::cpu

namespace mtnlg::ops {

using namespace detail;

int64_t rope_rot_dim(const RopeParams& p, int64_t head_dim) {
  // Nearest integer, so that a percent written in decimal counts (0.28 of 50 is 14.000000000000002).
  const double r = static_cast<double>(head_dim) * p.percent;
  const auto rot = static_cast<int64_t>(std::llround(r));
  if (!(p.percent > 0 && p.percent <= 1) || std::fabs(r - static_cast<double>(rot)) > 1e-9 * r || rot <= 0 ||
      rot % 2 != 0)
    throw_runtime("rope: head size {} x rotary_percent {} is not a positive even number of dims", head_dim, p.percent);
  return rot;
}

std::vector<double> rope_inv_freq(const RopeParams& p, int64_t rot_dim) {
  std::vector<double> f(static_cast<size_t>(rot_dim / 2));
  for (int64_t i = 0; i < rot_dim / 2; ++i) f[static_cast<size_t>(i)] = p.inv_freq(i, rot_dim);
  return f;
}

namespace {

// The checks of both directions; the geometry and rot_dim.
op_checks::QkvShape rope_checks(const char* op, const Tensor& out, const Tensor& in, int64_t heads, int64_t groups,
                                const RopeParams& p, int64_t past, int64_t& rot) {
  const op_checks::QkvShape s = op_checks::qkv_shape(op, in, heads, groups);
  expect_numel(op, "out", out, in.numel());
  if (!(p.base > 0)) throw_runtime("{}: rotary base {} must be positive", op, p.base);
  if (p.scaling && !(p.factor > 0 && p.low_freq_factor > 0 && p.high_freq_factor > p.low_freq_factor &&
                     p.original_max_positions > 0))
    throw_runtime("{}: rope scaling needs factor > 0 and 0 < low_freq_factor < high_freq_factor (got {}, {}, {})", op,
                  p.factor, p.low_freq_factor, p.high_freq_factor);
  if (past < 0) throw_runtime("{}: past {} is negative", op, past);
  const char *o = static_cast<const char*>(out.raw()), *i = static_cast<const char*>(in.raw());
  if (o != i && o < i + in.nbytes() && i < o + out.nbytes())
    throw_runtime("{}: out overlaps the input without being it", op);
  rot = rope_rot_dim(p, s.D);
  return s;
}

void rope_cpu(Tensor& out, const Tensor& in, const op_checks::QkvShape& s, int64_t rot, const RopeParams& p,
              int64_t past, int sign, DType dt) {
  Widened wd;  // passes f32/f64 through; bf16/f16 rotate an f32 copy, rounded once at the store
  const bool in_place = out.raw() == in.raw();
  Tensor& o = wd.out(out, /*read=*/in_place);  // out of place, its old values are not read
  if (!in_place) copy(o, wd.in(in));
  by_dtype(is_low(dt) ? DType::f32 : dt, [&](auto z) {
    using T = decltype(z);
    cpu::rope_inplace<T>(o.kernel_data<T>(), s, rot, p, past, sign);
  });
  wd.store();
}

}  // namespace

void rope_forward(Tensor& out, const Tensor& qkv, int64_t heads, int64_t groups, const RopeParams& p, int64_t past) {
  const char* op = "rope_forward";
  const bool cuda = same_device(op, {&out, &qkv});
  const DType dt = act_dtype(op, {{"out", &out}, {"qkv", &qkv}});
  int64_t rot = 0;
  const op_checks::QkvShape s = rope_checks(op, out, qkv, heads, groups, p, past, rot);
  MTNLG_CUDA_DISPATCH(cuda, rope_forward(out, qkv, heads, groups, p, past));
  rope_cpu(out, qkv, s, rot, p, past, +1, dt);
}

void rope_backward(Tensor& dqkv, const Tensor& dout, int64_t heads, int64_t groups, const RopeParams& p, int64_t past) {
  const char* op = "rope_backward";
  const bool cuda = same_device(op, {&dqkv, &dout});
  const DType dt = act_dtype(op, {{"dqkv", &dqkv}, {"dout", &dout}});
  int64_t rot = 0;
  const op_checks::QkvShape s = rope_checks(op, dqkv, dout, heads, groups, p, past, rot);
  MTNLG_CUDA_DISPATCH(cuda, rope_backward(dqkv, dout, heads, groups, p, past));
  rope_cpu(dqkv, dout, s, rot, p, past, -1, dt);
}

}  // namespace mtnlg::ops
