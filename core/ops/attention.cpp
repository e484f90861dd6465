// Causal self-attention: the log-sum-exp form the model uses on every device
// (attention_forward_lse / attention_backward_lse: CUDA in core/cuda/attention.cu, the
// CPU below keeps one row of scores per (b, h) and saves lse_i = m_i + log sum_j
// exp(s_ij - m_i); the backward recomputes p_ij = exp(s_ij - lse_i) row by row), the
// probs form ([B,H,T,T] saved, CPU only) that the tests use as an independent
// reference, and the KV-cache form for generation. bf16/f16 activations run the f32
// kernels through Widened with lse in f32, as on CUDA.
#include "core/ops.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/common.hpp"
#ifdef MTNLG_HAVE_CUDA
#include "core/cuda/cudnn_attention.hpp"
#endif

namespace mtnlg::cpu {
namespace {

// First mask index of (global sample, global head) in attention dropout: element (i, j)
// is base + i*T + j, so any split of samples or heads draws the same mask.
inline uint64_t attention_mask_base(int64_t sample, int64_t head, int64_t heads_total, int64_t T) {
  return static_cast<uint64_t>((sample * heads_total + head) * T * T);
}


// Row softmax of q's scores against n keys (key j at k0 + j * kstride), scaled by
// `scale`: p[j] = exp(s_j - m) / sum_j exp(s_j - m) for j < n. Returns m + log(sum), the
// row's log-sum-exp. One arithmetic order for every form (saved probs, lse, KV cache).
template <typename T>
T softmax_row(const T* q, const T* k0, int64_t kstride, int64_t n, int64_t D, T scale, T* p) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    const T* k = k0 + j * kstride;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < D; ++d) s += q[d] * k[d];
    p[j] = s * scale;
    mx = std::max(mx, p[j]);
  }
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - mx);
    sum += p[j];
  }
  const T inv = T(1) / sum;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv;
  return mx + std::log(sum);
}

// Causal attention, both saved forms in one kernel: row i's softmax lives in `probs`
// (the [B,H,T,T] form, zeros above the diagonal) or in a per-(b,h) scratch row; `lse`
// (when given) saves m_i + log sum_j exp(s_ij - m_i), the log-sum-exp form's statistic.
template <typename T>
void attention_forward_rows(T* out, T* probs, T* lse, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D, double p,
                            uint64_t key, int64_t sample_offset, int64_t head_offset, int64_t heads_total) {
  const int64_t row = H * 3 * D;  // qkv row stride
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  const T dscale = p > 0 ? static_cast<T>(1.0 / (1.0 - p)) : T(1);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const T* base = qkv + b * Tn * row + h * 3 * D;
      std::vector<T> scratch(probs ? 0 : static_cast<size_t>(Tn));
      const uint64_t mask_base = attention_mask_base(sample_offset + b, head_offset + h, heads_total, Tn);
      for (int64_t i = 0; i < Tn; ++i) {
        const T* q = base + i * row;
        T* Pi = probs ? probs + ((b * H + h) * Tn + i) * Tn : scratch.data();
        const T row_lse = softmax_row(q, base + D, row, i + 1, D, scale, Pi);
        if (lse) lse[(b * H + h) * Tn + i] = row_lse;
        if (probs)
          for (int64_t j = i + 1; j < Tn; ++j) Pi[j] = 0;
        T* o = out + (b * Tn + i) * H * D + h * D;
        for (int64_t d = 0; d < D; ++d) o[d] = 0;
        for (int64_t j = 0; j <= i; ++j) {
          T pj = Pi[j];
          if (p > 0) pj = keep(key, mask_base + i * Tn + j, p) ? pj * dscale : T(0);
          const T* v = base + j * row + 2 * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) o[d] += pj * v[d];
        }
      }
    }
  }
}

// The backward of both forms: row i's probabilities come from `probs`, or are
// recomputed as exp(s_ij - lse_i) (flash attention's backward). dqkv is written (=).
template <typename T>
void attention_backward_rows(T* dqkv, const T* dout, const T* qkv, const T* probs, const T* lse, int64_t B, int64_t Tn,
                             int64_t H, int64_t D, double p, uint64_t key, int64_t sample_offset, int64_t head_offset,
                             int64_t heads_total) {
  const int64_t row = H * 3 * D;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  const T dscale = p > 0 ? static_cast<T>(1.0 / (1.0 - p)) : T(1);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const T* base = qkv + b * Tn * row + h * 3 * D;
      T* dbase = dqkv + b * Tn * row + h * 3 * D;
      const uint64_t mask_base = attention_mask_base(sample_offset + b, head_offset + h, heads_total, Tn);
      for (int64_t i = 0; i < Tn; ++i)
        for (int64_t d = 0; d < 3 * D; ++d) dbase[i * row + d] = 0;
      std::vector<T> scratch(probs ? 0 : static_cast<size_t>(Tn)), dP(static_cast<size_t>(Tn));
      for (int64_t i = 0; i < Tn; ++i) {
        const T* q = base + i * row;
        const T* Pi = probs ? probs + ((b * H + h) * Tn + i) * Tn : scratch.data();
        if (!probs) {  // recompute row i from the saved log-sum-exp
          const T l = lse[(b * H + h) * Tn + i];
          for (int64_t j = 0; j <= i; ++j) {
            const T* k = base + j * row + D;
            T s = 0;
#pragma omp simd reduction(+ : s)
            for (int64_t d = 0; d < D; ++d) s += q[d] * k[d];
            scratch[static_cast<size_t>(j)] = std::exp(s * scale - l);
          }
        }
        const T* dO = dout + (b * Tn + i) * H * D + h * D;
        // dP'_ij = dO_i . v_j ; dv_j += P'_ij dO_i ; dP = dP' * mask * dscale
        T dot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const T* v = base + j * row + 2 * D;
          T* dv = dbase + j * row + 2 * D;
          const bool kept = p <= 0 || keep(key, mask_base + i * Tn + j, p);
          const T pj = kept ? Pi[j] * dscale : T(0);
          T g = 0;
#pragma omp simd reduction(+ : g)
          for (int64_t d = 0; d < D; ++d) {
            g += dO[d] * v[d];
            dv[d] += pj * dO[d];
          }
          dP[j] = kept ? g * dscale : T(0);
          dot += Pi[j] * dP[j];
        }
        T* dq = dbase + i * row;
        for (int64_t j = 0; j <= i; ++j) {
          const T ds = Pi[j] * (dP[j] - dot) * scale;
          const T* k = base + j * row + D;
          T* dk = dbase + j * row + D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += ds * k[d];
            dk[d] += ds * q[d];
          }
        }
      }
    }
  }
}


template <typename T>
void attention_forward(T* out, T* probs, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D, double p,
                       uint64_t key, int64_t sample_offset, int64_t head_offset, int64_t heads_total) {
  attention_forward_rows<T>(out, probs, nullptr, qkv, B, Tn, H, D, p, key, sample_offset, head_offset, heads_total);
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* probs, int64_t B, int64_t Tn, int64_t H, int64_t D,
                        double p, uint64_t key, int64_t sample_offset, int64_t head_offset, int64_t heads_total) {
  attention_backward_rows<T>(dqkv, dout, qkv, probs, nullptr, B, Tn, H, D, p, key, sample_offset, head_offset, heads_total);
}

template <typename T>
void attention_forward_lse(T* out, T* lse, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D, double p,
                           uint64_t key, int64_t sample_offset, int64_t head_offset, int64_t heads_total) {
  attention_forward_rows<T>(out, nullptr, lse, qkv, B, Tn, H, D, p, key, sample_offset, head_offset, heads_total);
}

template <typename T>
void attention_backward_lse(T* dqkv, const T* dout, const T* qkv, const T* lse, int64_t B, int64_t Tn, int64_t H,
                            int64_t D, double p, uint64_t key, int64_t sample_offset, int64_t head_offset,
                            int64_t heads_total) {
  attention_backward_rows<T>(dqkv, dout, qkv, nullptr, lse, B, Tn, H, D, p, key, sample_offset, head_offset, heads_total);
}

template <typename T>
void attention_cached_forward(T* out, T* k_cache, T* v_cache, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D,
                              int64_t capacity, int64_t past) {
  const int64_t row = H * 3 * D;
  // 1) append the new keys and values at positions [past, past + Tn)
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      T* kc = k_cache + ((b * H + h) * capacity) * D;
      T* vc = v_cache + ((b * H + h) * capacity) * D;
      for (int64_t i = 0; i < Tn; ++i) {
        const T* src = qkv + (b * Tn + i) * row + h * 3 * D;
        std::copy(src + D, src + 2 * D, kc + (past + i) * D);
        std::copy(src + 2 * D, src + 3 * D, vc + (past + i) * D);
      }
    }
  // 2) query past + i attends to cache positions [0, past + i] through softmax_row, as
  //    attention_forward_rows does, then the weighted sum of V in the same order
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
#pragma omp parallel
  {
    std::vector<T> s(static_cast<size_t>(past + Tn));
#pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < Tn; ++i) {
          const T* q = qkv + (b * Tn + i) * row + h * 3 * D;
          const T* kc = k_cache + ((b * H + h) * capacity) * D;
          const T* vc = v_cache + ((b * H + h) * capacity) * D;
          const int64_t n = past + i + 1;
          softmax_row(q, kc, D, n, D, scale, s.data());
          T* o = out + (b * Tn + i) * H * D + h * D;
          for (int64_t d = 0; d < D; ++d) o[d] = 0;
          for (int64_t j = 0; j < n; ++j) {
            const T pj = s[j];
            const T* v = vc + j * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) o[d] += pj * v[d];
          }
        }
  }
}

}  // namespace
}  // namespace mtnlg::cpu

namespace mtnlg::ops {

using namespace detail;

namespace {
void attention_shape(const char* op, const Tensor& qkv, int64_t heads, int64_t& B, int64_t& T, int64_t& D) {
  if (qkv.ndim() != 3) throw_runtime("{}: qkv must be [B,T,3C], got {}", op, shape_str(qkv.shape()));
  if (heads <= 0 || qkv.dim(2) % (3 * heads) != 0)
    throw_runtime("{}: qkv width {} is not 3 x heads ({}) x head size", op, qkv.dim(2), heads);
  B = qkv.dim(0);
  T = qkv.dim(1);
  D = qkv.dim(2) / (3 * heads);
}
int64_t heads_total(const AttentionDropout& d, int64_t heads) { return d.heads_total ? d.heads_total : heads; }
}  // namespace

void attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t heads, const AttentionDropout& drop) {
  MTNLG_CUDA_DISPATCH(same_device("attention_forward", {&out, &probs, &qkv}), attention_forward(out, probs, qkv, heads, drop));
  same_float_dtype("attention_forward", {&out, &probs, &qkv});
  int64_t B, T, D;
  attention_shape("attention_forward", qkv, heads, B, T, D);
  expect_numel("attention_forward", "out", out, B * T * heads * D);
  expect_numel("attention_forward", "probs", probs, B * heads * T * T);
  by_dtype(out.dtype(), [&](auto z) {
    using V = decltype(z);
    cpu::attention_forward<V>(out.kernel_data<V>(), probs.kernel_data<V>(), qkv.kernel_data<V>(), B, T, heads, D, drop.p, drop.key,
                              drop.sample_offset, drop.head_offset, heads_total(drop, heads));
  });
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads,
                        const AttentionDropout& drop) {
  MTNLG_CUDA_DISPATCH(same_device("attention_backward", {&dqkv, &dout, &qkv, &probs}), attention_backward(dqkv, dout, qkv, probs, heads, drop));
  same_float_dtype("attention_backward", {&dqkv, &dout, &qkv, &probs});
  int64_t B, T, D;
  attention_shape("attention_backward", qkv, heads, B, T, D);
  expect_numel("attention_backward", "dqkv", dqkv, qkv.numel());
  by_dtype(dqkv.dtype(), [&](auto z) {
    using V = decltype(z);
    cpu::attention_backward<V>(dqkv.kernel_data<V>(), dout.kernel_data<V>(), qkv.kernel_data<V>(), probs.kernel_data<V>(), B, T, heads, D, drop.p,
                               drop.key, drop.sample_offset, drop.head_offset, heads_total(drop, heads));
  });
}


bool attention_lse_supported(Device device, DType dt, int64_t B, int64_t T, int64_t heads, int64_t head_dim,
                             double dropout_p, std::string* why) {
  if (device != Device::cuda) {
    if (why) *why = "the CPU's row kernel";
    return true;
  }
#ifdef MTNLG_HAVE_CUDA
  if (!cuda::fused_attention_supported(dt, B, T, heads, head_dim, dropout_p, why)) return false;
  if (why) *why = "cuDNN fused attention, " + cuda::cudnn_description();
  return true;
#else
  (void)dt, (void)B, (void)T, (void)heads, (void)head_dim, (void)dropout_p;
  if (why) *why = "a build without CUDA";
  return false;
#endif
}

void attention_forward_lse(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads, const AttentionDropout& drop) {
  const char* op = "attention_forward_lse";
  const bool cuda = same_device(op, {&out, &lse, &qkv});
  const DType dt = act_dtype(op, {{"out", &out}, {"qkv", &qkv}}, {{"lse", &lse}});
  int64_t B, T, D;
  attention_shape(op, qkv, heads, B, T, D);
  expect_numel(op, "out", out, B * T * heads * D);
  expect_numel(op, "lse", lse, B * heads * T);
  MTNLG_CUDA_DISPATCH(cuda, attention_forward_lse(out, lse, qkv, heads, drop));
  if (is_low(dt)) {
    Widened w;
    attention_forward_lse(w.out(out), lse, w.in(qkv), heads, drop);
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::attention_forward_lse<V>(out.kernel_data<V>(), lse.kernel_data<V>(), qkv.kernel_data<V>(), B, T, heads, D, drop.p, drop.key,
                                  drop.sample_offset, drop.head_offset, heads_total(drop, heads));
  });
}

void attention_backward_lse(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t heads, const AttentionDropout& drop) {
  const char* op = "attention_backward_lse";
  const bool cuda = same_device(op, {&dqkv, &dout, &qkv, &out, &lse});
  const DType dt =
      act_dtype(op, {{"dqkv", &dqkv}, {"dout", &dout}, {"qkv", &qkv}, {"out", &out}}, {{"lse", &lse}});
  int64_t B, T, D;
  attention_shape(op, qkv, heads, B, T, D);
  expect_numel(op, "dqkv", dqkv, qkv.numel());
  expect_numel(op, "dout", dout, B * T * heads * D);
  expect_numel(op, "lse", lse, B * heads * T);
  if (out.defined()) expect_numel(op, "out", out, B * T * heads * D);
  MTNLG_CUDA_DISPATCH(cuda, attention_backward_lse(dqkv, dout, qkv, out, lse, heads, drop));
  if (is_low(dt)) {
    Widened w;
    attention_backward_lse(w.out(dqkv), w.in(dout), w.in(qkv), out.defined() ? w.in(out) : out, lse, heads, drop);
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::attention_backward_lse<V>(dqkv.kernel_data<V>(), dout.kernel_data<V>(), qkv.kernel_data<V>(), lse.kernel_data<V>(), B, T, heads, D, drop.p,
                                   drop.key, drop.sample_offset, drop.head_offset, heads_total(drop, heads));
  });
}

void attention_cached_forward(Tensor& out, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int64_t heads,
                              int64_t past) {
  const char* op = "attention_cached_forward";
  const bool cuda = same_device(op, {&out, &k_cache, &v_cache, &qkv});
  const DType dt = act_dtype(op, {{"out", &out}, {"k_cache", &k_cache}, {"v_cache", &v_cache}, {"qkv", &qkv}});
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
  MTNLG_CUDA_DISPATCH(cuda, attention_cached_forward(out, k_cache, v_cache, qkv, heads, past));
  if (is_low(dt)) {  // the cache is read and extended: widen it whole, store it back
    Widened w;
    attention_cached_forward(w.out(out), w.out(k_cache, /*read=*/true), w.out(v_cache, /*read=*/true), w.in(qkv), heads,
                             past);
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::attention_cached_forward<V>(out.kernel_data<V>(), k_cache.kernel_data<V>(), v_cache.kernel_data<V>(), qkv.kernel_data<V>(), B, T, heads, D,
                                     cap, past);
  });
}

}  // namespace mtnlg::ops
