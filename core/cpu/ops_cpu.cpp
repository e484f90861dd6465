// CPU implementations. Threading: OpenMP over rows / (batch, head) pairs; matmuls in
// OpenBLAS. Every loop writes disjoint outputs per thread except the parameter-gradient
// reductions, which are split by column so the result is independent of the thread
// count (DESIGN.md invariant 3: same thread count -> same bits; we go further and keep
// reductions ordered the same way for any thread count where it is cheap).
#include "core/cpu/ops_cpu.hpp"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "core/rng.hpp"

namespace mtnlg::cpu {

namespace {

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
          T beta, T* Cm, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
                ldb, beta, Cm, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
                ldb, beta, Cm, ldc);
  }
}

// Keep-mask for dropout: element e is kept when its uniform draw >= p.
inline bool keep(uint64_t key, uint64_t e, double p) { return philox_uniform(key, 0, e) >= static_cast<float>(p); }

// First mask index of (global sample, global head) in attention dropout: element (i, j)
// is base + i*T + j, so any split of samples or heads draws the same mask.
inline uint64_t attention_mask_base(int64_t sample, int64_t head, int64_t heads_total, int64_t T) {
  return static_cast<uint64_t>((sample * heads_total + head) * T * T);
}

}  // namespace

template <typename T>
void matmul_forward(T* out, const T* inp, const T* w, const T* bias, int64_t N, int64_t C, int64_t OC) {
  T beta = 0;
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t o = 0; o < OC; ++o) out[i * OC + o] = bias[o];
    beta = 1;
  }
  gemm<T>(false, true, N, OC, C, T(1), inp, C, w, C, beta, out, OC);
}

template <typename T>
void matmul_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w, int64_t N, int64_t C, int64_t OC,
                     bool accumulate_dinp) {
  if (dinp) gemm<T>(false, false, N, C, OC, T(1), dout, OC, w, C, accumulate_dinp ? T(1) : T(0), dinp, C);
  if (dw) gemm<T>(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dw, C);
  if (dbias) bias_add_backward<T>(dbias, dout, N, OC);
}

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = inp + i * C;
    double m = 0;
    for (int64_t c = 0; c < C; ++c) m += x[c];
    m /= C;
    double v = 0;
    for (int64_t c = 0; c < C; ++c) {
      double d = x[c] - m;
      v += d * d;
    }
    v /= C;
    T s = static_cast<T>(1.0 / std::sqrt(v + eps));
    T mt = static_cast<T>(m);
    T* y = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - mt) * s * w[c] + b[c];
    mean[i] = mt;
    rstd[i] = s;
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean, const T* rstd,
                        int64_t N, int64_t C, bool accumulate_dinp) {
  // dinp: per row. dw/db: per column (ordered sum over rows, thread-count independent).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = inp + i * C;
    const T* dy = dout + i * C;
    T m = mean[i], s = rstd[i];
    double dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      double norm = (x[c] - m) * s;
      double dnorm = static_cast<double>(w[c]) * dy[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= C;
    dnorm_norm_mean /= C;
    T* dx = dinp + i * C;
    for (int64_t c = 0; c < C; ++c) {
      double norm = (x[c] - m) * s;
      double dnorm = static_cast<double>(w[c]) * dy[c];
      T g = static_cast<T>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
      dx[c] = accumulate_dinp ? dx[c] + g : g;
    }
  }
  constexpr int64_t kCols = 64;
  int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < blocks; ++bk) {
    int64_t c0 = bk * kCols, c1 = std::min(C, c0 + kCols);
    T accw[kCols] = {}, accb[kCols] = {};
    for (int64_t i = 0; i < N; ++i) {
      const T* x = inp + i * C;
      const T* dy = dout + i * C;
      T m = mean[i], s = rstd[i];
      for (int64_t c = c0; c < c1; ++c) {
        accw[c - c0] += (x[c] - m) * s * dy[c];
        accb[c - c0] += dy[c];
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      dw[c] += accw[c - c0];
      db[c] += accb[c - c0];
    }
  }
}

namespace {
constexpr double kGeluC = 0.7978845608028654;  // sqrt(2/pi)

// exp(x) for float in plain arithmetic, so loops that call it vectorise (glibc's vector
// math is only declared under -ffast-math). Cephes' polynomial on [-ln2/2, ln2/2] after
// x = n ln2 + r; about 1 ulp, input clamped to the finite range.
inline float exp_vec(float x) {
  x = std::min(88.3762626647949f, std::max(-87.3365447505531f, x));
  const float m = 12582912.0f;                    // 1.5 * 2^23: adding it rounds to an integer
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

// GELU with 0.5 (1 + tanh(u)) written as the logistic s = 1 / (1 + exp(-2u)) (the same
// function, without the cancellation of 1 + tanh near -1): y = x s, and
// dy/dx = s + 2 x s (1 - s) du/dx. Float uses exp_vec (vectorises); double std::exp.
template <typename T>
inline T exp_any(T v) {
  if constexpr (std::is_same_v<T, float>)
    return exp_vec(v);
  else
    return std::exp(v);
}
}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T x = inp[i];
    T u = static_cast<T>(kGeluC) * (x + T(0.044715) * x * x * x);
    out[i] = x / (T(1) + exp_any(T(-2) * u));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T x = inp[i];
    T u = static_cast<T>(kGeluC) * (x + T(0.044715) * x * x * x);
    T sg = T(1) / (T(1) + exp_any(T(-2) * u));
    T du = static_cast<T>(kGeluC) * (T(1) + T(3 * 0.044715) * x * x);
    dinp[i] = dout[i] * (sg + T(2) * x * sg * (T(1) - sg) * du);
  }
}

template <typename T>
void dropout(T* out, const T* inp, int64_t n, double p, uint64_t key, uint64_t base) {
  if (p <= 0) {
    if (out != inp)
      for (int64_t i = 0; i < n; ++i) out[i] = inp[i];
    return;
  }
  T s = static_cast<T>(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = keep(key, base + i, p) ? inp[i] * s : T(0);
}

namespace {

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
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          const T* k = base + j * row + D;
          T s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t d = 0; d < D; ++d) s += q[d] * k[d];
          Pi[j] = s * scale;
          mx = std::max(mx, Pi[j]);
        }
        T sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          Pi[j] = std::exp(Pi[j] - mx);
          sum += Pi[j];
        }
        if (lse) lse[(b * H + h) * Tn + i] = mx + std::log(sum);
        const T inv = T(1) / sum;
        for (int64_t j = 0; j <= i; ++j) Pi[j] *= inv;
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

}  // namespace

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
  // 2) query past + i attends to cache positions [0, past + i]; the arithmetic order of
  //    attention_forward_rows (scores, max-subtracted exp, normalise, weighted sum of V)
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
          T mx = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < n; ++j) {
            const T* k = kc + j * D;
            T acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t d = 0; d < D; ++d) acc += q[d] * k[d];
            s[j] = acc * scale;
            mx = std::max(mx, s[j]);
          }
          T sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            s[j] = std::exp(s[j] - mx);
            sum += s[j];
          }
          const T inv = T(1) / sum;
          T* o = out + (b * Tn + i) * H * D + h * D;
          for (int64_t d = 0; d < D; ++d) o[d] = 0;
          for (int64_t j = 0; j < n; ++j) {
            const T pj = s[j] * inv;
            const T* v = vc + j * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) o[d] += pj * v[d];
          }
        }
  }
}
template void attention_cached_forward<float>(float*, float*, float*, const float*, int64_t, int64_t, int64_t, int64_t,
                                              int64_t, int64_t);
template void attention_cached_forward<double>(double*, double*, double*, const double*, int64_t, int64_t, int64_t,
                                               int64_t, int64_t, int64_t);

template <typename T>
void embedding_forward(T* out, const int32_t* tok, const T* table, int64_t N, int64_t C, int64_t vstart, int64_t vlocal) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    int64_t id = static_cast<int64_t>(tok[i]) - vstart;
    T* o = out + i * C;
    if (id >= 0 && id < vlocal) {
      const T* r = table + id * C;
      for (int64_t c = 0; c < C; ++c) o[c] = r[c];
    } else {
      for (int64_t c = 0; c < C; ++c) o[c] = 0;
    }
  }
}

template <typename T>
void embedding_backward(T* dtable, const int32_t* tok, const T* dout, int64_t N, int64_t C, int64_t vstart, int64_t vlocal) {
  // Rows are scattered by token id; split the work by column blocks so no two threads
  // touch the same element and the summation order is the row order for any thread count.
  constexpr int64_t kCols = 64;
  int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < blocks; ++bk) {
    int64_t c0 = bk * kCols, c1 = std::min(C, c0 + kCols);
    for (int64_t i = 0; i < N; ++i) {
      int64_t id = static_cast<int64_t>(tok[i]) - vstart;
      if (id < 0 || id >= vlocal) continue;
      T* r = dtable + id * C;
      const T* g = dout + i * C;
      for (int64_t c = c0; c < c1; ++c) r[c] += g[c];
    }
  }
}

template <typename T>
void position_forward(T* x, const T* pos, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * C;
    const T* pr = pos + ((row_start + r) % seq_len) * C;
    for (int64_t c = 0; c < C; ++c) xr[c] += pr[c];
  }
}

template <typename T>
void position_backward(T* dpos, const T* dx, int64_t rows, int64_t C, int64_t row_start, int64_t seq_len) {
  // Column blocks per thread; rows summed in order (thread-count independent).
  constexpr int64_t kCols = 64;
  int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < blocks; ++bk) {
    int64_t c0 = bk * kCols, c1 = std::min(C, c0 + kCols);
    for (int64_t r = 0; r < rows; ++r) {
      T* pr = dpos + ((row_start + r) % seq_len) * C;
      const T* g = dx + r * C;
      for (int64_t c = c0; c < c1; ++c) pr[c] += g[c];
    }
  }
}

template <typename T>
void bias_add_forward(T* x, const T* b, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) x[i * C + c] += b[c];
}

template <typename T>
void bias_add_backward(T* db, const T* dout, int64_t N, int64_t C) {
  constexpr int64_t kCols = 64;
  int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < blocks; ++bk) {
    int64_t c0 = bk * kCols, c1 = std::min(C, c0 + kCols);
    T acc[kCols] = {};
    for (int64_t i = 0; i < N; ++i)
      for (int64_t c = c0; c < c1; ++c) acc[c - c0] += dout[i * C + c];
    for (int64_t c = c0; c < c1; ++c) db[c] += acc[c - c0];
  }
}

template <typename T>
void xent_rowmax(T* rowmax, const T* logits, int64_t N, int64_t V, int64_t valid) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    T m = -std::numeric_limits<T>::infinity();
    const T* l = logits + i * V;
    for (int64_t v = 0; v < valid; ++v) m = std::max(m, l[v]);
    rowmax[i] = m;
  }
}

template <typename T>
void xent_sumexp_target(T* sumexp, T* target_logit, const T* logits, const int32_t* targets, const T* rowmax, int64_t N,
                        int64_t V, int64_t vstart, int64_t valid) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* l = logits + i * V;
    const T m = rowmax[i];
    // exp in T (vectorised), summed in blocks of 1024 into a double: accurate and fast.
    double s = 0;
    for (int64_t v0 = 0; v0 < valid; v0 += 1024) {
      const int64_t v1 = std::min(valid, v0 + 1024);
      T part = 0;
#pragma omp simd reduction(+ : part)
      for (int64_t v = v0; v < v1; ++v) part += std::exp(l[v] - m);
      s += part;
    }
    sumexp[i] = static_cast<T>(s);
    int64_t t = static_cast<int64_t>(targets[i]) - vstart;
    target_logit[i] = (t >= 0 && t < valid) ? l[t] : T(0);
  }
}

template <typename T>
void xent_backward(T* dlogits, const T* logits, const int32_t* targets, const T* rowmax, const T* sumexp, const T* dloss,
                   int64_t N, int64_t V, int64_t vstart, int64_t valid) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* l = logits + i * V;
    T* dl = dlogits + i * V;
    T m = rowmax[i], inv = T(1) / sumexp[i], g = dloss[i];
    int64_t t = static_cast<int64_t>(targets[i]) - vstart;
#pragma omp simd
    for (int64_t v = 0; v < valid; ++v) dl[v] = std::exp(l[v] - m) * inv * g;
    for (int64_t v = valid; v < V; ++v) dl[v] = 0;
    if (t >= 0 && t < valid) dl[t] -= g;
  }
}

template <typename T>
void adamw(T* param, const T* grad, T* m, T* v, int64_t n, double lr, double b1, double b2, double eps, double wd,
           int64_t step, double grad_scale) {
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  const T tb1 = static_cast<T>(b1), tb2 = static_cast<T>(b2), gs = static_cast<T>(grad_scale);
  const T step_size = static_cast<T>(lr / bc1), inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bc2));
  const T teps = static_cast<T>(eps), decay = static_cast<T>(lr * wd);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i] * gs;
    T mi = tb1 * m[i] + (T(1) - tb1) * g;
    T vi = tb2 * v[i] + (T(1) - tb2) * g * g;
    m[i] = mi;
    v[i] = vi;
    T denom = std::sqrt(vi) * inv_sqrt_bc2 + teps;
    param[i] -= step_size * mi / denom + decay * param[i];
  }
}

#define MTNLG_INSTANTIATE(T)                                                                                          \
  template void matmul_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);                        \
  template void matmul_backward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, bool);         \
  template void layernorm_forward<T>(T*, T*, T*, const T*, const T*, const T*, int64_t, int64_t, double);              \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t, int64_t,  \
                                      bool);                                                                           \
  template void gelu_forward<T>(T*, const T*, int64_t);                                                                \
  template void gelu_backward<T>(T*, const T*, const T*, int64_t);                                                     \
  template void dropout<T>(T*, const T*, int64_t, double, uint64_t, uint64_t);                                         \
  template void attention_forward<T>(T*, T*, const T*, int64_t, int64_t, int64_t, int64_t, double, uint64_t, int64_t,  \
                                     int64_t, int64_t);                                                                \
  template void attention_backward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, double,    \
                                      uint64_t, int64_t, int64_t, int64_t);                                            \
  template void attention_forward_lse<T>(T*, T*, const T*, int64_t, int64_t, int64_t, int64_t, double, uint64_t,      \
                                         int64_t, int64_t, int64_t);                                                  \
  template void attention_backward_lse<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, double, \
                                          uint64_t, int64_t, int64_t, int64_t);                                       \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t);                \
  template void embedding_backward<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t);               \
  template void position_forward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t);                                 \
  template void position_backward<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t);                                \
  template void bias_add_forward<T>(T*, const T*, int64_t, int64_t);                                                   \
  template void bias_add_backward<T>(T*, const T*, int64_t, int64_t);                                                  \
  template void xent_rowmax<T>(T*, const T*, int64_t, int64_t, int64_t);                                               \
  template void xent_sumexp_target<T>(T*, T*, const T*, const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t); \
  template void xent_backward<T>(T*, const T*, const int32_t*, const T*, const T*, const T*, int64_t, int64_t,         \
                                 int64_t, int64_t);                                                                    \
  template void adamw<T>(T*, const T*, T*, T*, int64_t, double, double, double, double, double, int64_t, double);

MTNLG_INSTANTIATE(float)
MTNLG_INSTANTIATE(double)

}  // namespace mtnlg::cpu
