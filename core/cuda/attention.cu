// Fused causal self-attention, forward and backward, flash-attention style: the
// [T,T] score matrix is never written to HBM. CPU reference: core/cpu/ops_cpu.cpp
// (attention_forward, attention_backward) via ops::attention_forward_lse /
// attention_backward_lse (core/ops_attention.cpp), which save the per-row log-sum-exp
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
  extern __shared__ float sm[];
  const int D = static_cast<int>(g.D), ldk = D + 1;
  float* Qs = sm;                      // [16][D]
  float* Ks = Qs + kBlockRows * D;     // [32][D+1]
  float* Vs = Ks + kTile * ldk;        // [32][D]
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t bh = blockIdx.y, b = bh / g.H, h = bh % g.H;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;

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
template <typename T>
__global__ void attn_delta_kernel(float* delta, const T* dout, const T* out, Geometry g) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;  // (b, h, i) flattened as bh*T + i
  if (row >= g.B * g.H * g.T) return;
  const int64_t bh = row / g.T, i = row % g.T, b = bh / g.H, h = bh % g.H;
  const int64_t off = (b * g.T + i) * g.H * g.D + h * g.D;
  float s = 0;
  for (int64_t d = lane; d < g.D; d += 32) s += to_f(dout[off + d]) * to_f(out[off + d]);
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attn_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* delta, Geometry g, Drop dr) {
  extern __shared__ float sm[];
  const int D = static_cast<int>(g.D), ld = D + 1;
  float* Qs = sm;                      // [16][D]
  float* dOs = Qs + kBlockRows * D;    // [16][D]
  float* Ks = dOs + kBlockRows * D;    // [32][D+1]
  float* Vs = Ks + kTile * ld;         // [32][D+1]
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t bh = blockIdx.y, b = bh / g.H, h = bh % g.H;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;

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
  extern __shared__ float sm[];
  const int D = static_cast<int>(g.D), ld = D + 1;
  float* Ks = sm;                     // [16][D]
  float* Vs = Ks + kBlockRows * D;    // [16][D]
  float* Qs = Vs + kBlockRows * D;    // [32][D+1]
  float* dOs = Qs + kTile * ld;       // [32][D+1]
  float* lse_s = dOs + kTile * ld;    // [32]
  float* del_s = lse_s + kTile;       // [32]
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t bh = blockIdx.y, b = bh / g.H, h = bh % g.H;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;

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

Drop make_drop(const AttnDropout& d, int64_t H) {
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

dim3 tiles(const Geometry& g) {
  return dim3(static_cast<unsigned>((g.T + kBlockRows - 1) / kBlockRows), static_cast<unsigned>(g.B * g.H));
}

}  // namespace

void attention_forward(void* out, float* lse, const void* qkv, Dt dt, int64_t B, int64_t T, int64_t H, int64_t D,
                       const AttnDropout& drop) {
  if (B * T * H == 0) return;
  const Geometry g = geometry(B, T, H, D);
  const Drop dr = make_drop(drop, H);
  const size_t smem = sizeof(float) * static_cast<size_t>(kBlockRows * D + kTile * (D + 1) + kTile * D);
  MTNLG_DT_SWITCH(dt, V, {
    set_smem(attn_forward_kernel<V>, smem);
    attn_forward_kernel<V><<<tiles(g), kThreads, smem, stream()>>>(static_cast<V*>(out), lse,
                                                                   static_cast<const V*>(qkv), g, dr);
  });
  MTNLG_CUDA_LAUNCH_CHECK("attn_forward_kernel");
}

void attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse, Dt dt, int64_t B,
                        int64_t T, int64_t H, int64_t D, const AttnDropout& drop) {
  if (B * T * H == 0) return;
  const Geometry g = geometry(B, T, H, D);
  const Drop dr = make_drop(drop, H);
  DeviceBuffer<float> delta(B * H * T);
  const size_t smem_dq = sizeof(float) * static_cast<size_t>(2 * kBlockRows * D + 2 * kTile * (D + 1));
  const size_t smem_dkv = sizeof(float) * static_cast<size_t>(2 * kBlockRows * D + 2 * kTile * (D + 1) + 2 * kTile);
  const unsigned delta_blocks = static_cast<unsigned>((B * H * T + 7) / 8);
  MTNLG_DT_SWITCH(dt, V, {
    attn_delta_kernel<V><<<delta_blocks, 256, 0, stream()>>>(delta.data(), static_cast<const V*>(dout),
                                                            static_cast<const V*>(out), g);
    MTNLG_CUDA_LAUNCH_CHECK("attn_delta_kernel");
    set_smem(attn_dq_kernel<V>, smem_dq);
    attn_dq_kernel<V><<<tiles(g), kThreads, smem_dq, stream()>>>(static_cast<V*>(dqkv), static_cast<const V*>(dout),
                                                                static_cast<const V*>(qkv), lse, delta.data(), g, dr);
    MTNLG_CUDA_LAUNCH_CHECK("attn_dq_kernel");
    set_smem(attn_dkv_kernel<V>, smem_dkv);
    attn_dkv_kernel<V><<<tiles(g), kThreads, smem_dkv, stream()>>>(static_cast<V*>(dqkv), static_cast<const V*>(dout),
                                                                  static_cast<const V*>(qkv), lse, delta.data(), g, dr);
  });
  MTNLG_CUDA_LAUNCH_CHECK("attn_dkv_kernel");
}

}  // namespace mtnlg::cuda::k
