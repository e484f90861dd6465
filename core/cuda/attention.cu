// Causal self-attention on CUDA in its two forms (model.attention_backend): the unfused
// form (batched cuBLASLt GEMMs around a softmax kernel, probabilities kept; its own
// section below) and, first, the flash form: the
// [T,T] score matrix is never written to HBM. CPU reference: core/ops/attention.cpp
// (ops::attention_forward_lse / attention_backward_lse), which save the per-row log-sum-exp
// lse[b,h,i] = log sum_j exp(s_ij) (s = q.k / sqrt(D), j <= i) instead of probs.
//
// Gradient contract: dqkv is WRITTEN (every q, k and v element of every position).
// Dropout on the attention probabilities uses the CPU's mask index
// ((sample_offset+b)*heads_total + head_offset+h)*T*T + i*T + j, so masks match the
// CPU and any tensor-parallel split of heads.
//
// Forward: a block owns 16 query rows of one (b,h) (4 warps x 4 rows) and walks key
// tiles of 32 (one key per lane) up to the diagonal, with the online softmax (running
// max m, running sum l, output rescaled by exp(m_old - m_new)). Each lane keeps D/32
// output columns in registers; D <= 256.
// Backward (recomputes P from qkv and lse, no atomics, deterministic):
//   1) Di = dO_i . O_i per row (equals sum_j P_ij dP_ij, dropout included);
//   2) dQ: a block per 16 query rows, walking key tiles (like the forward);
//   3) dK, dV: a block per 16 keys (4 per warp), walking query tiles of 32 rows from the
//      diagonal down (one query row per lane).
// One template instance per storage type; the head size is a runtime value (no
// per-D instantiations, so the CUDA build stays short).
#include <climits>

#include "core/cuda/common.cuh"
#include "core/rng.hpp"

namespace mtnlg::cuda::k {

namespace {

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 4, kBlockRows = kWarps * kRowsPerWarp;  // 16 query rows / 16 keys per block
constexpr int kTile = 32;                                            // keys (fwd, dQ) or queries (dK/dV) per tile
constexpr int kPer = static_cast<int>(kAttnMaxHeadDim / 32);          // head columns per lane

__host__ __device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

struct Geometry {
  int64_t B, T, H, D;
  float scale;
};
struct Drop {
  float p, dscale;
  uint64_t key;
  int64_t sample_offset, head_offset, heads_total;
  bool on;
};

__device__ __forceinline__ bool kept(const Drop& dr, const Geometry& g, int64_t b, int64_t h, int64_t i, int64_t j) {
  const uint64_t base =
      static_cast<uint64_t>(((dr.sample_offset + b) * dr.heads_total + dr.head_offset + h) * g.T * g.T);
  return philox_uniform(dr.key, 0, base + static_cast<uint64_t>(i * g.T + j)) >= dr.p;
}

// Copies rows [r0, r0+rows) of the q (part 0), k (1) or v (2) slice of head h, sample
// b into smem (row stride `ld`), as fp32; rows >= T become zeros.
template <typename T>
__device__ void load_qkv_rows(float* dst, int ld, const T* qkv, const Geometry& g, int64_t b, int64_t h, int part,
                              int64_t r0, int rows) {
  const int64_t row_stride = g.H * 3 * g.D;
  for (int e = threadIdx.x; e < rows * g.D; e += blockDim.x) {
    const int r = e / static_cast<int>(g.D), d = e % static_cast<int>(g.D);
    const int64_t t = r0 + r;
    dst[r * ld + d] = t < g.T ? to_f(qkv[(b * g.T + t) * row_stride + h * 3 * g.D + part * g.D + d]) : 0.0f;
  }
}
// Same for a [B,T,H*D] tensor (out, dout).
template <typename T>
__device__ void load_hd_rows(float* dst, int ld, const T* x, const Geometry& g, int64_t b, int64_t h, int64_t r0,
                             int rows) {
  for (int e = threadIdx.x; e < rows * g.D; e += blockDim.x) {
    const int r = e / static_cast<int>(g.D), d = e % static_cast<int>(g.D);
    const int64_t t = r0 + r;
    dst[r * ld + d] = t < g.T ? to_f(x[(b * g.T + t) * g.H * g.D + h * g.D + d]) : 0.0f;
  }
}

__device__ __forceinline__ float dot(const float* a, const float* b, int64_t D) {
  float s = 0;
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

// ---- forward -------------------------------------------------------------------------
template <typename T>
__global__ void __launch_bounds__(kThreads) attn_forward_kernel(T* out, float* lse, const T* qkv, Geometry g, Drop dr) {
  MTNLG_DYNAMIC_SHARED(float, sm);
  const int D = static_cast<int>(g.D), ldk = D + 1;
  float* Qs = sm;                      // [16][D]
  float* Ks = Qs + kBlockRows * D;     // [32][D+1]
  float* Vs = Ks + kTile * ldk;        // [32][D]
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t bh = blockIdx.x, b = bh / g.H, h = bh % g.H;
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * kBlockRows;

  load_qkv_rows(Qs, D, qkv, g, b, h, 0, q0, kBlockRows);
  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kPer];
  #pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0;
    #pragma unroll
    for (int t = 0; t < kPer; ++t) o[r][t] = 0;
  }
  const int64_t kv_end = imin(g.T, q0 + kBlockRows);  // last row of the block sees keys < kv_end
  for (int64_t kt = 0; kt < kv_end; kt += kTile) {
    __syncthreads();  // previous tile fully consumed (and Qs loaded on the first pass)
    load_qkv_rows(Ks, ldk, qkv, g, b, h, 1, kt, kTile);
    load_qkv_rows(Vs, D, qkv, g, b, h, 2, kt, kTile);
    __syncthreads();
    #pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int qr = warp * kRowsPerWarp + r;
      const int64_t i = q0 + qr;
      if (i >= g.T || kt > i) continue;  // warp-uniform
      const int64_t j = kt + lane;
      const bool valid = j <= i;
      const float s = valid ? dot(Qs + qr * D, Ks + lane * ldk, D) * g.scale : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(s));  // finite: key kt <= i is valid
      const float corr = expf(m[r] - m_new);         // 0 on the first tile (m = -inf)
      const float p = valid ? expf(s - m_new) : 0.0f;
      l[r] = l[r] * corr + warp_sum(p);
      float pd = p;
      if (dr.on && valid) pd = kept(dr, g, b, h, i, j) ? p * dr.dscale : 0.0f;
      #pragma unroll
      for (int t = 0; t < kPer; ++t) o[r][t] *= corr;
      const int jn = static_cast<int>(imin(kTile, i - kt + 1));  // valid keys in this tile
      for (int jj = 0; jj < jn; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, pd, jj);
        #pragma unroll
        for (int t = 0; t < kPer; ++t) {
          const int d = lane + 32 * t;
          if (d < D) o[r][t] += pj * Vs[jj * D + d];
        }
      }
      m[r] = m_new;
    }
  }
  #pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = q0 + warp * kRowsPerWarp + r;
    if (i >= g.T) continue;
    const float inv = 1.0f / l[r];
    T* orow = out + (b * g.T + i) * g.H * g.D + h * g.D;
    #pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int d = lane + 32 * t;
      if (d < D) orow[d] = from_f<T>(o[r][t] * inv);
    }
    if (lane == 0) lse[bh * g.T + i] = m[r] + logf(l[r]);
  }
}

// ---- backward ------------------------------------------------------------------------
// delta_i = dO_i . O_i, one thread per row, summed over d in ascending order exactly as
// dot() sums dp_ij = dO_i . V_j in the kernels below. Where row i attends to one key only
// (the first row of a causal mask), O_i is V_j bit for bit, so dp - delta is exactly 0:
// the gradient of a softmax over one element, which the CPU and fp64 give as 0. A
// lane-strided sum rounds differently and left a residual of a few ulps of dO . V there,
// which dq carries into an element whose true value is 0 (seen on an H200).
template <typename T>
__global__ void attn_delta_kernel(float* delta, const T* dout, const T* out, Geometry g) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;  // (b, h, i) flattened as bh*T + i
  if (row >= g.B * g.H * g.T) return;
  const int64_t bh = row / g.T, i = row % g.T, b = bh / g.H, h = bh % g.H;
  const int64_t off = (b * g.T + i) * g.H * g.D + h * g.D;
  float s = 0;
  for (int64_t d = 0; d < g.D; ++d) s += to_f(dout[off + d]) * to_f(out[off + d]);
  delta[row] = s;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attn_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta, Geometry g, Drop dr) {
  MTNLG_DYNAMIC_SHARED(float, sm);
  const int D = static_cast<int>(g.D), ld = D + 1;
  float* Qs = sm;                      // [16][D]
  float* dOs = Qs + kBlockRows * D;    // [16][D]
  float* Ks = dOs + kBlockRows * D;    // [32][D+1]
  float* Vs = Ks + kTile * ld;         // [32][D+1]
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t bh = blockIdx.x, b = bh / g.H, h = bh % g.H;
  const int64_t q0 = static_cast<int64_t>(blockIdx.y) * kBlockRows;

  load_qkv_rows(Qs, D, qkv, g, b, h, 0, q0, kBlockRows);
  load_hd_rows(dOs, D, dout, g, b, h, q0, kBlockRows);
  float dq[kRowsPerWarp][kPer];
  float lse_r[kRowsPerWarp], del_r[kRowsPerWarp];
  #pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = q0 + warp * kRowsPerWarp + r;
    lse_r[r] = i < g.T ? lse[bh * g.T + i] : 0.0f;
    del_r[r] = i < g.T ? delta[bh * g.T + i] : 0.0f;
    #pragma unroll
    for (int t = 0; t < kPer; ++t) dq[r][t] = 0;
  }
  const int64_t kv_end = imin(g.T, q0 + kBlockRows);
  for (int64_t kt = 0; kt < kv_end; kt += kTile) {
    __syncthreads();
    load_qkv_rows(Ks, ld, qkv, g, b, h, 1, kt, kTile);
    load_qkv_rows(Vs, ld, qkv, g, b, h, 2, kt, kTile);
    __syncthreads();
    #pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int qr = warp * kRowsPerWarp + r;
      const int64_t i = q0 + qr;
      if (i >= g.T || kt > i) continue;
      const int64_t j = kt + lane;
      float ds = 0.0f;
      if (j <= i) {
        const float P = expf(dot(Qs + qr * D, Ks + lane * ld, D) * g.scale - lse_r[r]);
        float dp = dot(dOs + qr * D, Vs + lane * ld, D);
        if (dr.on) dp = kept(dr, g, b, h, i, j) ? dp * dr.dscale : 0.0f;
        ds = P * (dp - del_r[r]);
      }
      const int jn = static_cast<int>(imin(kTile, i - kt + 1));
      for (int jj = 0; jj < jn; ++jj) {
        const float dsj = __shfl_sync(0xffffffffu, ds, jj);
        #pragma unroll
        for (int t = 0; t < kPer; ++t) {
          const int d = lane + 32 * t;
          if (d < D) dq[r][t] += dsj * Ks[jj * ld + d];
        }
      }
    }
  }
  const int64_t row_stride = g.H * 3 * g.D;
  #pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = q0 + warp * kRowsPerWarp + r;
    if (i >= g.T) continue;
    T* dst = dqkv + (b * g.T + i) * row_stride + h * 3 * g.D;
    #pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int d = lane + 32 * t;
      if (d < D) dst[d] = from_f<T>(dq[r][t] * g.scale);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attn_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta, Geometry g, Drop dr) {
  MTNLG_DYNAMIC_SHARED(float, sm);
  const int D = static_cast<int>(g.D), ld = D + 1;
  float* Ks = sm;                     // [16][D]
  float* Vs = Ks + kBlockRows * D;    // [16][D]
  float* Qs = Vs + kBlockRows * D;    // [32][D+1]
  float* dOs = Qs + kTile * ld;       // [32][D+1]
  float* lse_s = dOs + kTile * ld;    // [32]
  float* del_s = lse_s + kTile;       // [32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t bh = blockIdx.x, b = bh / g.H, h = bh % g.H;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kBlockRows;

  load_qkv_rows(Ks, D, qkv, g, b, h, 1, k0, kBlockRows);
  load_qkv_rows(Vs, D, qkv, g, b, h, 2, k0, kBlockRows);
  float dk[kRowsPerWarp][kPer], dv[kRowsPerWarp][kPer];
  #pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
    #pragma unroll
    for (int t = 0; t < kPer; ++t) dk[r][t] = dv[r][t] = 0;

  for (int64_t qt = k0; qt < g.T; qt += kTile) {  // query rows i >= k0 can see these keys
    __syncthreads();
    load_qkv_rows(Qs, ld, qkv, g, b, h, 0, qt, kTile);
    load_hd_rows(dOs, ld, dout, g, b, h, qt, kTile);
    if (threadIdx.x < kTile) {
      const int64_t i = qt + threadIdx.x;
      lse_s[threadIdx.x] = i < g.T ? lse[bh * g.T + i] : 0.0f;
      del_s[threadIdx.x] = i < g.T ? delta[bh * g.T + i] : 0.0f;
    }
    __syncthreads();
    const int64_t i = qt + lane;
    #pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int kr = warp * kRowsPerWarp + r;
      const int64_t j = k0 + kr;
      if (j >= g.T) continue;  // warp-uniform
      float pd = 0.0f, ds = 0.0f;
      if (i < g.T && i >= j) {
        const float P = expf(dot(Qs + lane * ld, Ks + kr * D, D) * g.scale - lse_s[lane]);
        float dp = dot(dOs + lane * ld, Vs + kr * D, D);
        pd = P;
        if (dr.on) {
          const bool kp = kept(dr, g, b, h, i, j);
          pd = kp ? P * dr.dscale : 0.0f;
          dp = kp ? dp * dr.dscale : 0.0f;
        }
        ds = P * (dp - del_s[lane]);
      }
      for (int ll = 0; ll < kTile; ++ll) {
        const float pl = __shfl_sync(0xffffffffu, pd, ll), sl = __shfl_sync(0xffffffffu, ds, ll);
        #pragma unroll
        for (int t = 0; t < kPer; ++t) {
          const int d = lane + 32 * t;
          if (d < D) {
            dv[r][t] += pl * dOs[ll * ld + d];
            dk[r][t] += sl * Qs[ll * ld + d];
          }
        }
      }
    }
  }
  const int64_t row_stride = g.H * 3 * g.D;
  #pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = k0 + warp * kRowsPerWarp + r;
    if (j >= g.T) continue;
    T* dst = dqkv + (b * g.T + j) * row_stride + h * 3 * g.D;
    #pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int d = lane + 32 * t;
      if (d < D) {
        dst[g.D + d] = from_f<T>(dk[r][t] * g.scale);
        dst[2 * g.D + d] = from_f<T>(dv[r][t]);
      }
    }
  }
}

Geometry geometry(int64_t B, int64_t T, int64_t H, int64_t D) {
  if (D < 1 || D > kAttnMaxHeadDim) fail("attention: head size must be in [1, 256] on CUDA");
  return Geometry{B, T, H, D, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)))};
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
  return r;
}

// Opts the kernel into more than 48 KiB of dynamic shared memory when it needs it.
template <typename K>
void set_smem(K kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// (b, h) pairs on x (up to 2^31 - 1 blocks: micro-batch x local heads may well exceed
// the 65535 of y), row tiles on y.
dim3 tiles(const Geometry& g) {
  const int64_t row_tiles = (g.T + kBlockRows - 1) / kBlockRows;
  if (row_tiles > 65535) fail("attention: sequence too long for the kernel's grid (more than 65535 x 16 positions)");
  if (g.B * g.H > INT32_MAX) fail("attention: micro-batch x heads exceeds the kernel's grid (2^31 - 1)");
  return dim3(static_cast<unsigned>(g.B * g.H), static_cast<unsigned>(row_tiles));
}

}  // namespace

void attention_forward(void* out, float* lse, const void* qkv, DType dt, int64_t B, int64_t T, int64_t H, int64_t D,
                       const ops::AttentionDropout& drop) {
  if (B * T * H == 0) return;
  const Geometry g = geometry(B, T, H, D);
  const Drop dr = make_drop(drop, H);
  const size_t smem = sizeof(float) * static_cast<size_t>(kBlockRows * D + kTile * (D + 1) + kTile * D);
  MTNLG_DT_SWITCH(dt, V, {
    set_smem(attn_forward_kernel<V>, smem);
    MTNLG_LAUNCH(tiles(g), kThreads, smem, stream(), attn_forward_kernel<V>)(static_cast<V*>(out), lse,
                                                                   static_cast<const V*>(qkv), g, dr);
  });
  MTNLG_CUDA_LAUNCH_CHECK("attn_forward_kernel");
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, DType dt, int64_t B,
                        int64_t T, int64_t H, int64_t D, const ops::AttentionDropout& drop) {
  if (B * T * H == 0) return;
  const Geometry g = geometry(B, T, H, D);
  const Drop dr = make_drop(drop, H);
  DeviceBuffer<float> delta(B * H * T);
  const size_t smem_dq = sizeof(float) * static_cast<size_t>(2 * kBlockRows * D + 2 * kTile * (D + 1));
  const size_t smem_dkv = sizeof(float) * static_cast<size_t>(2 * kBlockRows * D + 2 * kTile * (D + 1) + 2 * kTile);
  const unsigned delta_blocks = static_cast<unsigned>((B * H * T + 255) / 256);
  MTNLG_DT_SWITCH(dt, V, {
    MTNLG_LAUNCH(delta_blocks, 256, 0, stream(), attn_delta_kernel<V>)(delta.data(), static_cast<const V*>(dout),
                                                            static_cast<const V*>(out), g);
    MTNLG_CUDA_LAUNCH_CHECK("attn_delta_kernel");
    set_smem(attn_dq_kernel<V>, smem_dq);
    MTNLG_LAUNCH(tiles(g), kThreads, smem_dq, stream(), attn_dq_kernel<V>)(static_cast<V*>(dqkv), static_cast<const V*>(dout),
                                                                static_cast<const V*>(qkv), lse, delta.data(), g, dr);
    MTNLG_CUDA_LAUNCH_CHECK("attn_dq_kernel");
    set_smem(attn_dkv_kernel<V>, smem_dkv);
    MTNLG_LAUNCH(tiles(g), kThreads, smem_dkv, stream(), attn_dkv_kernel<V>)(static_cast<V*>(dqkv), static_cast<const V*>(dout),
                                                                  static_cast<const V*>(qkv), lse, delta.data(), g, dr);
  });
  MTNLG_CUDA_LAUNCH_CHECK("attn_dkv_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Unfused attention (model.attention_backend: unfused): Megatron's form on tensor
// cores. Per sample b, with the heads as a strided batch read straight from the packed
// qkv rows (head h's q, k, v start at h*3D, 3D apart; row stride 3HD):
//   forward   S = scale * Q K^T                    batched GEMM, [H, T, T] into probs
//             P = softmax(causal mask(S)) in place  one warp per row, fp32 arithmetic
//             P' = dropout(P) (p > 0 only)          into a scratch [B, H, T, T]
//             out = P' V                            batched GEMM, into out's head columns
//   backward  dV = P'^T dO, dP' = dO V^T            P' recomputed from P and the mask
//             dS = scale * P (dP - rowsum(P dP))    in place over dP, zero above the diagonal
//             dQ = dS K, dK = dS^T Q                 into dqkv's q and k columns
// The scores and probabilities are stored in the activation dtype (as Megatron's fused
// scale-mask-softmax does); the GEMMs accumulate in fp32. dqkv is WRITTEN. The dropout
// mask is the flash form's (same index, same draws), so both forms give the same model.

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
    causal_softmax_kernel(V* probs, V* dropped, int64_t rows, Geometry g, Drop dr) {
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
__global__ void attention_dropout_kernel(V* dropped, const V* probs, int64_t rows, Geometry g, Drop dr) {
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
    causal_softmax_backward_kernel(V* dp, const V* probs, int64_t rows, Geometry g, Drop dr) {
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

Geometry unfused_geometry(int64_t B, int64_t T, int64_t H, int64_t D) {
  if (D < 1) fail("attention: empty head");
  return Geometry{B, T, H, D, static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)))};
}

unsigned row_blocks(int64_t rows) {
  const int64_t blocks = (rows + kWarps - 1) / kWarps;
  if (blocks > INT32_MAX) fail("attention: batch x heads x positions exceeds the softmax kernel's grid");
  return static_cast<unsigned>(blocks);
}

// Element offsets of sample b's pieces: qkv rows, out/dout rows, the [H, T, T] matrices.
struct UnfusedLayout {
  int64_t row, ldo, TT;  // qkv row stride 3HD, out row stride HD, T*T
  int64_t qkv(const Geometry& g, int64_t b, int part) const { return b * g.T * row + part * g.D; }
  int64_t out(const Geometry& g, int64_t b) const { return b * g.T * ldo; }
  int64_t mat(const Geometry& g, int64_t b) const { return b * g.H * TT; }
};
UnfusedLayout unfused_layout(const Geometry& g) { return {3 * g.H * g.D, g.H * g.D, g.T * g.T}; }

template <typename V>
void unfused_forward(V* out, V* probs, V* dropped, const V* qkv, const Geometry& g, const Drop& dr, DType dt) {
  const UnfusedLayout L = unfused_layout(g);
  const int64_t T = g.T, D = g.D, H = g.H, rows = g.B * H * T;
  for (int64_t b = 0; b < g.B; ++b)  // S^T (col-major [T_j, T_i]) = K_cm^T Q_cm
    gemm_strided_batched(true, false, T, T, D, g.scale, qkv + L.qkv(g, b, 1), L.row, 3 * D, qkv + L.qkv(g, b, 0), L.row,
                         3 * D, probs + L.mat(g, b), T, L.TT, H, dt);
  MTNLG_LAUNCH(row_blocks(rows), kThreads, 0, stream(), causal_softmax_kernel<V>)(probs, dr.on ? dropped : nullptr, rows,
                                                                                  g, dr);
  MTNLG_CUDA_LAUNCH_CHECK("causal_softmax_kernel");
  const V* pv = dr.on ? dropped : probs;
  for (int64_t b = 0; b < g.B; ++b)  // out_cm [D, T_i] = V_cm P'_cm
    gemm_strided_batched(false, false, D, T, T, 1.0f, qkv + L.qkv(g, b, 2), L.row, 3 * D, pv + L.mat(g, b), T, L.TT,
                         out + L.out(g, b), L.ldo, D, H, dt);
}

template <typename V>
void unfused_backward(V* dqkv, const V* dout, const V* qkv, const V* probs, V* scratch, const Geometry& g,
                      const Drop& dr, DType dt) {
  const UnfusedLayout L = unfused_layout(g);
  const int64_t T = g.T, D = g.D, H = g.H, rows = g.B * H * T;
  const V* pv = probs;
  if (dr.on) {
    MTNLG_LAUNCH(grid_for(rows * T, 256), 256, 0, stream(), attention_dropout_kernel<V>)(scratch, probs, rows, g, dr);
    MTNLG_CUDA_LAUNCH_CHECK("attention_dropout_kernel");
    pv = scratch;
  }
  for (int64_t b = 0; b < g.B; ++b)  // dV_cm [D, T_j] = dO_cm P'_cm^T
    gemm_strided_batched(false, true, D, T, T, 1.0f, dout + L.out(g, b), L.ldo, D, pv + L.mat(g, b), T, L.TT,
                         dqkv + L.qkv(g, b, 2), L.row, 3 * D, H, dt);
  for (int64_t b = 0; b < g.B; ++b)  // dP'_cm [T_j, T_i] = V_cm^T dO_cm (over P' once dV is done)
    gemm_strided_batched(true, false, T, T, D, 1.0f, qkv + L.qkv(g, b, 2), L.row, 3 * D, dout + L.out(g, b), L.ldo, D,
                         scratch + L.mat(g, b), T, L.TT, H, dt);
  MTNLG_LAUNCH(row_blocks(rows), kThreads, 0, stream(), causal_softmax_backward_kernel<V>)(scratch, probs, rows, g, dr);
  MTNLG_CUDA_LAUNCH_CHECK("causal_softmax_backward_kernel");
  for (int64_t b = 0; b < g.B; ++b) {
    // dQ_cm [D, T_i] = K_cm dS_cm ; dK_cm [D, T_j] = Q_cm dS_cm^T
    gemm_strided_batched(false, false, D, T, T, 1.0f, qkv + L.qkv(g, b, 1), L.row, 3 * D, scratch + L.mat(g, b), T, L.TT,
                         dqkv + L.qkv(g, b, 0), L.row, 3 * D, H, dt);
    gemm_strided_batched(false, true, D, T, T, 1.0f, qkv + L.qkv(g, b, 0), L.row, 3 * D, scratch + L.mat(g, b), T, L.TT,
                         dqkv + L.qkv(g, b, 1), L.row, 3 * D, H, dt);
  }
}

}  // namespace

void attention_unfused_forward(void* out, void* probs, void* dropped, const void* qkv, DType dt, int64_t B, int64_t T,
                               int64_t H, int64_t D, const ops::AttentionDropout& drop) {
  if (B * T * H == 0) return;
  const Geometry g = unfused_geometry(B, T, H, D);
  const Drop dr = make_drop(drop, H);
  MTNLG_DT_SWITCH(dt, V,
                  unfused_forward<V>(static_cast<V*>(out), static_cast<V*>(probs), static_cast<V*>(dropped),
                                     static_cast<const V*>(qkv), g, dr, dt));
}

void attention_unfused_backward(void* dqkv, const void* dout, const void* qkv, const void* probs, void* scratch,
                                DType dt, int64_t B, int64_t T, int64_t H, int64_t D,
                                const ops::AttentionDropout& drop) {
  if (B * T * H == 0) return;
  const Geometry g = unfused_geometry(B, T, H, D);
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

template <typename T>
__global__ void kv_append_kernel(T* k_cache, T* v_cache, const T* qkv, int64_t B, int64_t Tn, int64_t H, int64_t D,
                                 int64_t cap, int64_t past) {
  const int64_t n = B * Tn * H * D;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, h = (e / D) % H, i = (e / (D * H)) % Tn, b = e / (D * H * Tn);
    const T* src = qkv + (b * Tn + i) * H * 3 * D + h * 3 * D;
    const int64_t dst = ((b * H + h) * cap + past + i) * D + d;
    k_cache[dst] = src[D + d];
    v_cache[dst] = src[2 * D + d];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attn_cached_kernel(T* out, const T* k_cache, const T* v_cache, const T* qkv, int64_t Tn, int64_t H, int64_t D,
                       int64_t cap, int64_t past, float scale) {
  __shared__ float q_sh[kAttnMaxHeadDim];
  __shared__ float m_sh[kWarps], l_sh[kWarps];
  __shared__ float o_sh[kWarps][kAttnMaxHeadDim];
  const int64_t r = blockIdx.x, h = r % H, i = (r / H) % Tn, b = r / (H * Tn);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* q = qkv + (b * Tn + i) * H * 3 * D + h * 3 * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) q_sh[d] = to_f(q[d]);
  __syncthreads();
  const T* kc = k_cache + (b * H + h) * cap * D;
  const T* vc = v_cache + (b * H + h) * cap * D;
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
                              int64_t H, int64_t D, int64_t capacity, int64_t past) {
  if (B * T * H * D == 0) return;
  if (D > kAttnMaxHeadDim) fail("attention_cached_forward: head size above the kernel's limit");
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  MTNLG_DT_SWITCH(dt, V, {
    MTNLG_LAUNCH(grid_for(B * T * H * D, 256), 256, 0, stream(), kv_append_kernel<V>)(
        static_cast<V*>(k_cache), static_cast<V*>(v_cache), static_cast<const V*>(qkv), B, T, H, D, capacity, past);
    MTNLG_CUDA_LAUNCH_CHECK("kv_append_kernel");
    MTNLG_LAUNCH(static_cast<unsigned>(B * T * H), kThreads, 0, stream(), attn_cached_kernel<V>)(
        static_cast<V*>(out), static_cast<const V*>(k_cache), static_cast<const V*>(v_cache),
        static_cast<const V*>(qkv), T, H, D, capacity, past, scale);
    MTNLG_CUDA_LAUNCH_CHECK("attn_cached_kernel");
  });
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

namespace {
// `limited`: the kernel keeps a head in registers / shared memory (flash and KV-cache
// forms); the unfused form's GEMMs take any head size.
void attn_shape(const char* op, const Tensor& qkv, int64_t heads, int64_t& B, int64_t& T, int64_t& D,
                bool limited = true) {
  B = qkv.dim(0);
  T = qkv.dim(1);
  D = qkv.dim(2) / (3 * heads);
  if (limited && D > kAttnMaxHeadDim)
    throw_runtime("{}: head size {} exceeds the CUDA kernel's limit of {}", op, D, kAttnMaxHeadDim);
}
}  // namespace

void attention_forward_lse(Tensor& out, Tensor& lse, const Tensor& qkv, int64_t heads, const ops::AttentionDropout& drop) {
  const char* op = "attention_forward_lse";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  int64_t B, T, D;
  attn_shape(op, qkv, heads, B, T, D);
  k::attention_forward(out.raw(), f(lse), qkv.raw(), dt, B, T, heads, D, drop);
}

void attention_backward_lse(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                            int64_t heads, const ops::AttentionDropout& drop) {
  const char* op = "attention_backward_lse";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  if (!out.defined()) throw_runtime("{}: the CUDA backward needs the forward's out", op);
  int64_t B, T, D;
  attn_shape(op, qkv, heads, B, T, D);
  k::attention_backward(dqkv.raw(), dout.raw(), qkv.raw(), out.raw(), f(lse), dt, B, T, heads, D, drop);
}

void attention_forward(Tensor& out, Tensor& probs, const Tensor& qkv, int64_t heads,
                             const ops::AttentionDropout& drop) {
  const char* op = "attention_forward";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  int64_t B, T, D;
  attn_shape(op, qkv, heads, B, T, D, /*limited=*/false);
  Tensor dropped;  // P' for the P V product, only when dropout is on
  if (drop.p > 0) dropped = Tensor::empty(probs.shape(), probs.dtype(), probs.device());
  k::attention_unfused_forward(out.raw(), probs.raw(), dropped.defined() ? dropped.raw() : nullptr, qkv.raw(), dt, B, T,
                               heads, D, drop);
}

void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& probs, int64_t heads,
                              const ops::AttentionDropout& drop) {
  const char* op = "attention_backward";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  int64_t B, T, D;
  attn_shape(op, qkv, heads, B, T, D, /*limited=*/false);
  Tensor scratch = Tensor::empty(probs.shape(), probs.dtype(), probs.device());  // P', then dP and dS in place
  k::attention_unfused_backward(dqkv.raw(), dout.raw(), qkv.raw(), probs.raw(), scratch.raw(), dt, B, T, heads, D, drop);
}

void attention_cached_forward(Tensor& out, Tensor& k_cache, Tensor& v_cache, const Tensor& qkv, int64_t heads,
                              int64_t past) {
  const char* op = "attention_cached_forward";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  int64_t B, T, D;
  attn_shape(op, qkv, heads, B, T, D);
  if (B * T * heads > INT32_MAX) throw_runtime("{}: batch x positions x heads exceeds the kernel's grid", op);
  k::attention_cached_forward(out.raw(), k_cache.raw(), v_cache.raw(), qkv.raw(), dt, B, T, heads, D, k_cache.dim(2),
                              past);
}

}  // namespace mtnlg::cuda
