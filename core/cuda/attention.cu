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
