// Causal self-attention: the log-sum-exp form the model uses on every device
// (attention_forward_lse / attention_backward_lse: CUDA in core/cuda/attention.cu, the
// CPU below keeps one row of scores per (b, h) and saves lse_i = m_i + log sum_j
// exp(s_ij - m_i); the backward recomputes p_ij = exp(s_ij - lse_i) row by row), the
// probs form ([B,H,T,T] saved, CPU only) that the tests use as an independent
// reference, and the KV-cache form for generation. bf16/f16 activations run the f32
// kernels through Widened with lse in f32, as on CUDA.
//
// Grouped-query attention: qkv rows hold G groups, each its H/G query heads, then one key
// and one value head ([q_0 .. q_{H/G-1} | k | v]; G == H is the per-head [q | k | v]).
// Query head h reads the key and value of its group g = h / (H/G). The backward sums a
// group's dK and dV over its query heads, in head order (one thread owns a group).
#include "core/ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
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
// Its two halves, shared with the tiled block kernel (the same arithmetic, so every form
// gives the same bits): one scaled score, and the row's normalisation.
template <typename T>
inline T scaled_dot(const T* q, const T* k, int64_t D, T scale) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += q[d] * k[d];
  return s * scale;
}
template <typename T>
T softmax_normalize(T* p, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, p[j]);
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(p[j] - mx);
    sum += p[j];
  }
  const T inv = T(1) / sum;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv;
  return mx + std::log(sum);
}

template <typename T>
T softmax_row(const T* q, const T* k0, int64_t kstride, int64_t n, int64_t D, T scale, T* p) {
  for (int64_t j = 0; j < n; ++j) p[j] = scaled_dot(q, k0 + j * kstride, D, scale);
  return softmax_normalize(p, n);
}

// Causal attention, both saved forms in one kernel: row i's softmax lives in `probs`
// (the [B,H,T,T] form, zeros above the diagonal) or in a per-(b,h) scratch row; `lse`
// (when given) saves m_i + log sum_j exp(s_ij - m_i), the log-sum-exp form's statistic.
// Where head h's q, k and v start in a qkv row (offsets from the row's start).
struct HeadCols {
  int64_t q, k, v;
};
inline HeadCols head_cols(int64_t h, int64_t Q, int64_t D) {
  const int64_t g0 = (h / Q) * (Q + 2) * D;
  return {g0 + (h % Q) * D, g0 + Q * D, g0 + (Q + 1) * D};
}

template <typename T>
void attention_forward_rows(T* out, T* probs, T* lse, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t G,
                            int64_t D, double p, uint64_t key, int64_t sample_offset, int64_t head_offset,
                            int64_t heads_total) {
  const int64_t Q = H / G, row = G * (Q + 2) * D;  // query heads per group, qkv row stride
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  const T dscale = p > 0 ? static_cast<T>(1.0 / (1.0 - p)) : T(1);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const HeadCols hc = head_cols(h, Q, D);
      const T* base = qkv + b * Tn * row + hc.q;  // this head's queries
      const T* kbase = qkv + b * Tn * row + hc.k;
      const T* vbase = qkv + b * Tn * row + hc.v;
      std::vector<T> scratch(probs ? 0 : static_cast<size_t>(Tn));
      const uint64_t mask_base = attention_mask_base(sample_offset + b, head_offset + h, heads_total, Tn);
      for (int64_t i = 0; i < Tn; ++i) {
        const T* q = base + i * row;
        T* Pi = probs ? probs + ((b * H + h) * Tn + i) * Tn : scratch.data();
        const T row_lse = softmax_row(q, kbase, row, i + 1, D, scale, Pi);
        if (lse) lse[(b * H + h) * Tn + i] = row_lse;
        if (probs)
          for (int64_t j = i + 1; j < Tn; ++j) Pi[j] = 0;
        T* o = out + (b * Tn + i) * H * D + h * D;
        for (int64_t d = 0; d < D; ++d) o[d] = 0;
        for (int64_t j = 0; j <= i; ++j) {
          T pj = Pi[j];
          if (p > 0) pj = keep(key, mask_base + i * Tn + j, p) ? pj * dscale : T(0);
          const T* v = vbase + j * row;
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
                             int64_t H, int64_t G, int64_t D, double p, uint64_t key, int64_t sample_offset,
                             int64_t head_offset, int64_t heads_total) {
  const int64_t Q = H / G, row = G * (Q + 2) * D;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(D)));
  const T dscale = p > 0 ? static_cast<T>(1.0 / (1.0 - p)) : T(1);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t i = 0; i < Tn; ++i)  // the group's columns: its dq's, dk, dv
        for (int64_t d = 0; d < (Q + 2) * D; ++d) dqkv[b * Tn * row + g * (Q + 2) * D + i * row + d] = 0;
      for (int64_t h = g * Q; h < (g + 1) * Q; ++h) {  // dk, dv sum over the group's heads in order
        const HeadCols hc = head_cols(h, Q, D);
        const T* base = qkv + b * Tn * row + hc.q;
        const T* kbase = qkv + b * Tn * row + hc.k;
        const T* vbase = qkv + b * Tn * row + hc.v;
        T* dbase = dqkv + b * Tn * row + hc.q;
        T* dkbase = dqkv + b * Tn * row + hc.k;
        T* dvbase = dqkv + b * Tn * row + hc.v;
        const uint64_t mask_base = attention_mask_base(sample_offset + b, head_offset + h, heads_total, Tn);
        std::vector<T> scratch(probs ? 0 : static_cast<size_t>(Tn)), dP(static_cast<size_t>(Tn));
        for (int64_t i = 0; i < Tn; ++i) {
          const T* q = base + i * row;
          const T* Pi = probs ? probs + ((b * H + h) * Tn + i) * Tn : scratch.data();
          if (!probs) {  // recompute row i from the saved log-sum-exp
            const T l = lse[(b * H + h) * Tn + i];
            for (int64_t j = 0; j <= i; ++j) {
              const T* k = kbase + j * row;
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
            const T* v = vbase + j * row;
            T* dv = dvbase + j * row;
            const bool kept = p <= 0 || keep(key, mask_base + i * Tn + j, p);
            const T pj = kept ? Pi[j] * dscale : T(0);
            T gv = 0;
#pragma omp simd reduction(+ : gv)
            for (int64_t d = 0; d < D; ++d) {
              gv += dO[d] * v[d];
              dv[d] += pj * dO[d];
            }
            dP[j] = kept ? gv * dscale : T(0);
            dot += Pi[j] * dP[j];
          }
          T* dq = dbase + i * row;
          for (int64_t j = 0; j <= i; ++j) {
            const T ds = Pi[j] * (dP[j] - dot) * scale;
            const T* k = kbase + j * row;
            T* dk = dkbase + j * row;
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
}


// ---- context-parallel attention's pieces: a block of queries against a block of K/V,
// and the log-sum-exp merge (ops::attention_block_forward, attention_merge_forward) ----

// A block's sizes: queries are rows [q0, q0 + nq) of qkv [B, Tq, G*(Q+2)*D], keys and
// values rows [k0, k0 + nk) of kv [B, Tk, G*2*D] (group g: k at 2gD, v at 2gD + D).
struct BlockDims {
  int64_t B, Tq, Tk, H, G, D, q0, nq, k0, nk;
  bool causal;
  int64_t offset;
  // dropout: the one-rank op's mask at the rows' global positions (p <= 0: none)
  double p;
  uint64_t key;
  int64_t sample_offset, head_offset, heads_total, seq_len;
  ops::SeqRows q_rows, kv_rows;
};
// The dropout factor of (sample b, head h, qkv row t, kv row r): 0 or 1 / (1 - p); 1
// without dropout.
template <typename T>
inline T block_mask(const BlockDims& s, int64_t b, int64_t h, int64_t t, int64_t r) {
  if (s.p <= 0) return T(1);
  const uint64_t base = attention_mask_base(s.sample_offset + b, s.head_offset + h, s.heads_total, s.seq_len);
  const auto e = static_cast<uint64_t>(s.q_rows.at(t) * s.seq_len + s.kv_rows.at(r));
  return keep(s.key, base + e, s.p) ? static_cast<T>(1.0 / (1.0 - s.p)) : T(0);
}
// How many of the block's keys the block's query i sees (a prefix of them).
inline int64_t block_keys(const BlockDims& s, int64_t i) {
  return s.causal ? std::clamp<int64_t>(i + s.offset + 1, 0, s.nk) : s.nk;
}

// Query rows a tile of the block kernels takes at once: each key and value is read once
// per tile rather than once per row (a block's keys need not fit in the cache). Every row
// still sums over its keys in key order, so the bits are the per-row kernel's.
constexpr int64_t kBlockRowTile = 16;

template <typename T>
void attention_block_forward_rows(T* out, T* lse, const T* qkv, const T* kv, const BlockDims& s) {
  const int64_t Q = s.H / s.G, W = s.G * (Q + 2) * s.D, KW = s.G * 2 * s.D, HD = s.H * s.D;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.D)));
  const int64_t stride = std::max<int64_t>(s.nk, 1);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h) {
      const T* kbase = kv + (b * s.Tk + s.k0) * KW + (h / Q) * 2 * s.D;
      std::vector<T> p(static_cast<size_t>(kBlockRowTile * stride));
      int64_t n[kBlockRowTile];
      for (int64_t t0 = 0; t0 < s.Tq; t0 += kBlockRowTile) {  // every row: those outside the block get (0, -inf)
        const int64_t rows = std::min(kBlockRowTile, s.Tq - t0);
        int64_t most = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = t0 + r - s.q0;
          n[r] = i >= 0 && i < s.nq ? block_keys(s, i) : 0;
          most = std::max(most, n[r]);
          T* o = out + (b * s.Tq + t0 + r) * HD + h * s.D;
          std::fill(o, o + s.D, T(0));
        }
        auto q_of = [&](int64_t r) { return qkv + (b * s.Tq + t0 + r) * W + head_cols(h, Q, s.D).q; };
        for (int64_t j = 0; j < most; ++j) {  // the scores, key by key
          const T* k = kbase + j * KW;
          for (int64_t r = 0; r < rows; ++r)
            if (j < n[r]) p[static_cast<size_t>(r * stride + j)] = scaled_dot(q_of(r), k, s.D, scale);
        }
        for (int64_t r = 0; r < rows; ++r) {
          T& l = lse[(b * s.H + h) * s.Tq + t0 + r];
          l = n[r] == 0 ? -std::numeric_limits<T>::infinity() : softmax_normalize(p.data() + r * stride, n[r]);
        }
        for (int64_t j = 0; j < most; ++j) {  // the outputs, key by key
          const T* v = kbase + j * KW + s.D;
          for (int64_t r = 0; r < rows; ++r) {
            if (j >= n[r]) continue;
            const T pj = p[static_cast<size_t>(r * stride + j)] * block_mask<T>(s, b, h, t0 + r, s.k0 + j);
            T* o = out + (b * s.Tq + t0 + r) * HD + h * s.D;
#pragma omp simd
            for (int64_t d = 0; d < s.D; ++d) o[d] += pj * v[d];
          }
        }
      }
    }
}

// The block's backward from the whole attention's out and lse (flash attention's
// backward): p_ij = exp(s_ij - lse_i), m_ij the dropout factor, ds_ij = p_ij (m_ij dout_i .
// v_j - D_i) with D_i = dout_i . out_i - dlse_i; dq += ds k scale, dk += ds q scale, dv +=
// p m dout. One thread owns a
// (sample, group): its query heads' dq and its dk, dv.
template <typename T>
void attention_block_backward_rows(T* dqkv, T* dkv, const T* dout, const T* dlse, const T* qkv, const T* kv,
                                   const T* out, const T* lse, const BlockDims& s) {
  const int64_t Q = s.H / s.G, W = s.G * (Q + 2) * s.D, KW = s.G * 2 * s.D, HD = s.H * s.D;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.D)));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t g = 0; g < s.G; ++g) {
      const T* kbase = kv + (b * s.Tk + s.k0) * KW + g * 2 * s.D;
      T* dkbase = dkv + (b * s.Tk + s.k0) * KW + g * 2 * s.D;
      for (int64_t h = g * Q; h < (g + 1) * Q; ++h)
        for (int64_t i0 = 0; i0 < s.nq; i0 += kBlockRowTile) {  // a tile of rows, key by key
          const int64_t rows = std::min(kBlockRowTile, s.nq - i0);
          int64_t n[kBlockRowTile], most = 0;
          T Di[kBlockRowTile];
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t t = s.q0 + i0 + r, li = (b * s.H + h) * s.Tq + t;
            n[r] = lse[li] == -std::numeric_limits<T>::infinity() ? 0 : block_keys(s, i0 + r);
            most = std::max(most, n[r]);
            const T* dO = dout + (b * s.Tq + t) * HD + h * s.D;
            const T* o = out + (b * s.Tq + t) * HD + h * s.D;
            Di[r] = dlse ? -dlse[li] : T(0);
            for (int64_t d = 0; d < s.D; ++d) Di[r] += dO[d] * o[d];
          }
          for (int64_t j = 0; j < most; ++j) {
            const T* k = kbase + j * KW;
            const T* v = k + s.D;
            T* dk = dkbase + j * KW;
            T* dv = dk + s.D;
            for (int64_t r = 0; r < rows; ++r) {
              if (j >= n[r]) continue;
              const int64_t t = s.q0 + i0 + r;
              const T l = lse[(b * s.H + h) * s.Tq + t];
              const T* q = qkv + (b * s.Tq + t) * W + head_cols(h, Q, s.D).q;
              T* dq = dqkv + (b * s.Tq + t) * W + head_cols(h, Q, s.D).q;
              const T* dO = dout + (b * s.Tq + t) * HD + h * s.D;
              T sc = 0, dp = 0;
#pragma omp simd reduction(+ : sc, dp)
              for (int64_t d = 0; d < s.D; ++d) {
                sc += q[d] * k[d];
                dp += dO[d] * v[d];
              }
              const T m = block_mask<T>(s, b, h, t, s.k0 + j), pj = std::exp(sc * scale - l);
              const T ds = pj * (dp * m - Di[r]) * scale, pm = pj * m;
#pragma omp simd
              for (int64_t d = 0; d < s.D; ++d) {
                dv[d] += pm * dO[d];
                dq[d] += ds * k[d];
                dk[d] += ds * q[d];
              }
            }
          }
        }
    }
}

// The two weights of a merge row: w_a = exp(la - l), w_b = exp(lb - l), l = log(e^la + e^lb);
// both 0 and l = -inf when neither side saw a key.
template <typename T>
inline T merge_weights(T la, T lb, T& wa, T& wb) {
  const T m = std::max(la, lb);
  if (m == -std::numeric_limits<T>::infinity()) {
    wa = wb = T(0);
    return m;
  }
  const T l = m + std::log(std::exp(la - m) + std::exp(lb - m));
  wa = std::exp(la - l);
  wb = std::exp(lb - l);
  return l;
}

template <typename T>
void attention_merge_rows(T* out, T* lse, const T* oa, const T* la, const T* ob, const T* lb, int64_t B, int64_t Tn,
                          int64_t H, int64_t D) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < Tn; ++t) {
        const int64_t li = (b * H + h) * Tn + t, oi = (b * Tn + t) * H * D + h * D;
        T wa, wb;
        lse[li] = merge_weights(la[li], lb[li], wa, wb);
        for (int64_t d = 0; d < D; ++d) out[oi + d] = wa * oa[oi + d] + wb * ob[oi + d];
      }
}

template <typename T>
void attention_merge_backward_rows(T* doa, T* dla, T* dob, T* dlb, const T* dout, const T* dlse, const T* oa,
                                   const T* la, const T* ob, const T* lb, int64_t B, int64_t Tn, int64_t H, int64_t D) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < Tn; ++t) {
        const int64_t li = (b * H + h) * Tn + t, oi = (b * Tn + t) * H * D + h * D;
        T wa, wb;
        merge_weights(la[li], lb[li], wa, wb);
        T ga = dlse ? dlse[li] : T(0), gb = ga;  // dout . (out_x - out) + dlse
        for (int64_t d = 0; d < D; ++d) {
          const T o = wa * oa[oi + d] + wb * ob[oi + d], g = dout[oi + d];
          ga += g * (oa[oi + d] - o);
          gb += g * (ob[oi + d] - o);
          doa[oi + d] = wa * g;
          dob[oi + d] = wb * g;
        }
        dla[li] = wa * ga;
        dlb[li] = wb * gb;
      }
}

template <typename T>
void attention_cached_forward(T* out, T* k_cache, T* v_cache, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t G,
                              int64_t D, int64_t capacity, int64_t past) {
  const int64_t Q = H / G, row = G * (Q + 2) * D;
  // 1) append the new keys and values of each group at positions [past, past + Tn)
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g) {
      T* kc = k_cache + ((b * G + g) * capacity) * D;
      T* vc = v_cache + ((b * G + g) * capacity) * D;
      for (int64_t i = 0; i < Tn; ++i) {
        const T* src = qkv + (b * Tn + i) * row + g * (Q + 2) * D + Q * D;  // the group's k, then v
        std::copy(src, src + D, kc + (past + i) * D);
        std::copy(src + D, src + 2 * D, vc + (past + i) * D);
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
          const T* q = qkv + (b * Tn + i) * row + head_cols(h, Q, D).q;
          const T* kc = k_cache + ((b * G + h / Q) * capacity) * D;
          const T* vc = v_cache + ((b * G + h / Q) * capacity) * D;
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
int64_t heads_total(const AttentionDropout& d, int64_t heads) { return d.heads_total ? d.heads_total : heads; }

// The row kernels' call for a wide dtype (f32/f64): out, and probs or lse (the other null).
void forward_cpu(Tensor& out, Tensor* probs, Tensor* lse, const Tensor& qkv, const op_checks::QkvShape& s,
                 const AttentionDropout& drop) {
  by_dtype(out.dtype(), [&](auto z) {
    using V = decltype(z);
    cpu::attention_forward_rows<V>(out.kernel_data<V>(), ptr<V>(probs), ptr<V>(lse), qkv.kernel_data<V>(), s.B, s.T,
                                   s.H, s.G, s.D, drop.p, drop.key, drop.sample_offset, drop.head_offset,
                                   heads_total(drop, s.H));
  });
}
void backward_cpu(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor* probs, const Tensor* lse,
                  const op_checks::QkvShape& s, const AttentionDropout& drop) {
  by_dtype(dqkv.dtype(), [&](auto z) {
    using V = decltype(z);
    cpu::attention_backward_rows<V>(dqkv.kernel_data<V>(), dout.kernel_data<V>(), qkv.kernel_data<V>(), ptr<V>(probs),
                                    ptr<V>(lse), s.B, s.T, s.H, s.G, s.D, drop.p, drop.key, drop.sample_offset,
                                    drop.head_offset, heads_total(drop, s.H));
  });
}
}  // namespace

void attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t heads, const AttentionDropout& drop,
                       int64_t groups) {
  const char* op = "attention_forward";
  MTNLG_CUDA_DISPATCH(same_device(op, {&out, &probs, &qkv}), attention_forward(out, probs, qkv, heads, drop, groups));
  same_float_dtype(op, {&out, &probs, &qkv});
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  expect_numel(op, "out", out, s.B * s.T * s.H * s.D);
  expect_numel(op, "probs", probs, s.B * s.H * s.T * s.T);
  forward_cpu(out, &probs, nullptr, qkv, s, drop);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads,
                        const AttentionDropout& drop, int64_t groups) {
  const char* op = "attention_backward";
  MTNLG_CUDA_DISPATCH(same_device(op, {&dqkv, &dout, &qkv, &probs}),
                      attention_backward(dqkv, dout, qkv, probs, heads, drop, groups));
  same_float_dtype(op, {&dqkv, &dout, &qkv, &probs});
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  expect_numel(op, "dqkv", dqkv, qkv.numel());
  backward_cpu(dqkv, dout, qkv, &probs, nullptr, s, drop);
}


bool attention_lse_supported(Device device, DType dt, int64_t B, int64_t T, int64_t heads, int64_t head_dim,
                             double dropout_p, std::string* why, int64_t groups) {
  if (device != Device::cuda) {
    if (why) *why = "the CPU's row kernel";
    return true;
  }
#ifdef MTNLG_HAVE_CUDA
  if (!cuda::fused_attention_supported(dt, B, T, heads, head_dim, dropout_p, why, groups)) return false;
  if (why) *why = "cuDNN fused attention, " + cuda::cudnn_description();
  return true;
#else
  (void)dt, (void)B, (void)T, (void)heads, (void)head_dim, (void)dropout_p, (void)groups;
  if (why) *why = "a build without CUDA";
  return false;
#endif
}

void attention_forward_lse(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads, const AttentionDropout& drop,
                           int64_t groups) {
  const char* op = "attention_forward_lse";
  const bool cuda = same_device(op, {&out, &lse, &qkv});
  const DType dt = act_dtype(op, {{"out", &out}, {"qkv", &qkv}}, {{"lse", &lse}});
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  expect_numel(op, "out", out, s.B * s.T * s.H * s.D);
  expect_numel(op, "lse", lse, s.B * s.H * s.T);
  MTNLG_CUDA_DISPATCH(cuda, attention_forward_lse(out, lse, qkv, heads, drop, groups));
  if (is_low(dt)) {
    Widened w;
    attention_forward_lse(w.out(out), lse, w.in(qkv), heads, drop, groups);
    return w.store();
  }
  forward_cpu(out, nullptr, &lse, qkv, s, drop);
}

void attention_backward_lse(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t heads, const AttentionDropout& drop, int64_t groups) {
  const char* op = "attention_backward_lse";
  const bool cuda = same_device(op, {&dqkv, &dout, &qkv, &out, &lse});
  const DType dt = act_dtype(op, {{"dqkv", &dqkv}, {"dout", &dout}, {"qkv", &qkv}, {"out", &out}}, {{"lse", &lse}});
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  expect_numel(op, "dqkv", dqkv, qkv.numel());
  expect_numel(op, "dout", dout, s.B * s.T * s.H * s.D);
  expect_numel(op, "lse", lse, s.B * s.H * s.T);
  if (out.defined()) expect_numel(op, "out", out, s.B * s.T * s.H * s.D);
  MTNLG_CUDA_DISPATCH(cuda, attention_backward_lse(dqkv, dout, qkv, out, lse, heads, drop, groups));
  if (is_low(dt)) {
    Widened w;
    attention_backward_lse(w.out(dqkv), w.in(dout), w.in(qkv), out.defined() ? w.in(out) : out, lse, heads, drop,
                           groups);
    return w.store();
  }
  backward_cpu(dqkv, dout, qkv, nullptr, &lse, s, drop);
}

namespace {
// The block's sizes from the tensors and the AttentionBlock (counts of -1 resolved),
// checked: kv [B, Tk, G*2*D], the ranges inside the rows, out/lse sized by qkv (the
// callers check devices and dtype roles first).
cpu::BlockDims block_dims(const char* op, const Tensor& qkv, const Tensor& kv, const Tensor& out, const Tensor& lse,
                          int64_t heads, const AttentionBlock& blk, int64_t groups) {
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  if (kv.ndim() != 3 || kv.dim(0) != s.B || kv.dim(2) != s.G * 2 * s.D)
    throw_runtime("{}: kv must be [B, Tk, groups*2*D] = [{}, Tk, {}], got {}", op, s.B, s.G * 2 * s.D,
                  shape_str(kv.shape()));
  const int64_t Tk = kv.dim(1);
  const int64_t nq = blk.q_count < 0 ? s.T - blk.q_begin : blk.q_count;
  const int64_t nk = blk.k_count < 0 ? Tk - blk.k_begin : blk.k_count;
  if (blk.q_begin < 0 || nq < 0 || blk.q_begin + nq > s.T || blk.k_begin < 0 || nk < 0 || blk.k_begin + nk > Tk)
    throw_runtime("{}: query rows [{}, +{}) of {} or key rows [{}, +{}) of {} out of range", op, blk.q_begin, nq, s.T,
                  blk.k_begin, nk, Tk);
  expect_numel(op, "out", out, s.B * s.T * s.H * s.D);
  expect_numel(op, "lse", lse, s.B * s.H * s.T);
  if (blk.drop.p > 0 && blk.seq_len <= 0) throw_runtime("{}: attention dropout needs the sequence's length", op);
  const auto& d = blk.drop;
  return {s.B,
          s.T,
          Tk,
          s.H,
          s.G,
          s.D,
          blk.q_begin,
          nq,
          blk.k_begin,
          nk,
          blk.causal,
          blk.causal_offset,
          d.p,
          d.key,
          d.sample_offset,
          d.head_offset,
          d.heads_total ? d.heads_total : s.H,
          blk.seq_len,
          blk.q_rows,
          blk.kv_rows};
}

// [B, H, T] from a merge's lse and out [B, T, H*D]: its H (from lse) and D; checked.
void merge_dims(const char* op, const Tensor& out, const Tensor& lse, int64_t& B, int64_t& Tn, int64_t& H, int64_t& D) {
  if (lse.ndim() != 3 || out.ndim() != 3 || out.dim(0) != lse.dim(0) || out.dim(1) != lse.dim(2) || lse.dim(1) == 0 ||
      out.dim(2) % lse.dim(1) != 0)
    throw_runtime("{}: out [B, T, H*D] and lse [B, H, T] do not match: {} and {}", op, shape_str(out.shape()),
                  shape_str(lse.shape()));
  B = lse.dim(0), H = lse.dim(1), Tn = lse.dim(2), D = out.dim(2) / H;
}
}  // namespace

void attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv, int64_t heads,
                             const AttentionBlock& blk, int64_t groups) {
  const char* op = "attention_block_forward";
  const bool cuda = same_device(op, {&qkv, &kv, &out, &lse});
  const DType dt = act_dtype(op, {{"out", &out}, {"qkv", &qkv}, {"kv", &kv}}, {{"lse", &lse}});
  const cpu::BlockDims s = block_dims(op, qkv, kv, out, lse, heads, blk, groups);
  MTNLG_CUDA_DISPATCH(cuda, attention_block_forward(out, lse, qkv, kv, heads, blk, groups));
  if (is_low(dt)) {
    Widened w;
    attention_block_forward(w.out(out), lse, w.in(qkv), w.in(kv), heads, blk, groups);
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::attention_block_forward_rows<V>(out.kernel_data<V>(), lse.kernel_data<V>(), qkv.kernel_data<V>(),
                                         kv.kernel_data<V>(), s);
  });
}

void attention_block_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout, const Tensor* dlse, const Tensor& qkv,
                              const Tensor& kv, const Tensor& out, const Tensor& lse, int64_t heads,
                              const AttentionBlock& blk, int64_t groups) {
  const char* op = "attention_block_backward";
  const bool cuda = same_device(op, {&dqkv, &dkv, &dout, dlse ? dlse : &lse, &qkv, &kv, &out, &lse});
  const DType dt =
      act_dtype(op, {{"dqkv", &dqkv}, {"dkv", &dkv}, {"dout", &dout}, {"qkv", &qkv}, {"kv", &kv}, {"out", &out}},
                {{"dlse", dlse}, {"lse", &lse}});
  const cpu::BlockDims s = block_dims(op, qkv, kv, out, lse, heads, blk, groups);
  expect_numel(op, "dqkv", dqkv, qkv.numel());
  expect_numel(op, "dkv", dkv, kv.numel());
  expect_numel(op, "dout", dout, out.numel());
  if (dlse) expect_numel(op, "dlse", *dlse, lse.numel());
  MTNLG_CUDA_DISPATCH(cuda, attention_block_backward(dqkv, dkv, dout, dlse, qkv, kv, out, lse, heads, blk, groups));
  if (is_low(dt)) {  // dqkv and dkv accumulate: widened with their values
    Widened w;
    attention_block_backward(w.out(dqkv, /*read=*/true), w.out(dkv, /*read=*/true), w.in(dout), dlse, w.in(qkv),
                             w.in(kv), w.in(out), lse, heads, blk, groups);
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::attention_block_backward_rows<V>(dqkv.kernel_data<V>(), dkv.kernel_data<V>(), dout.kernel_data<V>(),
                                          ptr<V>(dlse), qkv.kernel_data<V>(), kv.kernel_data<V>(), out.kernel_data<V>(),
                                          lse.kernel_data<V>(), s);
  });
}

void attention_merge_forward(Tensor& out, Tensor& lse, const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                             const Tensor& lse_b) {
  const char* op = "attention_merge_forward";
  const bool cuda = same_device(op, {&out, &lse, &out_a, &lse_a, &out_b, &lse_b});
  // A low-precision block merged into an f32 accumulator: out_b is read widened.
  const bool mixed = out.dtype() == DType::f32 && out_a.dtype() == DType::f32 && is_low(out_b.dtype());
  const DType dt = act_dtype(op, {{"out", &out}, {"out_a", &out_a}, {"out_b", mixed ? &out_a : &out_b}},
                             {{"lse", &lse}, {"lse_a", &lse_a}, {"lse_b", &lse_b}});
  int64_t B, Tn, H, D;
  merge_dims(op, out, lse, B, Tn, H, D);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&out_a, &out_b})
    expect_numel(op, "out_a/out_b", *t, out.numel());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&lse_a, &lse_b})
    expect_numel(op, "lse_a/lse_b", *t, lse.numel());
  MTNLG_CUDA_DISPATCH(cuda, attention_merge_forward(out, lse, out_a, lse_a, out_b, lse_b));
  if (mixed) {
    Tensor wide = Tensor::empty(out_b.shape(), DType::f32, Device::cpu);
    convert(wide, out_b);
    return attention_merge_forward(out, lse, out_a, lse_a, wide, lse_b);
  }
  if (is_low(dt)) {
    Widened w;
    attention_merge_forward(w.out(out), lse, w.in(out_a), lse_a, w.in(out_b), lse_b);
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::attention_merge_rows<V>(out.kernel_data<V>(), lse.kernel_data<V>(), out_a.kernel_data<V>(),
                                 lse_a.kernel_data<V>(), out_b.kernel_data<V>(), lse_b.kernel_data<V>(), B, Tn, H, D);
  });
}

void attention_merge_backward(Tensor& dout_a, Tensor& dlse_a, Tensor& dout_b, Tensor& dlse_b, const Tensor& dout,
                              const Tensor* dlse, const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                              const Tensor& lse_b) {
  const char* op = "attention_merge_backward";
  const Tensor& dl = dlse ? *dlse : lse_a;
  const bool cuda = same_device(op, {&dout_a, &dlse_a, &dout_b, &dlse_b, &dout, &dl, &out_a, &lse_a, &out_b, &lse_b});
  const DType dt =
      act_dtype(op, {{"dout_a", &dout_a}, {"dout_b", &dout_b}, {"dout", &dout}, {"out_a", &out_a}, {"out_b", &out_b}},
                {{"dlse_a", &dlse_a}, {"dlse_b", &dlse_b}, {"dlse", &dl}, {"lse_a", &lse_a}, {"lse_b", &lse_b}});
  int64_t B, Tn, H, D;
  merge_dims(op, out_a, lse_a, B, Tn, H, D);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dout_a, &dout_b, &dout, &out_b})
    expect_numel(op, "out", *t, out_a.numel());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dlse_a, &dlse_b, &dl, &lse_b})
    expect_numel(op, "lse", *t, lse_a.numel());
  MTNLG_CUDA_DISPATCH(cuda,
                      attention_merge_backward(dout_a, dlse_a, dout_b, dlse_b, dout, dlse, out_a, lse_a, out_b, lse_b));
  if (is_low(dt)) {
    Widened w;
    attention_merge_backward(w.out(dout_a), dlse_a, w.out(dout_b), dlse_b, w.in(dout), dlse, w.in(out_a), lse_a,
                             w.in(out_b), lse_b);
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::attention_merge_backward_rows<V>(dout_a.kernel_data<V>(), dlse_a.kernel_data<V>(), dout_b.kernel_data<V>(),
                                          dlse_b.kernel_data<V>(), dout.kernel_data<V>(), ptr<V>(dlse),
                                          out_a.kernel_data<V>(), lse_a.kernel_data<V>(), out_b.kernel_data<V>(),
                                          lse_b.kernel_data<V>(), B, Tn, H, D);
  });
}

namespace {
// kv [B, T, G*2*D] against qkv: its shape, checked.
op_checks::QkvShape kv_shape(const char* op, const Tensor& qkv, const Tensor& kv, int64_t heads, int64_t groups) {
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  expect_numel(op, "kv", kv, s.B * s.T * s.G * 2 * s.D);
  return s;
}
// Between the k and v columns of qkv and the K/V buffer, row by row (to_kv: qkv -> kv).
void kv_copy(char* qkv, char* kv, const op_checks::QkvShape& s, int64_t esize, bool to_kv) {
  const int64_t Q = s.H / s.G, W = s.G * (Q + 2) * s.D, KW = s.G * 2 * s.D;
  const auto n = static_cast<size_t>(2 * s.D * esize);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < s.B * s.T; ++row)
    for (int64_t g = 0; g < s.G; ++g) {
      char* x = qkv + (row * W + g * (Q + 2) * s.D + Q * s.D) * esize;
      char* y = kv + (row * KW + g * 2 * s.D) * esize;
      to_kv ? std::memcpy(y, x, n) : std::memcpy(x, y, n);
    }
}
}  // namespace

void attention_kv_forward(Tensor& kv, const Tensor& qkv, int64_t heads, int64_t groups) {
  const char* op = "attention_kv_forward";
  const bool cuda = same_device(op, {&kv, &qkv});
  const DType dt = act_dtype(op, {{"kv", &kv}, {"qkv", &qkv}});
  const op_checks::QkvShape s = kv_shape(op, qkv, kv, heads, groups);
  MTNLG_CUDA_DISPATCH(cuda, attention_kv_forward(kv, qkv, heads, groups));
  kv_copy(qkv.kernel_data<char>(), kv.kernel_data<char>(), s, dtype_size(dt), true);
}

void attention_kv_backward(Tensor& dqkv, const Tensor& dkv, int64_t heads, int64_t groups) {
  const char* op = "attention_kv_backward";
  const bool cuda = same_device(op, {&dqkv, &dkv});
  const DType dt = act_dtype(op, {{"dqkv", &dqkv}, {"dkv", &dkv}});
  const op_checks::QkvShape s = kv_shape(op, dqkv, dkv, heads, groups);
  MTNLG_CUDA_DISPATCH(cuda, attention_kv_backward(dqkv, dkv, heads, groups));
  kv_copy(dqkv.kernel_data<char>(), dkv.kernel_data<char>(), s, dtype_size(dt), false);
}

void attention_cached_forward(Tensor& out, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int64_t heads,
                              int64_t past, int64_t groups) {
  const char* op = "attention_cached_forward";
  const bool cuda = same_device(op, {&out, &k_cache, &v_cache, &qkv});
  const DType dt = act_dtype(op, {{"out", &out}, {"k_cache", &k_cache}, {"v_cache", &v_cache}, {"qkv", &qkv}});
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  if (k_cache.ndim() != 4 || v_cache.shape() != k_cache.shape() || k_cache.dim(0) != s.B || k_cache.dim(1) != s.G ||
      k_cache.dim(3) != s.D)
    throw_runtime("{}: the caches must be [B, groups, capacity, D] = [{}, {}, capacity, {}], got {} and {}", op, s.B,
                  s.G, s.D, shape_str(k_cache.shape()), shape_str(v_cache.shape()));
  const int64_t cap = k_cache.dim(2);
  if (past < 0 || past + s.T > cap)
    throw_runtime("{}: {} cached + {} new positions exceed the cache capacity {}", op, past, s.T, cap);
  expect_numel(op, "out", out, s.B * s.T * s.H * s.D);
  MTNLG_CUDA_DISPATCH(cuda, attention_cached_forward(out, k_cache, v_cache, qkv, heads, past, groups));
  if (is_low(dt)) {  // the cache is read and extended: widen it whole, store it back
    Widened w;
    attention_cached_forward(w.out(out), w.out(k_cache, /*read=*/true), w.out(v_cache, /*read=*/true), w.in(qkv), heads,
                             past, groups);
    return w.store();
  }
  by_dtype(dt, [&](auto z) {
    using V = decltype(z);
    cpu::attention_cached_forward<V>(out.kernel_data<V>(), k_cache.kernel_data<V>(), v_cache.kernel_data<V>(),
                                     qkv.kernel_data<V>(), s.B, s.T, s.H, s.G, s.D, cap, past);
  });
}

bool attention_cp_blocks_fused_supported(Device device, DType dt, int64_t B, int64_t L, int64_t heads, int64_t head_dim,
                                         std::string* why, int64_t groups, int64_t gather_ranks) {
  if (device != Device::cuda) {
    if (why) *why = "cuDNN's fused blocks run on CUDA only";
    return false;
  }
#ifdef MTNLG_HAVE_CUDA
  return cuda::fused_cp_blocks_supported(dt, B, L, heads, head_dim, why, groups, gather_ranks);
#else
  (void)dt, (void)B, (void)L, (void)heads, (void)head_dim, (void)groups, (void)gather_ranks;
  if (why) *why = "a build without CUDA";
  return false;
#endif
}

void attention_block_fused_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv, int64_t heads,
                                   const AttentionBlock& blk, int64_t groups) {
  const char* op = "attention_block_fused_forward";
  const bool cuda = same_device(op, {&out, &lse, &qkv, &kv});
  act_dtype(op, {{"out", &out}, {"qkv", &qkv}, {"kv", &kv}}, {{"lse", &lse}});
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  expect_numel(op, "out", out, s.B * s.T * s.H * s.D);
  expect_numel(op, "lse", lse, s.B * s.H * s.T);
  MTNLG_CUDA_DISPATCH(cuda, cudnn_block_forward(out, lse, qkv, kv, heads, blk, groups));
  (void)blk;  // a build without CUDA
  throw_runtime("{}: cuDNN's fused blocks run on CUDA only", op);
}

void attention_block_fused_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                                    const Tensor& out, const Tensor& lse, int64_t heads, const AttentionBlock& blk,
                                    int64_t groups) {
  const char* op = "attention_block_fused_backward";
  const bool cuda = same_device(op, {&dqkv, &dkv, &dout, &qkv, &kv, &out, &lse});
  act_dtype(op, {{"dqkv", &dqkv}, {"dkv", &dkv}, {"dout", &dout}, {"qkv", &qkv}, {"kv", &kv}, {"out", &out}},
            {{"lse", &lse}});
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  expect_numel(op, "dqkv", dqkv, qkv.numel());
  expect_numel(op, "dkv", dkv, kv.numel());
  expect_numel(op, "out", out, s.B * s.T * s.H * s.D);
  expect_numel(op, "dout", dout, out.numel());
  expect_numel(op, "lse", lse, s.B * s.H * s.T);
  MTNLG_CUDA_DISPATCH(cuda, cudnn_block_backward(dqkv, dkv, dout, qkv, kv, out, lse, heads, blk, groups));
  (void)blk;  // a build without CUDA
  throw_runtime("{}: cuDNN's fused blocks run on CUDA only", op);
}

}  // namespace mtnlg::ops
