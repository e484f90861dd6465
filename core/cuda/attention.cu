// Causal self-attention on CUDA in its two forms (model.attention_backend). The flash
// form (ops::attention_forward_lse / attention_backward_lse: the [T,T] scores never
// reach HBM, the per-row log-sum-exp lse[b,h,i] = log sum_j exp(s_ij), s = q.k / sqrt(D),
// j <= i, is saved instead of the probabilities) is cuDNN's fused attention
// (core/cuda/cudnn_attention.cu). This file holds the unfused form (batched cuBLASLt
// GEMMs around a softmax kernel, probabilities kept) and the KV-cache forward of
// generation. CPU reference: core/ops/attention.cpp.
//
// Gradient contract: dqkv is WRITTEN (every q, k and v element of every position).
// Grouped-query attention (G query groups, H/G query heads each; qkv rows hold per group
// [q_0 .. q_{H/G-1} | k | v]): query head h = g*(H/G) + qi uses its group's k and v; a
// group's dK and dV sum over its query heads (GEMMs with beta 1 after the first).
// Dropout on the attention probabilities uses the CPU's mask index
// ((sample_offset+b)*heads_total + head_offset+h)*T*T + i*T + j, so masks match the
// CPU and any tensor-parallel split of heads.
#include <climits>

#include "core/cuda/common.cuh"
#include "core/cuda/cudnn_attention.hpp"
#include "core/rng.hpp"

namespace mtnlg::cuda::k {

namespace {

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kPer = static_cast<int>(kAttnMaxHeadDim / 32);  // head columns per lane (KV-cache forward)

struct Geometry {
  int64_t B, T, H, D;
  float scale;
  int64_t G = 0;  // query groups (the unfused form; H/G query heads each)
};
struct Drop {
  float p, dscale;
  uint64_t key;
  int64_t sample_offset, head_offset, heads_total;
  bool on;
  DeviceKey dkey;  // key and sample_offset from device memory when set
};

__device__ __forceinline__ bool kept(const Drop& dr, const Geometry& g, int64_t b, int64_t h, int64_t i, int64_t j) {
  const uint64_t base =
      static_cast<uint64_t>(((dr.sample_offset + b) * dr.heads_total + dr.head_offset + h) * g.T * g.T);
  return philox_uniform(dr.key, 0, base + static_cast<uint64_t>(i * g.T + j)) >= dr.p;
}

// The key and sample offset taken from device memory where dkey says so: once per thread,
// at a kernel's start.
__device__ __forceinline__ Drop resolved(Drop dr) {
  if (!dr.on || !dr.dkey.dev) return dr;
  dr.key = dr.dkey.key(dr.key);
  dr.sample_offset = static_cast<int64_t>(dr.dkey.offset(static_cast<uint64_t>(dr.sample_offset)));
  dr.dkey.dev = nullptr;
  return dr;
}

Drop make_drop(const ops::AttentionDropout& d, int64_t H) {
  Drop r{};
  r.on = d.p > 0;
  r.p = static_cast<float>(d.p);
  r.dscale = r.on ? static_cast<float>(1.0 / (1.0 - d.p)) : 1.0f;
  r.key = d.key;
  r.sample_offset = d.sample_offset;
  r.head_offset = d.head_offset;
  r.heads_total = d.heads_total ? d.heads_total : H;
  r.dkey = d.dkey;
  return r;
}

}  // namespace

}  // namespace mtnlg::cuda::k

// ---- Unfused attention (model.attention_backend: unfused): Megatron's form on tensor
// cores. Per sample b and query index qi within a group, with the G groups as a strided
// batch read straight from the packed qkv rows (group g's query qi, k, v start at
// g*(Q+2)*D + qi*D, + Q*D, + (Q+1)*D, (Q+2)*D apart for Q = H/G query heads per group;
// row stride G(Q+2)D; with G == H one batch of H heads, q, k, v 3D apart):
//   forward   S = scale * Q K^T                    batched GEMM, [H, T, T] into probs
//             P = softmax(causal mask(S)) in place  one warp per row, fp32 arithmetic
//             P' = dropout(P) (p > 0 only)          into a scratch [B, H, T, T]
//             out = P' V                            batched GEMM, into out's head columns
//   backward  dV = P'^T dO, dP' = dO V^T            P' recomputed from P and the mask
//             dS = scale * P (dP - rowsum(P dP))    in place over dP, zero above the diagonal
//             dQ = dS K, dK = dS^T Q                 into dqkv's q and k columns
// The scores and probabilities are stored in the activation dtype (as Megatron's fused
// scale-mask-softmax does); the GEMMs accumulate in fp32. dqkv is WRITTEN; dK and dV of a
// group add its query heads' products in qi order (beta 1 after qi 0, each add rounded
// to the activation dtype). The dropout
// mask is the CPU's (same index, same draws), so the unfused form on CUDA and both forms
// on the CPU give the same model.

namespace mtnlg::cuda::k {

namespace {

// Row r of the [rows = B*H*T, T] score matrix: sample b, head h, query i.
struct RowIndex {
  int64_t b, h, i;
};
__device__ __forceinline__ RowIndex row_index(int64_t r, int64_t Tn, int64_t H) {
  const int64_t bh = r / Tn;
  return RowIndex{bh / H, bh % H, r % Tn};
}

// probs[r, :] = softmax over j <= i of the scaled scores it holds, 0 for j > i; with
// dropout, dropped[r, j] = kept ? probs * dscale : 0. One warp per row.
template <typename V>
__global__ void __launch_bounds__(kThreads)
    causal_softmax_kernel(V* probs, V* dropped, int64_t rows, Geometry g, Drop drop) {
  const Drop dr = resolved(drop);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t(kWarps) + warp;
  if (r >= rows) return;
  const RowIndex x = row_index(r, g.T, g.H);
  V* row = probs + r * g.T;
  float m = -INFINITY;
  for (int64_t j = lane; j <= x.i; j += 32) m = fmaxf(m, to_f(row[j]));
  m = warp_max(m);
  float sum = 0.0f;
  for (int64_t j = lane; j <= x.i; j += 32) sum += expf(to_f(row[j]) - m);
  const float inv = 1.0f / warp_sum(sum);
  for (int64_t j = lane; j < g.T; j += 32) {
    const float p = j <= x.i ? expf(to_f(row[j]) - m) * inv : 0.0f;
    row[j] = from_f<V>(p);
    if (dropped) dropped[r * g.T + j] = from_f<V>(j <= x.i && kept(dr, g, x.b, x.h, x.i, j) ? p * dr.dscale : 0.0f);
  }
}

// dropped = dropout(probs) with the forward's mask (the backward's P').
template <typename V>
__global__ void attention_dropout_kernel(V* dropped, const V* probs, int64_t rows, Geometry g, Drop drop) {
  const Drop dr = resolved(drop);
  const int64_t n = rows * g.T;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % g.T;
    const RowIndex x = row_index(e / g.T, g.T, g.H);
    dropped[e] = from_f<V>(j <= x.i && kept(dr, g, x.b, x.h, x.i, j) ? to_f(probs[e]) * dr.dscale : 0.0f);
  }
}

// dp[r, :] (holding dO V^T) becomes dS = scale * P (dP - sum_j P dP), dP the gradient
// through the dropout mask; zeros above the diagonal. One warp per row.
template <typename V>
__global__ void __launch_bounds__(kThreads)
    causal_softmax_backward_kernel(V* dp, const V* probs, int64_t rows, Geometry g, Drop drop) {
  const Drop dr = resolved(drop);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t(kWarps) + warp;
  if (r >= rows) return;
  const RowIndex x = row_index(r, g.T, g.H);
  V* row = dp + r * g.T;
  const V* P = probs + r * g.T;
  auto grad = [&](int64_t j) {
    const float d = to_f(row[j]);
    return dr.on ? (kept(dr, g, x.b, x.h, x.i, j) ? d * dr.dscale : 0.0f) : d;
  };
  float dot = 0.0f;
  for (int64_t j = lane; j <= x.i; j += 32) dot += to_f(P[j]) * grad(j);
  dot = warp_sum(dot);
  for (int64_t j = lane; j < g.T; j += 32) row[j] = from_f<V>(j <= x.i ? to_f(P[j]) * (grad(j) - dot) * g.scale : 0.0f);
}

Geometry unfused_geometry(int64_t B, int64_t T, int64_t H, int64_t G, int64_t D) {
  if (D < 1) fail("attention: empty head");
  return Geometry{B, T, H, D, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))), G};
}

unsigned row_blocks(int64_t rows) {
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (blocks > INT32_MAX) fail("attention: batch x heads x positions exceeds the softmax kernel's grid");
  return static_cast<unsigned>(blocks);
}

// Element offsets of sample b's pieces and the strides between the groups of one batched
// GEMM (query index qi of every group): qkv rows, out/dout rows, the [H, T, T] matrices.
struct UnfusedLayout {
  int64_t Q, row, ldo, TT;  // query heads per group, qkv row stride G(Q+2)D, out row stride HD, T*T
  int64_t gs(const Geometry& g) const { return (Q + 2) * g.D; }  // group to group in a qkv row
  int64_t q(const Geometry& g, int64_t b, int64_t qi) const { return b * g.T * row + qi * g.D; }
  int64_t k(const Geometry& g, int64_t b) const { return b * g.T * row + Q * g.D; }
  int64_t v(const Geometry& g, int64_t b) const { return b * g.T * row + (Q + 1) * g.D; }
  int64_t out(const Geometry& g, int64_t b, int64_t qi) const { return b * g.T * ldo + qi * g.D; }
  int64_t mat(const Geometry& g, int64_t b, int64_t qi) const { return b * g.H * TT + qi * TT; }
};
UnfusedLayout unfused_layout(const Geometry& g) {
  const int64_t Q = g.H / g.G;
  return {Q, g.G * (Q + 2) * g.D, g.H * g.D, g.T * g.T};
}

template <typename V>
void unfused_forward(V* out, V* probs, V* dropped, const V* qkv, const Geometry& g, const Drop& dr, DType dt) {
  const UnfusedLayout L = unfused_layout(g);
  const int64_t T = g.T, D = g.D, H = g.H, G = g.G, Q = L.Q, rows = g.B * H * T, gs = L.gs(g);
  for (int64_t b = 0; b < g.B; ++b)  // S^T (col-major [T_j, T_i]) = K_cm^T Q_cm
    for (int64_t qi = 0; qi < Q; ++qi)
      gemm_strided_batched(true, false, T, T, D, g.scale, qkv + L.k(g, b), L.row, gs, qkv + L.q(g, b, qi), L.row, gs,
                           probs + L.mat(g, b, qi), T, Q * L.TT, G, dt);
  MTNLG_LAUNCH(row_blocks(rows), kThreads, 0, stream(), causal_softmax_kernel<V>)
  (probs, dr.on ? dropped : nullptr, rows, g, dr);
  MTNLG_CUDA_LAUNCH_CHECK("causal_softmax_kernel");
  const V* pv = dr.on ? dropped : probs;
  for (int64_t b = 0; b < g.B; ++b)  // out_cm [D, T_i] = V_cm P'_cm
    for (int64_t qi = 0; qi < Q; ++qi)
      gemm_strided_batched(false, false, D, T, T, 1.0f, qkv + L.v(g, b), L.row, gs, pv + L.mat(g, b, qi), T, Q * L.TT,
                           out + L.out(g, b, qi), L.ldo, Q * D, G, dt);
}

template <typename V>
void unfused_backward(V* dqkv, const V* dout, const V* qkv, const V* probs, V* scratch, const Geometry& g,
                      const Drop& dr, DType dt) {
  const UnfusedLayout L = unfused_layout(g);
  const int64_t T = g.T, D = g.D, H = g.H, G = g.G, Q = L.Q, rows = g.B * H * T, gs = L.gs(g);
  const V* pv = probs;
  if (dr.on) {
    MTNLG_LAUNCH(grid_for(rows * T, 256), 256, 0, stream(), attention_dropout_kernel<V>)(scratch, probs, rows, g, dr);
    MTNLG_CUDA_LAUNCH_CHECK("attention_dropout_kernel");
    pv = scratch;
  }
  for (int64_t b = 0; b < g.B; ++b)  // dV_cm [D, T_j] = sum over qi of dO_cm P'_cm^T
    for (int64_t qi = 0; qi < Q; ++qi)
      gemm_strided_batched(false, true, D, T, T, 1.0f, dout + L.out(g, b, qi), L.ldo, Q * D, pv + L.mat(g, b, qi), T,
                           Q * L.TT, dqkv + L.v(g, b), L.row, gs, G, dt, qi ? 1.0f : 0.0f);
  for (int64_t b = 0; b < g.B; ++b)  // dP'_cm [T_j, T_i] = V_cm^T dO_cm (over P' once dV is done)
    for (int64_t qi = 0; qi < Q; ++qi)
      gemm_strided_batched(true, false, T, T, D, 1.0f, qkv + L.v(g, b), L.row, gs, dout + L.out(g, b, qi), L.ldo, Q * D,
                           scratch + L.mat(g, b, qi), T, Q * L.TT, G, dt);
  MTNLG_LAUNCH(row_blocks(rows), kThreads, 0, stream(), causal_softmax_backward_kernel<V>)(scratch, probs, rows, g, dr);
  MTNLG_CUDA_LAUNCH_CHECK("causal_softmax_backward_kernel");
  for (int64_t b = 0; b < g.B; ++b) {
    // dQ_cm [D, T_i] = K_cm dS_cm ; dK_cm [D, T_j] = sum over qi of Q_cm dS_cm^T
    for (int64_t qi = 0; qi < Q; ++qi)
      gemm_strided_batched(false, false, D, T, T, 1.0f, qkv + L.k(g, b), L.row, gs, scratch + L.mat(g, b, qi), T,
                           Q * L.TT, dqkv + L.q(g, b, qi), L.row, gs, G, dt);
    for (int64_t qi = 0; qi < Q; ++qi)
      gemm_strided_batched(false, true, D, T, T, 1.0f, qkv + L.q(g, b, qi), L.row, gs, scratch + L.mat(g, b, qi), T,
                           Q * L.TT, dqkv + L.k(g, b), L.row, gs, G, dt, qi ? 1.0f : 0.0f);
  }
}

}  // namespace

void attention_unfused_forward(void* out, void* probs, void* dropped, const void* qkv, DType dt, int64_t B, int64_t T,
                               int64_t H, int64_t G, int64_t D, const ops::AttentionDropout& drop) {
  if (B * T * H == 0) return;
  const Geometry g = unfused_geometry(B, T, H, G, D);
  const Drop dr = make_drop(drop, H);
  MTNLG_DT_SWITCH(dt, V,
                  unfused_forward<V>(static_cast<V*>(out), static_cast<V*>(probs), static_cast<V*>(dropped),
                                     static_cast<const V*>(qkv), g, dr, dt));
}

void attention_unfused_backward(void* dqkv, const void* dout, const void* qkv, const void* probs, void* scratch,
                                DType dt, int64_t B, int64_t T, int64_t H, int64_t G, int64_t D,
                                const ops::AttentionDropout& drop) {
  if (B * T * H == 0) return;
  const Geometry g = unfused_geometry(B, T, H, G, D);
  const Drop dr = make_drop(drop, H);
  MTNLG_DT_SWITCH(dt, V,
                  unfused_backward<V>(static_cast<V*>(dqkv), static_cast<const V*>(dout), static_cast<const V*>(qkv),
                                      static_cast<const V*>(probs), static_cast<V*>(scratch), g, dr, dt));
}

}  // namespace mtnlg::cuda::k

// ---- KV-cache attention (generation): forward only, no dropout. ---------------------
// 1) the new positions' keys and values are copied into the caches at [past, past + T);
// 2) a block per query row (b, i, h) walks cache positions [0, past + i], its warps taking
//    every kWarps-th key with an online softmax (running max and sum, output rescaled),
//    then the warps' partial results are merged. Reference: the CPU's
//    cpu::attention_cached_forward (core/ops/attention.cpp).

namespace mtnlg::cuda::k {

namespace {

// Group g's k and v of each new position into the caches [B, G, cap, D] (Q = H/G).
template <typename T>
__global__ void kv_append_kernel(T* k_cache, T* v_cache, const T* qkv, int64_t B, int64_t Tn, int64_t G, int64_t Q,
                                 int64_t D, int64_t cap, int64_t past) {
  const int64_t n = B * Tn * G * D;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, g = (e / D) % G, i = (e / (D * G)) % Tn, b = e / (D * G * Tn);
    const T* src = qkv + (b * Tn + i) * G * (Q + 2) * D + g * (Q + 2) * D + Q * D;
    const int64_t dst = ((b * G + g) * cap + past + i) * D + d;
    k_cache[dst] = src[d];
    v_cache[dst] = src[D + d];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attn_cached_kernel(T* out, const T* k_cache, const T* v_cache, const T* qkv, int64_t Tn, int64_t H, int64_t G,
                       int64_t D, int64_t cap, int64_t past, float scale) {
  __shared__ float q_sh[kAttnMaxHeadDim];
  __shared__ float m_sh[kWarps], l_sh[kWarps];
  __shared__ float o_sh[kWarps][kAttnMaxHeadDim];
  const int64_t r = blockIdx.x, h = r % H, i = (r / H) % Tn, b = r / (H * Tn);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t Q = H / G, g = h / Q;
  const T* q = qkv + (b * Tn + i) * G * (Q + 2) * D + g * (Q + 2) * D + (h % Q) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) q_sh[d] = to_f(q[d]);
  __syncthreads();
  const T* kc = k_cache + (b * G + g) * cap * D;
  const T* vc = v_cache + (b * G + g) * cap * D;
  const int64_t n = past + i + 1;
  float m = -INFINITY, l = 0.0f, acc[kPer];
  for (int c = 0; c < kPer; ++c) acc[c] = 0.0f;
  for (int64_t j = warp; j < n; j += kWarps) {
    float s = 0.0f;
    for (int64_t d = lane; d < D; d += 32) s += q_sh[d] * to_f(kc[j * D + d]);
    s = warp_sum(s) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), p = expf(s - m_new);  // m = -inf at the first key: corr = 0
    l = l * corr + p;
    for (int c = 0; c < kPer; ++c) {
      const int64_t d = lane + 32 * c;
      if (d < D) acc[c] = acc[c] * corr + p * to_f(vc[j * D + d]);
    }
    m = m_new;
  }
  if (lane == 0) {
    m_sh[warp] = m;
    l_sh[warp] = l;
  }
  for (int c = 0; c < kPer; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < D) o_sh[warp][d] = acc[c];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, m_sh[w]);
  float L = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (l_sh[w] > 0.0f) L += l_sh[w] * expf(m_sh[w] - M);
  T* o = out + (b * Tn + i) * H * D + h * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (l_sh[w] > 0.0f) v += o_sh[w][d] * expf(m_sh[w] - M);
    o[d] = from_f<T>(v / L);
  }
}

}  // namespace

void attention_cached_forward(void* out, void* k_cache, void* v_cache, const void* qkv, DType dt, int64_t B, int64_t T,
                              int64_t H, int64_t G, int64_t D, int64_t capacity, int64_t past) {
  if (B * T * H * D == 0) return;
  if (D > kAttnMaxHeadDim) fail("attention_cached_forward: head size above the kernel's limit");
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  MTNLG_DT_SWITCH(dt, V, {
    MTNLG_LAUNCH(grid_for(B * T * G * D, 256), 256, 0, stream(), kv_append_kernel<V>)
    (static_cast<V*>(k_cache), static_cast<V*>(v_cache), static_cast<const V*>(qkv), B, T, G, H / G, D, capacity, past);
    MTNLG_CUDA_LAUNCH_CHECK("kv_append_kernel");
    MTNLG_LAUNCH(static_cast<unsigned>(B * T * H), kThreads, 0, stream(), attn_cached_kernel<V>)
    (static_cast<V*>(out), static_cast<const V*>(k_cache), static_cast<const V*>(v_cache), static_cast<const V*>(qkv),
     T, H, G, D, capacity, past, scale);
    MTNLG_CUDA_LAUNCH_CHECK("attn_cached_kernel");
  });
}

}  // namespace mtnlg::cuda::k

// ---- Context parallelism's pieces (docs/specs/context-parallel.md): a block of query
// rows against a block of K/V, and the log-sum-exp merge of two partial results. The
// block is the unfused form over the block's rectangle: per sample b and query index qi
// within a group, the G groups as a strided batch, the queries rows [q0, q0 + nq) of the
// packed qkv ([B, Tq, W], W = G(Q+2)D), the keys and values rows [k0, k0 + nk) of the K/V
// buffer ([B, Tk, KW], KW = 2GD, group g's k at 2gD, v at 2gD + D):
//   forward   S = scale * Q K^T                        batched GEMM into a [B, H, nq, nk] scratch
//             P = softmax over the row's visible keys  one warp per row; lse in fp32
//             out = P' V                               P' = P with the dropout mask
//   backward  P = exp(S - lse) from the whole attention's lse, D_i = dout_i . out_i - dlse_i
//             dV += P'^T dO, dP' = dO V^T, dS = scale * P (m dP' - D), dQ += dS K, dK += dS^T Q
// Row i of the block sees its first keys(i) keys: all nk, or with a causal mask
// clamp(i + offset + 1, 0, nk). The scratch is in the activation dtype (as the unfused
// form's probabilities), the GEMMs accumulate in fp32, the lse and D in fp32; dQ, dK and
// dV accumulate (beta 1) into dqkv and dkv. Rows outside [q0, q0 + nq), and every row when
// the block has no key, get out 0 and lse -inf. The dropout mask is the one-rank op's at
// the rows' global positions (the CPU's block_mask). CPU reference: core/ops/attention.cpp.

namespace mtnlg::cuda::k {

namespace {

struct BlockGeometry {
  int64_t B, Tq, Tk, H, G, D, q0, nq, k0, nk;
  bool causal;
  int64_t offset;
  float scale;
  int64_t seq_len;  // dropout: the whole sequence's length and where the rows sit in it
  ops::SeqRows q_rows, kv_rows;
  __device__ __forceinline__ int64_t keys(int64_t i) const {
    if (!causal) return nk;
    const int64_t n = i + offset + 1;
    return n < 0 ? 0 : n > nk ? nk : n;
  }
};

// The dropout factor of (b, h, block query i, block key j): 0 or dscale; 1 without dropout.
__device__ __forceinline__ float block_factor(const Drop& dr, const BlockGeometry& g, int64_t b, int64_t h, int64_t i,
                                              int64_t j) {
  if (!dr.on) return 1.0f;
  const auto T = static_cast<uint64_t>(g.seq_len);
  const uint64_t base = static_cast<uint64_t>((dr.sample_offset + b) * dr.heads_total + dr.head_offset + h) * T * T;
  const auto e = static_cast<uint64_t>(g.q_rows.at(g.q0 + i)) * T + static_cast<uint64_t>(g.kv_rows.at(g.k0 + j));
  return philox_uniform(dr.key, 0, base + e) >= dr.p ? dr.dscale : 0.0f;
}

// Rows the block does not compute: out 0, lse -inf.
template <typename V>
__global__ void block_blank_kernel(V* out, float* lse, BlockGeometry g) {
  auto blank = [&](int64_t t) { return g.nk == 0 || t < g.q0 || t >= g.q0 + g.nq; };
  const int64_t HD = g.H * g.D, n_out = g.B * g.Tq * HD, n_lse = g.B * g.H * g.Tq;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n_out; e += step)
    if (blank((e / HD) % g.Tq)) out[e] = from_f<V>(0.0f);
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n_lse; e += step)
    if (blank(e % g.Tq)) lse[e] = -INFINITY;
}

// probs[r, :] (holding the scaled scores of row r = (b, h, i)) becomes the softmax over
// the row's visible keys, 0 past them; lse of the row's position in fp32 (-inf without
// keys); with dropout, dropped = probs times the mask's factor. One warp per row.
template <typename V>
__global__ void __launch_bounds__(kThreads)
    block_softmax_kernel(V* probs, V* dropped, float* lse, BlockGeometry g, Drop drop) {
  const Drop dr = resolved(drop);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t(kWarps) + warp;
  if (r >= g.B * g.H * g.nq) return;
  const int64_t i = r % g.nq, bh = r / g.nq, b = bh / g.H, h = bh % g.H, n = g.keys(i);
  V* row = probs + r * g.nk;
  float m = -INFINITY;
  for (int64_t j = lane; j < n; j += 32) m = fmaxf(m, to_f(row[j]));
  m = warp_max(m);
  float sum = 0.0f;
  for (int64_t j = lane; j < n; j += 32) sum += expf(to_f(row[j]) - m);
  sum = warp_sum(sum);
  const float inv = n > 0 ? 1.0f / sum : 0.0f;
  if (lane == 0) lse[bh * g.Tq + g.q0 + i] = n > 0 ? m + logf(sum) : -INFINITY;
  for (int64_t j = lane; j < g.nk; j += 32) {
    const float p = j < n ? expf(to_f(row[j]) - m) * inv : 0.0f;
    row[j] = from_f<V>(p);
    if (dropped) dropped[r * g.nk + j] = from_f<V>(j < n ? p * block_factor(dr, g, b, h, i, j) : 0.0f);
  }
}

// The backward's probabilities from the whole attention's lse: probs[r, :] (holding the
// scaled scores) becomes exp(s - lse) over the visible keys, 0 past them (and for a row
// whose lse is -inf); dropped = probs times the mask's factor; delta[r] = dout . out - dlse.
template <typename V>
__global__ void __launch_bounds__(kThreads)
    block_probs_kernel(V* probs, V* dropped, float* delta, const float* lse, const V* dout, const V* out,
                       const float* dlse, BlockGeometry g, Drop drop) {
  const Drop dr = resolved(drop);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t(kWarps) + warp;
  if (r >= g.B * g.H * g.nq) return;
  const int64_t i = r % g.nq, bh = r / g.nq, b = bh / g.H, h = bh % g.H, li = bh * g.Tq + g.q0 + i;
  const float l = lse[li];
  const int64_t n = l == -INFINITY ? 0 : g.keys(i);
  V* row = probs + r * g.nk;
  for (int64_t j = lane; j < g.nk; j += 32) {
    const float p = j < n ? expf(to_f(row[j]) - l) : 0.0f;
    row[j] = from_f<V>(p);
    if (dropped) dropped[r * g.nk + j] = from_f<V>(j < n ? p * block_factor(dr, g, b, h, i, j) : 0.0f);
  }
  const int64_t o = (b * g.Tq + g.q0 + i) * g.H * g.D + h * g.D;
  float dot = 0.0f;
  for (int64_t d = lane; d < g.D; d += 32) dot += to_f(dout[o + d]) * to_f(out[o + d]);
  dot = warp_sum(dot);
  if (lane == 0) delta[r] = dot - (dlse ? dlse[li] : 0.0f);
}

// dp[r, :] (holding dO V^T) becomes dS = scale * P (m dP - delta), 0 past the visible keys.
template <typename V>
__global__ void __launch_bounds__(kThreads)
    block_softmax_backward_kernel(V* dp, const V* probs, const float* delta, BlockGeometry g, Drop drop) {
  const Drop dr = resolved(drop);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x * int64_t(kWarps) + warp;
  if (r >= g.B * g.H * g.nq) return;
  const int64_t i = r % g.nq, bh = r / g.nq, b = bh / g.H, h = bh % g.H;
  V* row = dp + r * g.nk;
  const V* P = probs + r * g.nk;
  const float dl = delta[r];
  for (int64_t j = lane; j < g.nk; j += 32) {
    const float p = to_f(P[j]);  // 0 past the visible keys
    row[j] = from_f<V>(p == 0.0f ? 0.0f : p * (to_f(row[j]) * block_factor(dr, g, b, h, i, j) - dl) * g.scale);
  }
}

unsigned block_row_blocks(const BlockGeometry& g) { return row_blocks(g.B * g.H * g.nq); }

// Where sample b's pieces of a block start and the strides of one batched GEMM (the G groups).
struct BlockLayout {
  int64_t Q, W, KW, HD, M;  // query heads per group, qkv row, K/V row, out row, nq * nk
  int64_t q(const BlockGeometry& g, int64_t b, int64_t qi) const { return (b * g.Tq + g.q0) * W + qi * g.D; }
  int64_t k(const BlockGeometry& g, int64_t b) const { return (b * g.Tk + g.k0) * KW; }
  int64_t v(const BlockGeometry& g, int64_t b) const { return (b * g.Tk + g.k0) * KW + g.D; }
  int64_t out(const BlockGeometry& g, int64_t b, int64_t qi) const { return (b * g.Tq + g.q0) * HD + qi * g.D; }
  int64_t mat(const BlockGeometry& g, int64_t b, int64_t qi) const { return (b * g.H + qi) * M; }
};
BlockLayout block_layout(const BlockGeometry& g) {
  const int64_t Q = g.H / g.G;
  return {Q, g.G * (Q + 2) * g.D, g.G * 2 * g.D, g.H * g.D, g.nq * g.nk};
}

// S^T (col-major [nk, nq] per head) = scale K^T Q, into s.
template <typename V>
void block_scores(V* s, const V* qkv, const V* kv, const BlockGeometry& g, const BlockLayout& L, DType dt) {
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t qi = 0; qi < L.Q; ++qi)
      gemm_strided_batched(true, false, g.nk, g.nq, g.D, g.scale, kv + L.k(g, b), L.KW, 2 * g.D, qkv + L.q(g, b, qi),
                           L.W, (L.Q + 2) * g.D, s + L.mat(g, b, qi), g.nk, L.Q * L.M, g.G, dt);
}

template <typename V>
void block_forward(V* out, float* lse, V* probs, V* dropped, const V* qkv, const V* kv, const BlockGeometry& g,
                   const Drop& dr, DType dt) {
  MTNLG_LAUNCH(grid_for(g.B * g.Tq * g.H * g.D, 256), 256, 0, stream(), block_blank_kernel<V>)(out, lse, g);
  MTNLG_CUDA_LAUNCH_CHECK("block_blank_kernel");
  if (g.nq == 0 || g.nk == 0) return;
  const BlockLayout L = block_layout(g);
  block_scores(probs, qkv, kv, g, L, dt);
  MTNLG_LAUNCH(block_row_blocks(g), kThreads, 0, stream(), block_softmax_kernel<V>)
  (probs, dr.on ? dropped : nullptr, lse, g, dr);
  MTNLG_CUDA_LAUNCH_CHECK("block_softmax_kernel");
  const V* pv = dr.on ? dropped : probs;
  for (int64_t b = 0; b < g.B; ++b)  // out_cm [D, nq] = V_cm P'_cm
    for (int64_t qi = 0; qi < L.Q; ++qi)
      gemm_strided_batched(false, false, g.D, g.nq, g.nk, 1.0f, kv + L.v(g, b), L.KW, 2 * g.D, pv + L.mat(g, b, qi),
                           g.nk, L.Q * L.M, out + L.out(g, b, qi), L.HD, L.Q * g.D, g.G, dt);
}

// The backward's pointers: the gradients it adds to, the tensors it reads, its scratch
// ([B, H, nq, nk] each: P, P' with dropout, dP then dS; delta [B, H, nq] in fp32).
template <typename V>
struct BlockGrads {
  V* dqkv;
  V* dkv;
  const V *dout, *qkv, *kv, *out;
  const float *lse, *dlse;
  V *probs, *dropped, *dp;
  float* delta;
};

template <typename V>
void block_backward(const BlockGrads<V>& a, const BlockGeometry& g, const Drop& dr, DType dt) {
  if (g.nq == 0 || g.nk == 0) return;
  const BlockLayout L = block_layout(g);
  const int64_t Q = L.Q, D = g.D, qs = (Q + 2) * D, ms = Q * L.M;
  block_scores(a.probs, a.qkv, a.kv, g, L, dt);
  MTNLG_LAUNCH(block_row_blocks(g), kThreads, 0, stream(), block_probs_kernel<V>)
  (a.probs, dr.on ? a.dropped : nullptr, a.delta, a.lse, a.dout, a.out, a.dlse, g, dr);
  MTNLG_CUDA_LAUNCH_CHECK("block_probs_kernel");
  const V* pv = dr.on ? a.dropped : a.probs;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t qi = 0; qi < Q; ++qi) {
      // dV_cm [D, nk] += dO_cm P'_cm^T ; dP'_cm [nk, nq] = V_cm^T dO_cm
      gemm_strided_batched(false, true, D, g.nk, g.nq, 1.0f, a.dout + L.out(g, b, qi), L.HD, Q * D,
                           pv + L.mat(g, b, qi), g.nk, ms, a.dkv + L.v(g, b), L.KW, 2 * D, g.G, dt, 1.0f);
      gemm_strided_batched(true, false, g.nk, g.nq, D, 1.0f, a.kv + L.v(g, b), L.KW, 2 * D, a.dout + L.out(g, b, qi),
                           L.HD, Q * D, a.dp + L.mat(g, b, qi), g.nk, ms, g.G, dt);
    }
  MTNLG_LAUNCH(block_row_blocks(g), kThreads, 0, stream(), block_softmax_backward_kernel<V>)
  (a.dp, a.probs, a.delta, g, dr);
  MTNLG_CUDA_LAUNCH_CHECK("block_softmax_backward_kernel");
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t qi = 0; qi < Q; ++qi) {
      // dQ_cm [D, nq] += K_cm dS_cm ; dK_cm [D, nk] += Q_cm dS_cm^T
      gemm_strided_batched(false, false, D, g.nq, g.nk, 1.0f, a.kv + L.k(g, b), L.KW, 2 * D, a.dp + L.mat(g, b, qi),
                           g.nk, ms, a.dqkv + L.q(g, b, qi), L.W, qs, g.G, dt, 1.0f);
      gemm_strided_batched(false, true, D, g.nk, g.nq, 1.0f, a.qkv + L.q(g, b, qi), L.W, qs, a.dp + L.mat(g, b, qi),
                           g.nk, ms, a.dkv + L.k(g, b), L.KW, 2 * D, g.G, dt, 1.0f);
    }
}

// The merge's weights of one row: w_a = exp(la - l), w_b = exp(lb - l), l = log(e^la +
// e^lb) (the CPU's merge_weights); both 0 and l = -inf when neither side saw a key.
__device__ __forceinline__ float merge_weights(float la, float lb, float& wa, float& wb) {
  const float m = fmaxf(la, lb);
  if (m == -INFINITY) {
    wa = wb = 0.0f;
    return m;
  }
  const float l = m + logf(expf(la - m) + expf(lb - m));
  wa = expf(la - l);
  wb = expf(lb - l);
  return l;
}

// One thread per row (b, h, t): it reads its lse and out before writing them, so out and
// lse may alias out_a and lse_a. VB: out_b's type (a low-precision block merged into an
// f32 accumulator, V float).
template <typename V, typename VB = V>
__global__ void merge_kernel(V* out, float* lse, const V* oa, const float* la, const VB* ob, const float* lb, int64_t B,
                             int64_t Tn, int64_t H, int64_t D) {
  const int64_t rows = B * H * Tn;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = r % Tn, h = (r / Tn) % H, b = r / (Tn * H), o = (b * Tn + t) * H * D + h * D;
    float wa, wb;
    lse[r] = merge_weights(la[r], lb[r], wa, wb);
    for (int64_t d = 0; d < D; ++d) out[o + d] = from_f<V>(wa * to_f(oa[o + d]) + wb * to_f(ob[o + d]));
  }
}

template <typename V>
__global__ void merge_backward_kernel(V* doa, float* dla, V* dob, float* dlb, const V* dout, const float* dlse,
                                      const V* oa, const float* la, const V* ob, const float* lb, int64_t B, int64_t Tn,
                                      int64_t H, int64_t D) {
  const int64_t rows = B * H * Tn;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = r % Tn, h = (r / Tn) % H, b = r / (Tn * H), o = (b * Tn + t) * H * D + h * D;
    float wa, wb;
    merge_weights(la[r], lb[r], wa, wb);
    float ga = dlse ? dlse[r] : 0.0f, gb = ga;  // dout . (out_x - out) + dlse
    for (int64_t d = 0; d < D; ++d) {
      const float xa = to_f(oa[o + d]), xb = to_f(ob[o + d]), y = wa * xa + wb * xb, gd = to_f(dout[o + d]);
      ga += gd * (xa - y);
      gb += gd * (xb - y);
      doa[o + d] = from_f<V>(wa * gd);
      dob[o + d] = from_f<V>(wb * gd);
    }
    dla[r] = wa * ga;
    dlb[r] = wb * gb;
  }
}

// The K/V buffer of a cp exchange: element e of kv [rows, G*2*D] against its column in
// the packed qkv rows (group g's k and v at g(Q+2)D + QD); to_kv: qkv -> kv, else back.
template <typename V>
__global__ void kv_copy_kernel(V* qkv, V* kv, int64_t rows, int64_t G, int64_t Q, int64_t D, bool to_kv) {
  const int64_t n = rows * G * 2 * D;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = e % (2 * D), g = (e / (2 * D)) % G, row = e / (2 * D * G);
    const int64_t a = row * G * (Q + 2) * D + g * (Q + 2) * D + Q * D + c;
    if (to_kv)
      kv[e] = qkv[a];
    else
      qkv[a] = kv[e];
  }
}

}  // namespace

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

namespace {
// The geometry (the dispatcher checked it); `limited`: the kernel keeps a head in
// registers / shared memory (flash and KV-cache forms); the unfused form's GEMMs take any
// head size.
op_checks::QkvShape attn_shape(const char* op, const Tensor& qkv, int64_t heads, int64_t groups, bool limited = true) {
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  if (limited && s.D > kAttnMaxHeadDim)
    throw_runtime("{}: head size {} exceeds the CUDA kernel's limit of {}", op, s.D, kAttnMaxHeadDim);
  return s;
}
}  // namespace

void attention_forward_lse(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads,
                           const ops::AttentionDropout& drop, int64_t groups) {
  cuda_dtype("attention_forward_lse", "qkv", qkv.dtype());
  cudnn_attention_forward(out, lse, qkv, heads, drop, groups);
}

void attention_backward_lse(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t heads, const ops::AttentionDropout& drop, int64_t groups) {
  cuda_dtype("attention_backward_lse", "qkv", qkv.dtype());
  if (!out.defined()) throw_runtime("attention_backward_lse: the CUDA backward needs the forward's out");
  cudnn_attention_backward(dqkv, dout, qkv, out, lse, heads, drop, groups);
}

void attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t heads, const ops::AttentionDropout& drop,
                       int64_t groups) {
  const char* op = "attention_forward";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  const op_checks::QkvShape s = attn_shape(op, qkv, heads, groups, /*limited=*/false);
  Tensor dropped;  // P' for the P V product, only when dropout is on
  if (drop.p > 0) dropped = Tensor::empty(probs.shape(), probs.dtype(), probs.device());
  k::attention_unfused_forward(out.raw(), probs.raw(), dropped.defined() ? dropped.raw() : nullptr, qkv.raw(), dt, s.B,
                               s.T, s.H, s.G, s.D, drop);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads,
                        const ops::AttentionDropout& drop, int64_t groups) {
  const char* op = "attention_backward";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  const op_checks::QkvShape s = attn_shape(op, qkv, heads, groups, /*limited=*/false);
  Tensor scratch = Tensor::empty(probs.shape(), probs.dtype(), probs.device());  // P', then dP and dS in place
  k::attention_unfused_backward(dqkv.raw(), dout.raw(), qkv.raw(), probs.raw(), scratch.raw(), dt, s.B, s.T, s.H, s.G,
                                s.D, drop);
}

void attention_cached_forward(Tensor& out, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int64_t heads,
                              int64_t past, int64_t groups) {
  const char* op = "attention_cached_forward";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  const op_checks::QkvShape s = attn_shape(op, qkv, heads, groups);
  if (s.B * s.T * s.H > INT32_MAX) throw_runtime("{}: batch x positions x heads exceeds the kernel's grid", op);
  k::attention_cached_forward(out.raw(), k_cache.raw(), v_cache.raw(), qkv.raw(), dt, s.B, s.T, s.H, s.G, s.D,
                              k_cache.dim(2), past);
}

}  // namespace mtnlg::cuda

// ---- context parallelism's pieces: Tensor-level entry (the dispatcher checked shapes
// and dtype roles: activations in one of f32, bf16, f16, the lse in f32) ---------------

namespace mtnlg::cuda {

using namespace detail;

namespace {
// The block's geometry with the counts of -1 resolved (the dispatcher checked the ranges).
k::BlockGeometry block_geometry(const char* op, const Tensor& qkv, const Tensor& kv, int64_t heads,
                                const ops::AttentionBlock& blk, int64_t groups) {
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  const int64_t Tk = kv.dim(1);
  const int64_t nq = blk.q_count < 0 ? s.T - blk.q_begin : blk.q_count;
  const int64_t nk = blk.k_count < 0 ? Tk - blk.k_begin : blk.k_count;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.D)));
  return {s.B,         s.T,         Tk,          s.H,        s.G,        s.D,
          blk.q_begin, nq,          blk.k_begin, nk,         blk.causal, blk.causal_offset,
          scale,       blk.seq_len, blk.q_rows,  blk.kv_rows};
}
Tensor scratch_like(const k::BlockGeometry& g, const Tensor& like) {
  return Tensor::empty({g.B, g.H, g.nq, g.nk}, like.dtype(), like.device());
}
}  // namespace

void attention_block_forward(Tensor& out, Tensor& lse, const Tensor& qkv, const Tensor& kv, int64_t heads,
                             const ops::AttentionBlock& blk, int64_t groups) {
  const char* op = "attention_block_forward";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  need_f32(op, "lse", &lse);
  const k::BlockGeometry g = block_geometry(op, qkv, kv, heads, blk, groups);
  const k::Drop dr = k::make_drop(blk.drop, g.H);
  Tensor probs = scratch_like(g, qkv), dropped;  // P, and P' only with dropout
  if (dr.on) dropped = scratch_like(g, qkv);
  MTNLG_DT_SWITCH(dt, V,
                  k::block_forward<V>(static_cast<V*>(out.raw()), f(lse), static_cast<V*>(probs.raw()),
                                      static_cast<V*>(p(&dropped)), static_cast<const V*>(qkv.raw()),
                                      static_cast<const V*>(kv.raw()), g, dr, dt));
}

void attention_block_backward(Tensor& dqkv, Tensor& dkv, const Tensor& dout, const Tensor* dlse, const Tensor& qkv,
                              const Tensor& kv, const Tensor& out, const Tensor& lse, int64_t heads,
                              const ops::AttentionBlock& blk, int64_t groups) {
  const char* op = "attention_block_backward";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  need_f32(op, "lse", &lse);
  need_f32(op, "dlse", dlse);
  const k::BlockGeometry g = block_geometry(op, qkv, kv, heads, blk, groups);
  const k::Drop dr = k::make_drop(blk.drop, g.H);
  Tensor probs = scratch_like(g, qkv), dp = scratch_like(g, qkv), dropped;
  if (dr.on) dropped = scratch_like(g, qkv);
  Tensor delta = Tensor::empty({g.B, g.H, g.nq}, DType::f32, qkv.device());
  MTNLG_DT_SWITCH(dt, V, {
    const k::BlockGrads<V> a{static_cast<V*>(dqkv.raw()),
                             static_cast<V*>(dkv.raw()),
                             static_cast<const V*>(dout.raw()),
                             static_cast<const V*>(qkv.raw()),
                             static_cast<const V*>(kv.raw()),
                             static_cast<const V*>(out.raw()),
                             f(lse),
                             p<const float>(dlse),
                             static_cast<V*>(probs.raw()),
                             static_cast<V*>(p(&dropped)),
                             static_cast<V*>(dp.raw()),
                             f(delta)};
    k::block_backward<V>(a, g, dr, dt);
  });
}

void attention_merge_forward(Tensor& out, Tensor& lse, const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                             const Tensor& lse_b) {
  const char* op = "attention_merge_forward";
  const DType dt = cuda_dtype(op, "out", out.dtype());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&lse, &lse_a, &lse_b}) need_f32(op, "lse", t);
  const int64_t B = lse.dim(0), H = lse.dim(1), Tn = lse.dim(2), D = out.dim(2) / H;
  if (B * H * Tn == 0) return;
  if (out_b.dtype() != dt) {  // out and out_a f32, out_b bf16/f16 (ops::attention_merge_forward checked)
    MTNLG_DT_SWITCH(cuda_dtype(op, "out_b", out_b.dtype()), VB, {
      MTNLG_LAUNCH(k::grid_for(B * H * Tn, 256), 256, 0, stream(), k::merge_kernel<float, VB>)
      (static_cast<float*>(out.raw()), f(lse), static_cast<const float*>(out_a.raw()), f(lse_a),
       static_cast<const VB*>(out_b.raw()), f(lse_b), B, Tn, H, D);
      MTNLG_CUDA_LAUNCH_CHECK("merge_kernel");
    });
    return;
  }
  MTNLG_DT_SWITCH(dt, V, {
    MTNLG_LAUNCH(k::grid_for(B * H * Tn, 256), 256, 0, stream(), k::merge_kernel<V>)
    (static_cast<V*>(out.raw()), f(lse), static_cast<const V*>(out_a.raw()), f(lse_a),
     static_cast<const V*>(out_b.raw()), f(lse_b), B, Tn, H, D);
    MTNLG_CUDA_LAUNCH_CHECK("merge_kernel");
  });
}

void attention_merge_backward(Tensor& dout_a, Tensor& dlse_a, Tensor& dout_b, Tensor& dlse_b, const Tensor& dout,
                              const Tensor* dlse, const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                              const Tensor& lse_b) {
  const char* op = "attention_merge_backward";
  const DType dt = cuda_dtype(op, "out_a", out_a.dtype());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dlse_a, &dlse_b, dlse, &lse_a, &lse_b})
    need_f32(op, "lse", t);
  const int64_t B = lse_a.dim(0), H = lse_a.dim(1), Tn = lse_a.dim(2), D = out_a.dim(2) / H;
  if (B * H * Tn == 0) return;
  MTNLG_DT_SWITCH(dt, V, {
    MTNLG_LAUNCH(k::grid_for(B * H * Tn, 256), 256, 0, stream(), k::merge_backward_kernel<V>)
    (static_cast<V*>(dout_a.raw()), f(dlse_a), static_cast<V*>(dout_b.raw()), f(dlse_b),
     static_cast<const V*>(dout.raw()), p<const float>(dlse), static_cast<const V*>(out_a.raw()), f(lse_a),
     static_cast<const V*>(out_b.raw()), f(lse_b), B, Tn, H, D);
    MTNLG_CUDA_LAUNCH_CHECK("merge_backward_kernel");
  });
}

namespace {
void kv_copy(const char* op, void* qkv, void* kv, DType dt, const op_checks::QkvShape& s, bool to_kv) {
  cuda_dtype(op, "qkv", dt);
  const int64_t n = s.B * s.T * s.G * 2 * s.D;
  if (n == 0) return;
  MTNLG_DT_SWITCH(dt, V, {
    MTNLG_LAUNCH(k::grid_for(n, 256), 256, 0, stream(), k::kv_copy_kernel<V>)
    (static_cast<V*>(qkv), static_cast<V*>(kv), s.B * s.T, s.G, s.H / s.G, s.D, to_kv);
    MTNLG_CUDA_LAUNCH_CHECK("kv_copy_kernel");
  });
}
}  // namespace

void attention_kv_forward(Tensor& kv, const Tensor& qkv, int64_t heads, int64_t groups) {
  const op_checks::QkvShape s = op_checks::qkv_shape("attention_kv_forward", qkv, heads, groups);
  kv_copy("attention_kv_forward", qkv.raw(), kv.raw(), qkv.dtype(), s, true);
}

void attention_kv_backward(Tensor& dqkv, const Tensor& dkv, int64_t heads, int64_t groups) {
  const op_checks::QkvShape s = op_checks::qkv_shape("attention_kv_backward", dqkv, heads, groups);
  kv_copy("attention_kv_backward", dqkv.raw(), dkv.raw(), dqkv.dtype(), s, false);
}

}  // namespace mtnlg::cuda
