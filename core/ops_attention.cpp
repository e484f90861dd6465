// ops::attention_forward_lse / attention_backward_lse (core/ops.hpp): the log-sum-exp
// form of causal attention, the one the model uses on every device. CUDA tensors go to
// the fused kernels (core/cuda/attention.cu); the CPU runs cpu::attention_*_lse
// (core/cpu/ops_cpu.cpp): the forward keeps one row of scores per (b, h) and saves
// lse_i = m_i + log sum_j exp(s_ij - m_i); the backward recomputes p_ij = exp(s_ij -
// lse_i) row by row. bf16/f16 activations run the f32 kernels through Widened, with lse
// in f32, as on CUDA. The probs form (attention_forward/backward) stays as the
// independent reference the tests compare this one with.
#include "core/cpu/ops_cpu.hpp"
#include "core/ops.hpp"
#include "core/ops_checks.hpp"
#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/ops_cuda.hpp"
#endif

namespace mtnlg::ops {

namespace {
void attention_shape(const char* op, const Tensor& qkv, int64_t heads, int64_t& B, int64_t& T, int64_t& D) {
  if (qkv.ndim() != 3) throw_runtime("{}: qkv must be [B,T,3C], got {}", op, shape_str(qkv.shape()));
  if (heads <= 0 || qkv.dim(2) % (3 * heads) != 0)
    throw_runtime("{}: qkv width {} is not 3 x heads ({}) x head size", op, qkv.dim(2), heads);
  B = qkv.dim(0);
  T = qkv.dim(1);
  D = qkv.dim(2) / (3 * heads);
}
void expect_numel(const char* op, const char* name, const Tensor& t, int64_t n) {
  if (t.numel() != n) throw_runtime("{}: {} has {} elements, expected {} (shape {})", op, name, t.numel(), n, shape_str(t.shape()));
}
int64_t heads_total(const AttentionDropout& d, int64_t heads) { return d.heads_total ? d.heads_total : heads; }
}  // namespace

void attention_forward_lse(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads, const AttentionDropout& drop) {
  const char* op = "attention_forward_lse";
  const bool cuda = detail::same_device(op, {&out, &lse, &qkv});
  const DType dt = detail::act_dtype(op, {{"out", &out}, {"qkv", &qkv}}, {{"lse", &lse}});
  int64_t B, T, D;
  attention_shape(op, qkv, heads, B, T, D);
  expect_numel(op, "out", out, B * T * heads * D);
  expect_numel(op, "lse", lse, B * heads * T);
#ifdef MTNLG_HAVE_CUDA
  if (cuda) return cuda::attention_forward_lse(out, lse, qkv, heads, drop);
#else
  (void)cuda;
#endif
  if (detail::is_low(dt)) {
    detail::Widened w;
    attention_forward_lse(w.out(out), lse, w.in(qkv), heads, drop);
    return w.store();
  }
  auto run = [&](auto z) {
    using V = decltype(z);
    cpu::attention_forward_lse<V>(out.kernel_data<V>(), lse.kernel_data<V>(), qkv.kernel_data<V>(), B, T, heads, D, drop.p, drop.key,
                                  drop.sample_offset, drop.head_offset, heads_total(drop, heads));
  };
  if (dt == DType::f32)
    run(float{});
  else
    run(double{});
}

void attention_backward_lse(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t heads, const AttentionDropout& drop) {
  const char* op = "attention_backward_lse";
  const bool cuda = detail::same_device(op, {&dqkv, &dout, &qkv, &out, &lse});
  const DType dt =
      detail::act_dtype(op, {{"dqkv", &dqkv}, {"dout", &dout}, {"qkv", &qkv}, {"out", &out}}, {{"lse", &lse}});
  int64_t B, T, D;
  attention_shape(op, qkv, heads, B, T, D);
  expect_numel(op, "dqkv", dqkv, qkv.numel());
  expect_numel(op, "dout", dout, B * T * heads * D);
  expect_numel(op, "lse", lse, B * heads * T);
  if (out.defined()) expect_numel(op, "out", out, B * T * heads * D);
#ifdef MTNLG_HAVE_CUDA
  if (cuda) return cuda::attention_backward_lse(dqkv, dout, qkv, out, lse, heads, drop);
#else
  (void)cuda;
#endif
  if (detail::is_low(dt)) {
    detail::Widened w;
    attention_backward_lse(w.out(dqkv), w.in(dout), w.in(qkv), out.defined() ? w.in(out) : out, lse, heads, drop);
    return w.store();
  }
  auto run = [&](auto z) {
    using V = decltype(z);
    cpu::attention_backward_lse<V>(dqkv.kernel_data<V>(), dout.kernel_data<V>(), qkv.kernel_data<V>(), lse.kernel_data<V>(), B, T, heads, D, drop.p,
                                   drop.key, drop.sample_offset, drop.head_offset, heads_total(drop, heads));
  };
  if (dt == DType::f32)
    run(float{});
  else
    run(double{});
}

void attention_cached_forward(Tensor& out, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int64_t heads,
                              int64_t past) {
  const char* op = "attention_cached_forward";
  if (detail::same_device(op, {&out, &k_cache, &v_cache, &qkv}))
    throw_runtime("{}: the CUDA backend has no implementation of this op yet", op);
  const DType dt = detail::act_dtype(op, {{"out", &out}, {"k_cache", &k_cache}, {"v_cache", &v_cache}, {"qkv", &qkv}});
  int64_t B, T, D;
  attention_shape(op, qkv, heads, B, T, D);
  if (k_cache.ndim() != 4 || v_cache.shape() != k_cache.shape() || k_cache.dim(0) != B || k_cache.dim(1) != heads ||
      k_cache.dim(3) != D)
    throw_runtime("{}: the caches must be [B, H, capacity, D] = [{}, {}, capacity, {}], got {} and {}", op, B, heads, D,
                  shape_str(k_cache.shape()), shape_str(v_cache.shape()));
  const int64_t cap = k_cache.dim(2);
  if (past < 0 || past + T > cap)
    throw_runtime("{}: {} cached + {} new positions exceed the cache capacity {}", op, past, T, cap);
  expect_numel(op, "out", out, B * T * heads * D);
  if (detail::is_low(dt)) {  // the cache is read and extended: widen it whole, store it back
    detail::Widened w;
    attention_cached_forward(w.out(out), w.out(k_cache, /*read=*/true), w.out(v_cache, /*read=*/true), w.in(qkv), heads,
                             past);
    return w.store();
  }
  auto run = [&](auto z) {
    using V = decltype(z);
    cpu::attention_cached_forward<V>(out.kernel_data<V>(), k_cache.kernel_data<V>(), v_cache.kernel_data<V>(), qkv.kernel_data<V>(), B, T, heads, D,
                                     cap, past);
  };
  if (dt == DType::f32)
    run(float{});
  else
    run(double{});
}

}  // namespace mtnlg::ops
