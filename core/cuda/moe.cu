// Mixture of experts on CUDA: top-k routing and its backward, the load-balancing scores,
// losses and counts, the z-loss, the permutation of rows by expert and its inverse, the
// routing weight on each expert row, the experts as one grouped GEMM (cuBLAS's
// cublasGemmGroupedBatchedEx), the expert-bias update and the shared expert's gate.
// CPU reference: core/ops/moe.cpp (docs/specs/moe.md); the dispatch plan and the capacity
// are made on the host there for both devices (their sizes decide the next launches).
//
// Precision: the router's side (logits, probs, scores, counts, their gradients, the
// expert bias) is f32 on CUDA and computed in double per row, as the CPU does, so that
// the discrete choices (top-k, groups) are the CPU's; the data path (rows, activations,
// the shared expert's gate) is f32, bf16 or f16 with fp32 arithmetic and one rounding
// per stored value; parameter gradients are f32 and accumulate.
// Determinism: every sum runs in a fixed order (a row's experts in order, a warp's lanes
// in a fixed tree, a group's rows in order); the counts are integers added atomically
// (exact in f32 below 2^24).
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cuda/common.cuh"
#include "core/cuda/cublas_classic.hpp"
#include "core/cuda/moe_cuda.hpp"

namespace mtnlg::cuda::k {

// core/cuda/gemm.cu's launchers, used per expert.
void gemm_dw(float* dw, const void* dout, const void* inp, DType dt, int64_t N, int64_t C, int64_t OC);
void bias_add_forward(void* x, const void* b, DType dt, int64_t N, int64_t C);
void bias_add_backward(float* db, const void* dout, DType dt, int64_t N, int64_t C);

// One problem of a grouped GEMM, column-major (cuBLAS's arguments): C = op(A) op(B) + beta C,
// op(A) m x k, op(B) k x n.
struct GroupedProblem {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0;
  const void* A = nullptr;
  int64_t lda = 0;
  const void* B = nullptr;
  int64_t ldb = 0;
  void* C = nullptr;
  int64_t ldc = 0;
  float beta = 0.0f;
};

namespace {

constexpr int kThreads = 256;
// Per-row scratch held in registers/local memory by the routing kernels.
constexpr int kMaxTopk = 32;
constexpr int kMaxGroups = 64;

// The router's form, as a kernel argument.
struct Router {
  int topk = 1;
  bool sigmoid = false, pre_softmax = false;
  double scaling = 0.0;
  int num_groups = 0, group_topk = 0;
};

__device__ __forceinline__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

// The selection score of expert e of row l (the logits of one row), given the row's max
// and softmax denominator (pre-softmax) or nothing.
template <typename R>
struct RowScores {
  const R* l = nullptr;
  const float* bias = nullptr;
  const R* sel = nullptr;  // the row of a given selection (sinkhorn's), or null
  double m = 0, z = 1;
  Router r;
  __device__ double score(int e) const {  // the weight source: softmax prob, sigmoid, or logit
    if (r.sigmoid) return sigmoid_d(double(l[e]));
    if (r.pre_softmax) return exp(double(l[e]) - m) / z;
    return double(l[e]);
  }
  __device__ double select(int e) const {
    if (sel) return double(sel[e]);
    return score(e) + (r.sigmoid && bias ? double(bias[e]) : 0.0);
  }
};

__device__ bool taken(const int32_t* chosen, int n, int e) {
  for (int i = 0; i < n; ++i)
    if (chosen[i] == e) return true;
  return false;
}

// The k best experts in [lo, hi) (allowed groups only when `groups` is set), appended to
// out[0..k) in descending selection score, ties to the lower index (a strict-greater scan).
template <typename R>
__device__ void topk_scan(const RowScores<R>& s, int lo, int hi, int k, const int32_t* groups, int ngroups, int per,
                          int32_t* out) {
  for (int j = 0; j < k; ++j) {
    int best = -1;
    double bv = 0;
    for (int e = lo; e < hi; ++e) {
      if (taken(out, j, e)) continue;
      if (groups && !taken(groups, ngroups, e / per)) continue;
      const double v = s.select(e);
      if (best < 0 || v > bv) best = e, bv = v;
    }
    out[j] = best;
  }
}

template <typename R>
__global__ void topk_forward_kernel(R* probs, int32_t* idx, const R* logits, const float* bias, const R* selection,
                                    int64_t N, int E, Router r) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  RowScores<R> s;
  s.l = logits + n * E, s.bias = bias, s.r = r;
  if (selection) s.sel = selection + n * E;
  if (r.pre_softmax) {
    double m = -INFINITY, z = 0;
    for (int e = 0; e < E; ++e) m = fmax(m, double(s.l[e]));
    for (int e = 0; e < E; ++e) z += exp(double(s.l[e]) - m);
    s.m = m, s.z = z;
  }
  const int k = r.topk;
  int32_t chosen[kMaxTopk];
  if (r.group_topk > 0) {
    const int per = E / r.num_groups, take = k / r.group_topk;
    double gscore[kMaxGroups];
    int32_t tmp[kMaxTopk], best_groups[kMaxGroups];
    for (int g = 0; g < r.num_groups; ++g) {
      topk_scan(s, g * per, (g + 1) * per, take, nullptr, 0, per, tmp);
      double sum = 0;
      for (int j = 0; j < take; ++j) sum += s.select(tmp[j]);
      gscore[g] = sum;
    }
    for (int j = 0; j < r.group_topk; ++j) {  // the best groups, ties to the lower index
      int best = -1;
      for (int g = 0; g < r.num_groups; ++g)
        if (!taken(best_groups, j, g) && (best < 0 || gscore[g] > gscore[best])) best = g;
      best_groups[j] = best;
    }
    topk_scan(s, 0, E, k, best_groups, r.group_topk, per, chosen);
  } else {
    topk_scan(s, 0, E, k, nullptr, 0, 1, chosen);
  }
  double w[kMaxTopk], sum = 0;
  if (!r.sigmoid && !r.pre_softmax) {  // softmax over the chosen logits
    double m = -INFINITY;
    for (int j = 0; j < k; ++j) m = fmax(m, double(s.l[chosen[j]]));
    for (int j = 0; j < k; ++j) sum += (w[j] = exp(double(s.l[chosen[j]]) - m));
    for (int j = 0; j < k; ++j) w[j] /= sum;
  } else {
    for (int j = 0; j < k; ++j) sum += (w[j] = s.score(chosen[j]));
    if (r.sigmoid && k > 1)
      for (int j = 0; j < k; ++j) w[j] /= sum + 1e-20;
  }
  for (int j = 0; j < k; ++j) {
    idx[n * k + j] = chosen[j];
    probs[n * k + j] = R(r.scaling != 0 ? w[j] * r.scaling : w[j]);
  }
}

// dlogits (written) of one row from the weights' gradient dprobs, the selection fixed.
template <typename R>
__global__ void topk_backward_kernel(R* dlogits, const R* dprobs, const R* logits, const int32_t* idx, int64_t N, int E,
                                     Router r) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  const int k = r.topk;
  const R* l = logits + n * E;
  const int32_t* id = idx + n * k;
  R* dl = dlogits + n * E;
  const double sf = r.scaling != 0 ? r.scaling : 1.0;
  double g[kMaxTopk];
  for (int j = 0; j < k; ++j) g[j] = double(dprobs[n * k + j]) * sf;
  for (int e = 0; e < E; ++e) dl[e] = R(0);
  if (!r.sigmoid && !r.pre_softmax) {
    double q[kMaxTopk], m = -INFINITY, sum = 0, dot = 0;
    for (int j = 0; j < k; ++j) m = fmax(m, double(l[id[j]]));
    for (int j = 0; j < k; ++j) sum += (q[j] = exp(double(l[id[j]]) - m));
    for (int j = 0; j < k; ++j) q[j] /= sum, dot += q[j] * g[j];
    for (int j = 0; j < k; ++j) dl[id[j]] = R(q[j] * (g[j] - dot));
  } else if (!r.sigmoid) {
    double m = -INFINITY, z = 0, dot = 0;
    for (int e = 0; e < E; ++e) m = fmax(m, double(l[e]));
    for (int e = 0; e < E; ++e) z += exp(double(l[e]) - m);
    for (int j = 0; j < k; ++j) dot += exp(double(l[id[j]]) - m) / z * g[j];
    for (int e = 0; e < E; ++e) {
      double G = 0;
      for (int j = 0; j < k; ++j)
        if (id[j] == e) G = g[j];
      dl[e] = R(exp(double(l[e]) - m) / z * (G - dot));
    }
  } else {
    double v[kMaxTopk], sum = 0, gv = 0;
    for (int j = 0; j < k; ++j) sum += (v[j] = sigmoid_d(double(l[id[j]])));
    const double S = sum + 1e-20;
    for (int j = 0; j < k; ++j) gv += g[j] * v[j];
    for (int j = 0; j < k; ++j) {
      const double dv = k > 1 ? g[j] / S - gv / (S * S) : g[j];
      dl[id[j]] = R(dv * v[j] * (1 - v[j]));
    }
  }
}

// Sinkhorn's factors in one block (ops::moe_sinkhorn): each round the row factors d0 (a
// thread per row, its experts in order), then the column factors d1 (a thread per expert,
// the rows in order) with each one's change in dd, summed in expert order by thread 0.
template <typename R>
__global__ void sinkhorn_kernel(R* out, const R* logits, double* d0, double* d1, double* dd, int64_t N, int E,
                                double tol, int64_t max_iter) {
  __shared__ bool stop;
  const double eps = 1e-8;
  for (int e = threadIdx.x; e < E; e += blockDim.x) d1[e] = 1.0;
  __syncthreads();
  for (int64_t it = 0; it < max_iter; ++it) {
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
      double s = 0;
      for (int e = 0; e < E; ++e) s += d1[e] * exp(double(logits[n * E + e]));
      d0[n] = 1.0 / double(N) / (s + eps);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      double s = 0;
      for (int64_t n = 0; n < N; ++n) s += d0[n] * exp(double(logits[n * E + e]));
      const double v = 1.0 / double(E) / (s + eps);
      dd[e] = fabs(d1[e] - v);
      d1[e] = v;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double err = 0;
      for (int e = 0; e < E; ++e) err += dd[e];
      stop = err / double(E) <= tol;
    }
    __syncthreads();
    if (stop) break;
  }
  for (int64_t i = threadIdx.x; i < N * E; i += blockDim.x) out[i] = R(d1[i % E] * exp(double(logits[i])) * d0[i / E]);
}

// The balancing loss's scores of one row (softmax, or sigmoid over its sum + 1e-20) and
// the row's own top-k of them counted into its group's counts.
template <typename R>
__global__ void aux_scores_kernel(R* scores, R* counts, const R* logits, int64_t N, int E, bool sigmoid, int topk,
                                  int64_t per) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  const R* l = logits + n * E;
  R* s = scores + n * E;
  double m = -INFINITY, z = 0;
  if (sigmoid) {
    for (int e = 0; e < E; ++e) z += sigmoid_d(double(l[e]));
    z += 1e-20;
  } else {
    for (int e = 0; e < E; ++e) m = fmax(m, double(l[e]));
    for (int e = 0; e < E; ++e) z += exp(double(l[e]) - m);
  }
  for (int e = 0; e < E; ++e) s[e] = R((sigmoid ? sigmoid_d(double(l[e])) : exp(double(l[e]) - m)) / z);
  // The top-k of the scores in double (the CPU's order): a strict-greater scan per slot.
  int32_t chosen[kMaxTopk];
  for (int j = 0; j < topk; ++j) {
    int best = -1;
    double bv = 0;
    for (int e = 0; e < E; ++e) {
      if (taken(chosen, j, e)) continue;
      const double v = (sigmoid ? sigmoid_d(double(l[e])) : exp(double(l[e]) - m)) / z;
      if (best < 0 || v > bv) best = e, bv = v;
    }
    chosen[j] = best;
    atomicAdd(&counts[(n / per) * E + best], R(1));
  }
}

template <typename R>
__global__ void aux_scores_backward_kernel(R* dlogits, const R* dscores, const R* logits, int64_t N, int E,
                                           bool sigmoid) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  const R *l = logits + n * E, *d = dscores + n * E;
  R* dl = dlogits + n * E;
  double m = -INFINITY, z = 0, dot = 0;
  if (!sigmoid) {
    for (int e = 0; e < E; ++e) m = fmax(m, double(l[e]));
    for (int e = 0; e < E; ++e) z += exp(double(l[e]) - m);
    for (int e = 0; e < E; ++e) dot += exp(double(l[e]) - m) / z * double(d[e]);
    for (int e = 0; e < E; ++e) {
      const double s = exp(double(l[e]) - m) / z;
      dl[e] = R(double(dl[e]) + s * (double(d[e]) - dot));
    }
    return;
  }
  for (int e = 0; e < E; ++e) z += sigmoid_d(double(l[e]));
  const double S = z + 1e-20;
  for (int e = 0; e < E; ++e) dot += double(d[e]) * sigmoid_d(double(l[e]));
  for (int e = 0; e < E; ++e) {
    const double s = sigmoid_d(double(l[e]));
    dl[e] = R(double(dl[e]) + (double(d[e]) / S - dot / (S * S)) * s * (1 - s));
  }
}

// P[g, e] = sum of group g's rows of scores[:, e], rows in order (double).
template <typename R>
__global__ void group_colsum_kernel(double* P, const R* scores, int64_t groups, int64_t per, int E) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= groups * E) return;
  const int64_t g = i / E, e = i % E;
  double s = 0;
  for (int64_t n = g * per; n < (g + 1) * per; ++n) s += double(scores[n * E + e]);
  P[i] = s;
}

// scale (optional): a factor read from device memory (the loss weight a graph replay refreshes).
template <typename R>
__global__ void aux_loss_backward_kernel(R* dscores, const R* counts, int64_t N, int E, int64_t per, double f,
                                         const double* scale) {
  const int64_t i0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (scale) f *= *scale;
  for (int64_t i = i0; i < N * E; i += int64_t(gridDim.x) * blockDim.x)
    dscores[i] = R(f * double(counts[(i / E / per) * E + i % E]));
}

template <typename R>
__global__ void row_lse_kernel(double* lse, const R* logits, int64_t N, int E) {
  const int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (n >= N) return;
  double m = -INFINITY, s = 0;
  for (int e = 0; e < E; ++e) m = fmax(m, double(logits[n * E + e]));
  for (int e = 0; e < E; ++e) s += exp(double(logits[n * E + e]) - m);
  lse[n] = m + log(s);
}

template <typename R>
__global__ void z_loss_backward_kernel(R* dlogits, const R* logits, const double* lse, int64_t N, int E, double f,
                                       const double* scale) {
  const int64_t i0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (scale) f *= *scale;
  for (int64_t i = i0; i < N * E; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / E;
    dlogits[i] = R(double(dlogits[i]) + f * lse[n] * exp(double(logits[i]) - lse[n]));
  }
}

// acc[0] += f * sum_i a[i] * b[i] over i in order (one thread: the host's order and sum).
template <typename R>
__global__ void aux_loss_acc_kernel(double* acc, const double* P, const R* counts, int64_t n, double f) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) loss += P[i] * double(counts[i]);
  acc[0] += loss * f;
}
// acc[0] += f * sum_n lse[n]^2, rows in order.
__global__ void z_loss_acc_kernel(double* acc, const double* lse, int64_t N, double f) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0;
  for (int64_t n = 0; n < N; ++n) s += lse[n] * lse[n];
  acc[0] += f * s;
}

// The padded plan (ops::moe_padded_dispatch_plan). rank[s]: slot s's place in its expert's
// keep order (probs: descending weight, ties to the earlier slot, as the host's stable
// sort; position: slot order). A thread per slot, scanning all slots.
__global__ void capacity_rank_kernel(int32_t* rank, const float* probs, const int32_t* idx, int64_t slots,
                                     bool by_prob) {
  const int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (s >= slots) return;
  const int32_t e = idx[s];
  const float p = probs[s];
  int32_t r = 0;
  for (int64_t t = 0; t < slots; ++t)
    if (idx[t] == e && (by_prob ? (probs[t] > p || (probs[t] == p && t < s)) : t < s)) ++r;
  rank[s] = r;
}
// Kept slots (rank < cap) take their expert's rows in slot order: row e * cap + (kept slots
// of e before s). row_src and row_slot are -1 beforehand (padding).
__global__ void padded_rows_kernel(int32_t* slot_row, int32_t* row_src, int32_t* row_slot, const int32_t* rank,
                                   const int32_t* idx, int64_t slots, int topk, int32_t cap) {
  const int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (s >= slots) return;
  const int32_t e = idx[s];
  if (rank[s] >= cap) {
    slot_row[s] = -1;
    return;
  }
  int32_t pos = 0;
  for (int64_t t = 0; t < s; ++t)
    if (idx[t] == e && rank[t] < cap) ++pos;
  const int64_t r = int64_t(e) * cap + pos;
  slot_row[s] = int32_t(r);
  row_src[r] = int32_t(s / topk);
  row_slot[r] = int32_t(s);
}
// kept[e] = min(routed to e, cap): a thread per expert.
__global__ void kept_kernel(int32_t* kept, const int32_t* idx, int64_t slots, int E, int32_t cap) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  int32_t n = 0;
  for (int64_t t = 0; t < slots; ++t) n += idx[t] == e;
  kept[e] = n < cap ? n : cap;
}
__global__ void fill_i32_kernel(int32_t* x, int64_t n, int32_t v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = v;
}
// record[e] += kept[e], record[E] += slots - sum(kept), record[E + 3] += 1.
__global__ void record_routing_kernel(double* record, const int32_t* kept, int E, int64_t slots) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int64_t sum = 0;
  for (int e = 0; e < E; ++e) {
    record[e] += double(kept[e]);
    sum += kept[e];
  }
  record[E] += double(slots - sum);
  record[E + 3] += 1.0;
}

// The grouped GEMM's pointer arrays when each array is an arithmetic progression
// (fixed-size groups): ptr[j * G + i] = base[j] + i * stride[j], written on the device.
struct PtrRows {
  const char* base[3];
  int64_t stride[3];
};
__global__ void grouped_ptrs_kernel(const void** ptrs, PtrRows p, int G) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= G) return;
  for (int j = 0; j < 3; ++j) ptrs[j * G + i] = p.base[j] + i * p.stride[j];
}

// The router's GEMM in double (moe_router_dtype fp64): logits[n, e] = sum_h x[n, h] w[e, h]
// (a thread per output, h in order); dx[n, h] = sum_e dl[n, e] w[e, h] (written, stored in
// x's dtype); dw[e, h] += sum_n dl[n, e] x[n, h] (the fp32 gradient).
template <typename T, typename W>
__global__ void router_gemm64_kernel(double* logits, const T* x, const W* w, int64_t N, int64_t H, int64_t E) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * E; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / E, e = i % E;
    double s = 0;
    for (int64_t h = 0; h < H; ++h) s += double(to_f(x[n * H + h])) * double(to_f(w[e * H + h]));
    logits[i] = s;
  }
}
template <typename T, typename W>
__global__ void router_gemm64_dx_kernel(T* dx, const double* dl, const W* w, int64_t N, int64_t H, int64_t E) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * H; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / H, h = i % H;
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += dl[n * E + e] * double(to_f(w[e * H + h]));
    dx[i] = from_f<T>(float(s));
  }
}
template <typename T>
__global__ void router_gemm64_dw_kernel(float* dw, const double* dl, const T* x, int64_t N, int64_t H, int64_t E) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < E * H; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / H, h = i % H;
    double s = 0;
    for (int64_t n = 0; n < N; ++n) s += dl[n * E + e] * double(to_f(x[n * H + h]));
    dw[i] = float(double(dw[i]) + s);
  }
}

template <typename T>
__global__ void permute_kernel(T* out, const T* x, const int32_t* row_src, int64_t rows, int64_t H) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * H; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t src = row_src[i / H];
    out[i] = src < 0 ? from_f<T>(0.0f) : x[src * H + i % H];
  }
}

// y[n] = sum of n's kept slots' rows in slot order, in fp32, rounded once.
template <typename T>
__global__ void unpermute_kernel(T* y, const T* rows, const int32_t* slot_row, int64_t N, int k, int64_t H) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * H; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t n = i / H, c = i % H;
    float s = 0;
    for (int j = 0; j < k; ++j)
      if (const int32_t r = slot_row[n * k + j]; r >= 0) s += to_f(rows[r * H + c]);
    y[i] = from_f<T>(s);
  }
}

template <typename T>
__global__ void weight_rows_kernel(T* out, const T* act, const float* probs, const int32_t* row_slot, int64_t rows,
                                   int64_t F) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * F; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t slot = row_slot[i / F];
    out[i] = from_f<T>(slot < 0 ? 0.0f : to_f(act[i]) * probs[slot]);
  }
}

// dprobs[s] = sum_f dout * act over slot s's row (a warp per slot, lanes striding F, a
// fixed tree across lanes); 0 for dropped slots.
template <typename T>
__global__ void weight_rows_dprobs_kernel(float* dprobs, const T* dout, const T* act, const int32_t* slot_row,
                                          int64_t slots, int64_t F) {
  const int64_t s = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (s >= slots) return;  // whole warps leave together (blockDim is a multiple of 32)
  const int32_t r = slot_row[s];
  float acc = 0;
  if (r >= 0)
    for (int64_t c = lane; c < F; c += 32) acc += to_f(dout[r * F + c]) * to_f(act[r * F + c]);
  acc = warp_sum(acc);
  if (lane == 0) dprobs[s] = acc;
}

__global__ void expert_bias_kernel(float* bias, const float* counts, int E, double rate) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double mean = 0;
  for (int e = 0; e < E; ++e) mean += double(counts[e]);
  mean /= E;
  for (int e = 0; e < E; ++e) {
    const double off = mean - double(counts[e]);
    bias[e] = float(double(bias[e]) + rate * (off > 0 ? 1.0 : off < 0 ? -1.0 : 0.0));
  }
}

template <typename T>
__global__ void sigmoid_gate_kernel(T* out, const T* x, const T* gate, int64_t N, int64_t C) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < N * C; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f<T>(to_f(x[i]) / (1.0f + expf(-to_f(gate[i / C]))));
}

// A warp per row: dx = dout * s (written), dgate = sum_c dout x * s (1 - s).
template <typename T>
__global__ void sigmoid_gate_backward_kernel(T* dx, T* dgate, const T* dout, const T* x, const T* gate, int64_t N,
                                             int64_t C) {
  const int64_t n = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const float s = 1.0f / (1.0f + expf(-to_f(gate[n])));
  float acc = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = to_f(dout[n * C + c]);
    acc += d * to_f(x[n * C + c]);
    dx[n * C + c] = from_f<T>(d * s);
  }
  acc = warp_sum(acc);
  if (lane == 0) dgate[n] = from_f<T>(acc * s * (1.0f - s));
}

template <typename T>
__global__ void jitter_kernel(T* out, const T* x, int64_t n, float eps, uint64_t key, uint64_t base, DeviceKey dkey) {
  const uint64_t k = dkey.key(key), b = dkey.offset(base);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = philox_uniform(k, 1, b + static_cast<uint64_t>(i));
    out[i] = from_f<T>(to_f(x[i]) * (1.0f - eps + 2.0f * eps * u));
  }
}

unsigned row_blocks(int64_t n, int threads = kThreads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

// ---- cuBLAS's grouped GEMM --------------------------------------------------------------

namespace {
cudaDataType_t grouped_type(DType dt) {
  switch (dt) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: fail("grouped GEMM: storage dtype other than f32, bf16, f16");
  }
}
}  // namespace

// One problem per non-empty expert, column-major as cuBLAS wants it (a row-major [R, K]
// matrix is a column-major [K, R] one). The pointer arrays go to device memory through
// one upload; the dimension and scale arrays stay on the host (as documented).
void grouped_gemm(const std::vector<GroupedProblem>& ps, DType dt) {
  if (ps.empty()) return;
  const auto G = static_cast<int>(ps.size());
  std::vector<cublasOperation_t> ta(G), tb(G);
  std::vector<int> m(G), n(G), kk(G), lda(G), ldb(G), ldc(G), size(G, 1);
  std::vector<float> alpha(G, 1.0f), beta(G);
  std::vector<const void*> ptrs(3 * static_cast<size_t>(G));
  for (int i = 0; i < G; ++i) {
    const GroupedProblem& p = ps[static_cast<size_t>(i)];
    for (int64_t v : {p.m, p.n, p.k, p.lda, p.ldb, p.ldc})
      if (v > INT32_MAX) fail("grouped GEMM: a dimension exceeds cuBLAS's 32-bit sizes");
    ta[i] = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb[i] = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    m[i] = int(p.m), n[i] = int(p.n), kk[i] = int(p.k), lda[i] = int(p.lda), ldb[i] = int(p.ldb), ldc[i] = int(p.ldc);
    beta[i] = p.beta;
    ptrs[static_cast<size_t>(i)] = p.A, ptrs[static_cast<size_t>(G + i)] = p.B,
    ptrs[static_cast<size_t>(2 * G + i)] = p.C;
  }
  // The pointer arrays: made on the device when each is an arithmetic progression (fixed-size
  // groups: a CUDA graph can capture that), else through the staging ring (an asynchronous
  // upload, which a capture refuses); the dimension and scale arrays are read by the call.
  Tensor dev = Tensor::empty({static_cast<int64_t>(ptrs.size() * sizeof(void*) / 4)}, DType::i32, Device::cuda);
  PtrRows pr{};
  bool progression = true;
  for (int j = 0; j < 3; ++j) {
    const auto* b = static_cast<const char*>(ptrs[static_cast<size_t>(j * G)]);
    pr.base[j] = b;
    pr.stride[j] = G > 1 ? static_cast<const char*>(ptrs[static_cast<size_t>(j * G + 1)]) - b : 0;
    for (int i = 2; i < G && progression; ++i)
      progression = static_cast<const char*>(ptrs[static_cast<size_t>(j * G + i)]) == b + i * pr.stride[j];
  }
  if (progression) {
    MTNLG_LAUNCH(row_blocks(G), kThreads, 0, stream(), grouped_ptrs_kernel)
    (static_cast<const void**>(dev.raw()), pr, G);
    MTNLG_CUDA_LAUNCH_CHECK("grouped_ptrs_kernel");
  } else {
    Tensor host = Tensor::empty(dev.shape(), DType::i32);
    std::memcpy(host.raw(), ptrs.data(), ptrs.size() * sizeof(void*));
    dev.copy_from(host);
  }
  const auto* arr = static_cast<const void* const*>(dev.raw());
  const cudaDataType_t t = grouped_type(dt);
  CUBLAS_CHECK(cublasGemmGroupedBatchedEx(cublas_classic(), ta.data(), tb.data(), m.data(), n.data(), kk.data(),
                                          alpha.data(), arr, t, lda.data(), arr + G, t, ldb.data(), beta.data(),
                                          const_cast<void* const*>(arr + 2 * G), t, ldc.data(), G, size.data(),
                                          CUBLAS_COMPUTE_32F));
  // The pointer arrays are read when the stream runs; their block, freed here, is reused
  // only by work queued after the GEMM on the same stream.
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes were checked by core/ops/moe.cpp) --

namespace mtnlg::cuda {

using namespace detail;

namespace {
k::Router router_of(const ops::RouterParams& p) {
  if (p.topk > k::kMaxTopk || p.num_groups > k::kMaxGroups)
    throw_runtime("moe_topk on CUDA: topk {} and num_groups {} must be at most {} and {}", p.topk, p.num_groups,
                  k::kMaxTopk, k::kMaxGroups);
  k::Router r;
  r.topk = static_cast<int>(p.topk);
  r.sigmoid = p.score == ops::RouterScore::sigmoid;
  r.pre_softmax = p.pre_softmax;
  r.scaling = p.scaling_factor;
  r.num_groups = static_cast<int>(p.num_groups);
  r.group_topk = static_cast<int>(p.group_topk);
  return r;
}
int64_t rows_of(const Tensor& t) { return t.dim(-1) ? t.numel() / t.dim(-1) : 0; }
void router_f32(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) need_f32(op, "the router's tensors (logits, probs, scores, counts, bias)", t);
}
// The router's dtype: f32, or f64 (moe_router_dtype fp64); every listed tensor in it.
DType router_dtype(const char* op, std::initializer_list<const Tensor*> ts) {
  DType dt = DType::f32;
  bool first = true;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    if (first) dt = t->dtype(), first = false;
    if (t->dtype() != dt || (dt != DType::f32 && dt != DType::f64))
      throw_runtime("{} on CUDA: the router's tensors (logits, probs, scores, counts) must be all f32 or all f64", op);
  }
  return dt;
}
template <typename R>
R* rt(const Tensor& t) {
  return static_cast<R*>(t.raw());
}
}  // namespace

// The router's kernels for its dtype R (float or double).
#define MTNLG_ROUTER_SWITCH(dt, R, ...) \
  if ((dt) == DType::f64) {             \
    using R = double;                   \
    __VA_ARGS__;                        \
  } else {                              \
    using R = float;                    \
    __VA_ARGS__;                        \
  }

void moe_topk_forward(Tensor& probs, Tensor& idx, const Tensor& logits, const Tensor* expert_bias,
                      const ops::RouterParams& rp, const Tensor* selection) {
  const DType dt = router_dtype("moe_topk_forward", {&probs, &logits, selection});
  need_f32("moe_topk_forward", "expert_bias (the fp32 master weights')", expert_bias);
  const int64_t N = rows_of(logits), E = logits.dim(-1);
  if (N == 0) return;
  MTNLG_ROUTER_SWITCH(dt, R,
                      MTNLG_LAUNCH(k::row_blocks(N), k::kThreads, 0, stream(), k::topk_forward_kernel<R>)(
                          rt<R>(probs), static_cast<int32_t*>(idx.raw()), rt<R>(logits), p<float>(expert_bias),
                          p<R>(selection), N, static_cast<int>(E), router_of(rp)));
  MTNLG_CUDA_LAUNCH_CHECK("topk_forward_kernel");
}

// One block: the rounds' count depends on the data, the loop stays on the device.
void moe_sinkhorn(Tensor& out, const Tensor& logits, double tol, int64_t max_iter) {
  const DType dt = router_dtype("moe_sinkhorn", {&out, &logits});
  const int64_t N = rows_of(logits), E = logits.dim(-1);
  Tensor d0 = Tensor::empty({N}, DType::f64, Device::cuda), d1 = Tensor::empty({E}, DType::f64, Device::cuda);
  Tensor dd = Tensor::empty({E}, DType::f64, Device::cuda);
  auto dp = [](Tensor& t) { return static_cast<double*>(t.raw()); };
  MTNLG_ROUTER_SWITCH(dt, R,
                      MTNLG_LAUNCH(1, k::kThreads, 0, stream(), k::sinkhorn_kernel<R>)(
                          rt<R>(out), rt<R>(logits), dp(d0), dp(d1), dp(dd), N, static_cast<int>(E), tol, max_iter));
  MTNLG_CUDA_LAUNCH_CHECK("sinkhorn_kernel");
}

void moe_topk_backward(Tensor& dlogits, const Tensor& dprobs, const Tensor& logits, const Tensor& idx,
                       const ops::RouterParams& rp) {
  const DType dt = router_dtype("moe_topk_backward", {&dlogits, &dprobs, &logits});
  const int64_t N = rows_of(logits), E = logits.dim(-1);
  if (N == 0) return;
  MTNLG_ROUTER_SWITCH(
      dt, R,
      MTNLG_LAUNCH(k::row_blocks(N), k::kThreads, 0, stream(), k::topk_backward_kernel<R>)(
          rt<R>(dlogits), rt<R>(dprobs), rt<R>(logits), ip(idx), N, static_cast<int>(E), router_of(rp)));
  MTNLG_CUDA_LAUNCH_CHECK("topk_backward_kernel");
}

// The router's GEMM in double (core/ops/moe.cpp composes the f32 one of convert and matmul).
void moe_router_logits_forward(Tensor& logits, const Tensor& x, const Tensor& w) {
  if (logits.dtype() != DType::f64) fail("moe_router_logits_forward on CUDA: the kernel form is the f64 router's");
  const DType dt = cuda_dtype("moe_router_logits_forward", "x", x.dtype());
  const DType wt = cuda_dtype("moe_router_logits_forward", "w", w.dtype());
  const int64_t N = rows_of(x), H = x.dim(-1), E = w.dim(0);
  auto* l = static_cast<double*>(logits.raw());
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_DT_SWITCH(wt, W,
                                  MTNLG_LAUNCH(k::grid_for(N * E, k::kThreads), k::kThreads, 0, stream(),
                                               k::router_gemm64_kernel<T, W>)(
                                      l, static_cast<const T*>(x.raw()), static_cast<const W*>(w.raw()), N, H, E)));
  MTNLG_CUDA_LAUNCH_CHECK("router_gemm64_kernel");
}

void moe_router_logits_backward(Tensor& dx, Tensor& dw, const Tensor& dlogits, const Tensor& x, const Tensor& w) {
  if (dlogits.dtype() != DType::f64) fail("moe_router_logits_backward on CUDA: the kernel form is the f64 router's");
  const DType dt = cuda_dtype("moe_router_logits_backward", "x", x.dtype());
  const DType wt = cuda_dtype("moe_router_logits_backward", "w", w.dtype());
  need_f32("moe_router_logits_backward", "dw (the fp32 gradient)", &dw);
  if (dx.dtype() != dt) fail("moe_router_logits_backward on CUDA: dx and x in different dtypes");
  const int64_t N = rows_of(x), H = x.dim(-1), E = w.dim(0);
  const auto* dl = static_cast<const double*>(dlogits.raw());
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_DT_SWITCH(wt, W,
                                  MTNLG_LAUNCH(k::grid_for(N * H, k::kThreads), k::kThreads, 0, stream(),
                                               k::router_gemm64_dx_kernel<T, W>)(
                                      static_cast<T*>(dx.raw()), dl, static_cast<const W*>(w.raw()), N, H, E)));
  MTNLG_CUDA_LAUNCH_CHECK("router_gemm64_dx_kernel");
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(k::grid_for(E * H, k::kThreads), k::kThreads, 0, stream(),
                               k::router_gemm64_dw_kernel<T>)(f(dw), dl, static_cast<const T*>(x.raw()), N, H, E));
  MTNLG_CUDA_LAUNCH_CHECK("router_gemm64_dw_kernel");
}

void moe_aux_scores_forward(Tensor& scores, Tensor& counts, const Tensor& logits, ops::RouterScore score, int64_t topk,
                            int64_t groups) {
  const DType dt = router_dtype("moe_aux_scores_forward", {&scores, &counts, &logits});
  if (topk > k::kMaxTopk) throw_runtime("moe_aux_scores_forward on CUDA: topk {} above {}", topk, k::kMaxTopk);
  const int64_t N = rows_of(logits), E = logits.dim(-1);
  if (N == 0) return;
  MTNLG_ROUTER_SWITCH(dt, R,
                      MTNLG_LAUNCH(k::row_blocks(N), k::kThreads, 0, stream(), k::aux_scores_kernel<R>)(
                          rt<R>(scores), rt<R>(counts), rt<R>(logits), N, static_cast<int>(E),
                          score == ops::RouterScore::sigmoid, static_cast<int>(topk), N / groups));
  MTNLG_CUDA_LAUNCH_CHECK("aux_scores_kernel");
}

void moe_aux_scores_backward(Tensor& dlogits, const Tensor& dscores, const Tensor& logits, ops::RouterScore score) {
  const DType dt = router_dtype("moe_aux_scores_backward", {&dlogits, &dscores, &logits});
  const int64_t N = rows_of(logits), E = logits.dim(-1);
  if (N == 0) return;
  MTNLG_ROUTER_SWITCH(
      dt, R,
      MTNLG_LAUNCH(k::row_blocks(N), k::kThreads, 0, stream(), k::aux_scores_backward_kernel<R>)(
          rt<R>(dlogits), rt<R>(dscores), rt<R>(logits), N, static_cast<int>(E), score == ops::RouterScore::sigmoid));
  MTNLG_CUDA_LAUNCH_CHECK("aux_scores_backward_kernel");
}

// Synchronises without `acc`: the loss comes back to the host (the group sums, then the
// CPU's formula); with it, one thread adds the same sum there.
double moe_aux_loss_forward(const Tensor& scores, const Tensor& counts, int64_t groups, double total_tokens,
                            int64_t topk, double coeff, Tensor* acc) {
  const DType dt = router_dtype("moe_aux_loss_forward", {&scores, &counts});
  const int64_t N = rows_of(scores), E = scores.dim(-1);
  if (N == 0) return 0.0;
  Tensor P = Tensor::empty({groups, E}, DType::f64, Device::cuda);
  auto* Pd = static_cast<double*>(P.raw());
  MTNLG_ROUTER_SWITCH(dt, R,
                      MTNLG_LAUNCH(k::row_blocks(groups * E), k::kThreads, 0, stream(), k::group_colsum_kernel<R>)(
                          Pd, rt<R>(scores), groups, N / groups, static_cast<int>(E)));
  MTNLG_CUDA_LAUNCH_CHECK("group_colsum_kernel");
  if (acc) {
    const double fct = coeff * static_cast<double>(E) / (static_cast<double>(topk) * total_tokens * total_tokens) /
                       static_cast<double>(groups);
    auto* a = static_cast<double*>(acc->raw());
    MTNLG_ROUTER_SWITCH(
        dt, R, MTNLG_LAUNCH(1, 32, 0, stream(), k::aux_loss_acc_kernel<R>)(a, Pd, rt<R>(counts), groups * E, fct));
    MTNLG_CUDA_LAUNCH_CHECK("aux_loss_acc_kernel");
    return 0.0;
  }
  const Tensor Ph = P.to(Device::cpu), ch = counts.to(Device::cpu);
  double loss = 0;
  for (int64_t i = 0; i < groups * E; ++i)
    loss += Ph.data<double>()[i] * (dt == DType::f64 ? ch.data<double>()[i] : static_cast<double>(ch.data<float>()[i]));
  return loss * coeff * static_cast<double>(E) / (static_cast<double>(topk) * total_tokens * total_tokens) /
         static_cast<double>(groups);
}

void moe_aux_loss_backward(Tensor& dscores, const Tensor& counts, int64_t groups, double total_tokens, int64_t topk,
                           double coeff, double dloss, const Tensor* dloss_scale) {
  const DType dt = router_dtype("moe_aux_loss_backward", {&dscores, &counts});
  const int64_t N = rows_of(dscores), E = dscores.dim(-1);
  if (N == 0) return;
  const double fct = dloss * coeff * static_cast<double>(E) /
                     (static_cast<double>(topk) * total_tokens * total_tokens) / static_cast<double>(groups);
  const double* scale = dloss_scale ? static_cast<const double*>(dloss_scale->raw()) : nullptr;
  MTNLG_ROUTER_SWITCH(
      dt, R,
      MTNLG_LAUNCH(k::grid_for(N * E, k::kThreads), k::kThreads, 0, stream(), k::aux_loss_backward_kernel<R>)(
          rt<R>(dscores), rt<R>(counts), N, static_cast<int>(E), N / groups, fct, scale));
  MTNLG_CUDA_LAUNCH_CHECK("aux_loss_backward_kernel");
}

namespace {
Tensor row_lse(const Tensor& logits, int64_t N, int64_t E) {
  Tensor lse = Tensor::empty({N}, DType::f64, Device::cuda);
  auto* l = static_cast<double*>(lse.raw());
  MTNLG_ROUTER_SWITCH(logits.dtype(), R,
                      MTNLG_LAUNCH(k::row_blocks(N), k::kThreads, 0, stream(), k::row_lse_kernel<R>)(
                          l, rt<R>(logits), N, static_cast<int>(E)));
  MTNLG_CUDA_LAUNCH_CHECK("row_lse_kernel");
  return lse;
}
}  // namespace

// Synchronises without `acc`: the rows' log-sum-exps come back and are summed in row order;
// with it, one thread adds the same sum there.
double moe_z_loss_forward(const Tensor& logits, double coeff, Tensor* acc) {
  (void)router_dtype("moe_z_loss_forward", {&logits});
  const int64_t N = rows_of(logits), E = logits.dim(-1);
  if (N == 0) return 0.0;
  if (acc) {
    const Tensor l = row_lse(logits, N, E);
    MTNLG_LAUNCH(1, 32, 0, stream(), k::z_loss_acc_kernel)
    (static_cast<double*>(acc->raw()), static_cast<const double*>(l.raw()), N, coeff / static_cast<double>(N));
    MTNLG_CUDA_LAUNCH_CHECK("z_loss_acc_kernel");
    return 0.0;
  }
  const Tensor lse = row_lse(logits, N, E).to(Device::cpu);
  double s = 0;
  for (int64_t n = 0; n < N; ++n) s += lse.data<double>()[n] * lse.data<double>()[n];
  return coeff * s / static_cast<double>(N);
}

void moe_z_loss_backward(Tensor& dlogits, const Tensor& logits, double coeff, double dloss, const Tensor* dloss_scale) {
  const DType dt = router_dtype("moe_z_loss_backward", {&dlogits, &logits});
  const int64_t N = rows_of(logits), E = logits.dim(-1);
  if (N == 0) return;
  const Tensor lse = row_lse(logits, N, E);
  const auto* l = static_cast<const double*>(lse.raw());
  const double* scale = dloss_scale ? static_cast<const double*>(dloss_scale->raw()) : nullptr;
  MTNLG_ROUTER_SWITCH(
      dt, R,
      MTNLG_LAUNCH(k::grid_for(N * E, k::kThreads), k::kThreads, 0, stream(), k::z_loss_backward_kernel<R>)(
          rt<R>(dlogits), rt<R>(logits), l, N, static_cast<int>(E), dloss * coeff * 2 / static_cast<double>(N), scale));
  MTNLG_CUDA_LAUNCH_CHECK("z_loss_backward_kernel");
}

// The padded plan on the device: ranks, rows, kept counts; no synchronisation.
ops::MoeDispatch moe_padded_dispatch_plan(Tensor& kept, const Tensor& probs, const Tensor& idx, int64_t num_experts,
                                          int64_t capacity, ops::DropPolicy policy) {
  router_f32("moe_padded_dispatch_plan", {&probs});
  if (capacity > INT32_MAX / std::max<int64_t>(num_experts, 1))
    fail("moe_padded_dispatch_plan: experts x capacity exceed 32-bit row indices");
  ops::MoeDispatch d;
  d.num_tokens = rows_of(idx);
  d.topk = idx.dim(-1);
  d.num_experts = num_experts;
  d.counts.assign(static_cast<size_t>(num_experts), capacity);
  d.rows = num_experts * capacity;
  const int64_t slots = idx.numel();
  d.row_src = Tensor::empty({d.rows}, DType::i32, Device::cuda);
  d.row_slot = Tensor::empty({d.rows}, DType::i32, Device::cuda);
  d.slot_row = Tensor::empty({slots}, DType::i32, Device::cuda);
  auto i32 = [](Tensor& t) { return static_cast<int32_t*>(t.raw()); };
  for (Tensor* t : {&d.row_src, &d.row_slot}) {
    MTNLG_LAUNCH(k::grid_for(d.rows, k::kThreads), k::kThreads, 0, stream(), k::fill_i32_kernel)(i32(*t), d.rows, -1);
    MTNLG_CUDA_LAUNCH_CHECK("fill_i32_kernel");
  }
  const auto cap = static_cast<int32_t>(capacity);
  MTNLG_LAUNCH(k::row_blocks(num_experts), k::kThreads, 0, stream(), k::kept_kernel)
  (i32(kept), ip(idx), slots, static_cast<int>(num_experts), cap);
  MTNLG_CUDA_LAUNCH_CHECK("kept_kernel");
  if (slots == 0) return d;
  Tensor rank = Tensor::empty({slots}, DType::i32, Device::cuda);
  MTNLG_LAUNCH(k::row_blocks(slots), k::kThreads, 0, stream(), k::capacity_rank_kernel)
  (i32(rank), f(probs), ip(idx), slots, policy == ops::DropPolicy::probs);
  MTNLG_CUDA_LAUNCH_CHECK("capacity_rank_kernel");
  MTNLG_LAUNCH(k::row_blocks(slots), k::kThreads, 0, stream(), k::padded_rows_kernel)
  (i32(d.slot_row), i32(d.row_src), i32(d.row_slot), ip(rank), ip(idx), slots, static_cast<int>(d.topk), cap);
  MTNLG_CUDA_LAUNCH_CHECK("padded_rows_kernel");
  return d;
}

void moe_record_routing(Tensor& record, const Tensor& kept, int64_t slots) {
  MTNLG_LAUNCH(1, 32, 0, stream(), k::record_routing_kernel)
  (static_cast<double*>(record.raw()), ip(kept), static_cast<int>(kept.numel()), slots);
  MTNLG_CUDA_LAUNCH_CHECK("record_routing_kernel");
}

void moe_permute(Tensor& out, const Tensor& x, const ops::MoeDispatch& d) {
  const DType dt = cuda_dtype("moe_permute", "x", x.dtype());
  const int64_t H = x.dim(-1);
  if (d.rows * H == 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(k::grid_for(d.rows * H, k::kThreads), k::kThreads, 0, stream(), k::permute_kernel<T>)(
                      static_cast<T*>(out.raw()), static_cast<const T*>(x.raw()), ip(d.row_src), d.rows, H));
  MTNLG_CUDA_LAUNCH_CHECK("permute_kernel");
}

void moe_unpermute(Tensor& y, const Tensor& rows, const ops::MoeDispatch& d) {
  const DType dt = cuda_dtype("moe_unpermute", "rows", rows.dtype());
  const int64_t H = y.dim(-1);
  if (d.num_tokens * H == 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(k::grid_for(d.num_tokens * H, k::kThreads), k::kThreads, 0, stream(),
                               k::unpermute_kernel<T>)(static_cast<T*>(y.raw()), static_cast<const T*>(rows.raw()),
                                                       ip(d.slot_row), d.num_tokens, static_cast<int>(d.topk), H));
  MTNLG_CUDA_LAUNCH_CHECK("unpermute_kernel");
}

void moe_weight_rows_forward(Tensor& out, const Tensor& act, const Tensor& probs, const ops::MoeDispatch& d) {
  const DType dt = cuda_dtype("moe_weight_rows_forward", "act", act.dtype());
  router_f32("moe_weight_rows_forward", {&probs});
  const int64_t F = act.dim(-1);
  if (d.rows * F == 0) return;
  MTNLG_DT_SWITCH(
      dt, T,
      MTNLG_LAUNCH(k::grid_for(d.rows * F, k::kThreads), k::kThreads, 0, stream(), k::weight_rows_kernel<T>)(
          static_cast<T*>(out.raw()), static_cast<const T*>(act.raw()), f(probs), ip(d.row_slot), d.rows, F));
  MTNLG_CUDA_LAUNCH_CHECK("weight_rows_kernel");
}

void moe_weight_rows_backward(Tensor& dact, Tensor& dprobs, const Tensor& dout, const Tensor& act, const Tensor& probs,
                              const ops::MoeDispatch& d) {
  const DType dt = cuda_dtype("moe_weight_rows_backward", "act", act.dtype());
  router_f32("moe_weight_rows_backward", {&probs, &dprobs});
  const int64_t F = act.dim(-1), slots = d.num_tokens * d.topk;
  cuda::moe_weight_rows_forward(dact, dout, probs, d);  // dact = dout * weight: the forward's kernel
  if (slots == 0) return;
  MTNLG_DT_SWITCH(
      dt, T,
      MTNLG_LAUNCH(k::row_blocks(slots * 32), k::kThreads, 0, stream(), k::weight_rows_dprobs_kernel<T>)(
          f(dprobs), static_cast<const T*>(dout.raw()), static_cast<const T*>(act.raw()), ip(d.slot_row), slots, F));
  MTNLG_CUDA_LAUNCH_CHECK("weight_rows_dprobs_kernel");
}

namespace {
// Row-major [rows, width] block of expert rows starting at row `off`.
const char* at_row(const Tensor& t, int64_t off, int64_t width) {
  return static_cast<const char*>(t.raw()) + off * width * dtype_size(t.dtype());
}
char* at_row(Tensor& t, int64_t off, int64_t width) {
  return static_cast<char*>(t.raw()) + off * width * dtype_size(t.dtype());
}
}  // namespace

// out_e [n, OC] = inp_e [n, C] @ w_e^T: column-major out^T [OC x n] = op_T(w_e [C x OC]) @ inp^T [C x n].
void grouped_matmul_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor* bias,
                            const std::vector<int64_t>& counts) {
  const DType dt = cuda_dtype("grouped_matmul_forward", "inp", inp.dtype());
  const int64_t E = w.dim(0), OC = w.dim(1), C = w.dim(2);
  std::vector<k::GroupedProblem> ps;
  int64_t off = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[static_cast<size_t>(e)];
    if (n > 0)
      ps.push_back(
          {true, false, OC, n, C, at_row(w, e * OC, C), C, at_row(inp, off, C), C, at_row(out, off, OC), OC, 0.0f});
    off += n;
  }
  if (C == 0) fail("grouped_matmul_forward: an empty inner dimension");
  k::grouped_gemm(ps, dt);
  if (bias && bias->defined()) {
    off = 0;
    for (int64_t e = 0; e < E; ++e) {  // the bias after the GEMM (bf16/f16: a second rounding)
      const int64_t n = counts[static_cast<size_t>(e)];
      if (n > 0) k::bias_add_forward(at_row(out, off, OC), at_row(*bias, e, OC), dt, n, OC);
      off += n;
    }
  }
}

// dinp_e [n, C] = dout_e [n, OC] @ w_e: column-major dinp^T [C x n] = w_e [C x OC] @ dout^T [OC x n].
// dw_e [OC, C] += dout_e^T @ inp_e: column-major dw^T [C x OC] = inp^T [C x n] @ op_T(dout^T [OC x n]):
// one grouped call in f32 (the library's grouped GEMM has no fp32 output for 16-bit
// inputs, so bf16/f16 take one cuBLASLt GEMM per expert into the fp32 gradient).
void grouped_matmul_backward(Tensor* dinp, Tensor* dw, Tensor* dbias, const Tensor& dout, const Tensor& inp,
                             const Tensor& w, const std::vector<int64_t>& counts) {
  const DType dt = cuda_dtype("grouped_matmul_backward", "inp", inp.dtype());
  need_f32("grouped_matmul_backward", "dw", dw);
  need_f32("grouped_matmul_backward", "dbias", dbias);
  const int64_t E = w.dim(0), OC = w.dim(1), C = w.dim(2);
  const bool want_dinp = dinp && dinp->defined(), want_dw = dw && dw->defined();
  std::vector<k::GroupedProblem> pin, pw;
  int64_t off = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[static_cast<size_t>(e)];
    if (n > 0 && want_dinp)
      pin.push_back(
          {false, false, C, n, OC, at_row(w, e * OC, C), C, at_row(dout, off, OC), OC, at_row(*dinp, off, C), C, 0.0f});
    if (n > 0 && want_dw && dt == DType::f32)
      pw.push_back(
          {false, true, C, OC, n, at_row(inp, off, C), C, at_row(dout, off, OC), OC, at_row(*dw, e * OC, C), C, 1.0f});
    if (n > 0 && want_dw && dt != DType::f32)
      k::gemm_dw(reinterpret_cast<float*>(at_row(*dw, e * OC, C)), at_row(dout, off, OC), at_row(inp, off, C), dt, n, C,
                 OC);
    if (n > 0 && dbias && dbias->defined())
      k::bias_add_backward(reinterpret_cast<float*>(at_row(*dbias, e, OC)), at_row(dout, off, OC), dt, n, OC);
    off += n;
  }
  k::grouped_gemm(pin, dt);
  k::grouped_gemm(pw, dt);
}

void moe_expert_bias_update(Tensor& bias, const Tensor& counts, double rate) {
  router_f32("moe_expert_bias_update", {&bias, &counts});
  const int64_t E = bias.numel();
  if (E == 0) return;
  MTNLG_LAUNCH(1, 32, 0, stream(), k::expert_bias_kernel)(f(bias), f(counts), static_cast<int>(E), rate);
  MTNLG_CUDA_LAUNCH_CHECK("expert_bias_kernel");
}

void sigmoid_gate_forward(Tensor& out, const Tensor& x, const Tensor& gate) {
  const DType dt = cuda_dtype("sigmoid_gate_forward", "x", x.dtype());
  const int64_t C = x.dim(-1), N = rows_of(x);
  if (N * C == 0) return;
  MTNLG_DT_SWITCH(
      dt, T,
      MTNLG_LAUNCH(k::grid_for(N * C, k::kThreads), k::kThreads, 0, stream(), k::sigmoid_gate_kernel<T>)(
          static_cast<T*>(out.raw()), static_cast<const T*>(x.raw()), static_cast<const T*>(gate.raw()), N, C));
  MTNLG_CUDA_LAUNCH_CHECK("sigmoid_gate_kernel");
}

void sigmoid_gate_backward(Tensor& dx, Tensor& dgate, const Tensor& dout, const Tensor& x, const Tensor& gate) {
  const DType dt = cuda_dtype("sigmoid_gate_backward", "x", x.dtype());
  const int64_t C = x.dim(-1), N = rows_of(x);
  if (N == 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(k::row_blocks(N * 32), k::kThreads, 0, stream(), k::sigmoid_gate_backward_kernel<T>)(
                      static_cast<T*>(dx.raw()), static_cast<T*>(dgate.raw()), static_cast<const T*>(dout.raw()),
                      static_cast<const T*>(x.raw()), static_cast<const T*>(gate.raw()), N, C));
  MTNLG_CUDA_LAUNCH_CHECK("sigmoid_gate_backward_kernel");
}

void moe_jitter(Tensor& out, const Tensor& x, double eps, uint64_t key, uint64_t base_index, const DeviceKey& dkey) {
  const DType dt = cuda_dtype("moe_jitter", "x", x.dtype());
  const int64_t n = x.numel();
  if (n == 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(k::grid_for(n, k::kThreads), k::kThreads, 0, stream(), k::jitter_kernel<T>)(
                      static_cast<T*>(out.raw()), static_cast<const T*>(x.raw()), n, static_cast<float>(eps), key,
                      base_index, dkey));
  MTNLG_CUDA_LAUNCH_CHECK("jitter_kernel");
}

}  // namespace mtnlg::cuda
