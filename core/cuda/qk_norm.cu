// Per-head query/key RMSNorm on CUDA (Qwen3's q_norm / k_norm), in place on the packed
// qkv after a copy when the output is another tensor. CPU reference: core/ops/qk_norm.cpp,
// which states the formulas.
//
// Gradient contract: dqkv WRITTEN (may alias dout), dwq and dwk ACCUMULATE (fp32); rstd
// saved in fp32.
// Forward and dx: one warp per normalised head (a row's G*(H/G+1) query and key heads),
// the sums in fp32 over the warp. dwq/dwk: deterministic two-stage column sums (no
// atomics): a thread per (weight, column) sums the heads of a fixed chunk of rows, then
// the chunks are added in order; they run before dx, which overwrites dout in place.
#include "core/cuda/common.cuh"

namespace mtnlg::cuda::k {

struct QkGeom {
  int64_t N, G, Q, D;                                                // rows, groups, query heads per group, head size
  __host__ __device__ int64_t heads() const { return G * (Q + 1); }  // normalised heads per row
  __host__ __device__ int64_t row() const { return G * (Q + 2) * D; }
  // element offset of normalised head h (< heads()) of row r, and whether it is a key
  __device__ int64_t at(int64_t r, int64_t h, bool& key) const {
    const int64_t g = h / (Q + 1), blk = h % (Q + 1);
    key = blk == Q;
    return r * row() + (g * (Q + 2) + blk) * D;
  }
};

namespace {

constexpr int kThreads = 256;  // 8 warps = 8 heads per block
constexpr int kWarps = kThreads / 32;
constexpr int64_t kRowChunk = 64;


template <typename T>
__global__ void qk_norm_forward_kernel(T* x, float* rstd, const T* wq, const T* wk, QkGeom s, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t id = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  if (id >= s.N * s.heads()) return;
  bool key = false;
  T* h = x + s.at(id / s.heads(), id % s.heads(), key);
  const T* w = key ? wk : wq;
  float v = 0;
  for (int64_t d = lane; d < s.D; d += 32) v += to_f(h[d]) * to_f(h[d]);
  const float r = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(s.D) + eps);
  for (int64_t d = lane; d < s.D; d += 32) h[d] = from_f<T>(to_f(h[d]) * r * to_f(w[d]));
  if (lane == 0) rstd[id] = r;
}

// dy is the incoming gradient, overwritten by dx (v's columns are not touched).
template <typename T>
__global__ void qk_norm_dx_kernel(T* dy, const T* x, const float* rstd, const T* wq, const T* wk, QkGeom s) {
  const int lane = threadIdx.x & 31;
  const int64_t id = blockIdx.x * int64_t(kWarps) + threadIdx.x / 32;
  if (id >= s.N * s.heads()) return;
  bool key = false;
  const int64_t e = s.at(id / s.heads(), id % s.heads(), key);
  const T* w = key ? wk : wq;
  const float r = rstd[id];
  float a = 0;
  for (int64_t d = lane; d < s.D; d += 32) a += __fmul_rn(to_f(w[d]), to_f(dy[e + d])) * to_f(x[e + d]) * r;
  const float m = warp_sum(a) / static_cast<float>(s.D);
  for (int64_t d = lane; d < s.D; d += 32) {
    const float g = __fmul_rn(to_f(w[d]), to_f(dy[e + d]));
    dy[e + d] = from_f<T>(r * (g - to_f(x[e + d]) * r * m));
  }
}

// Column c < 2D of the pair (wq's D columns, then wk's): chunk's sum of dy * xhat.
template <typename T>
__global__ void qk_norm_dw_partial_kernel(float* part, const T* dy, const T* x, const float* rstd, QkGeom s) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= 2 * s.D) return;
  const bool key = c >= s.D;
  const int64_t d = key ? c - s.D : c;
  for (int64_t chunk = blockIdx.y; chunk * kRowChunk < s.N; chunk += gridDim.y) {
    const int64_t r1 = s.N < (chunk + 1) * kRowChunk ? s.N : (chunk + 1) * kRowChunk;
    float acc = 0;
    for (int64_t r = chunk * kRowChunk; r < r1; ++r)
      for (int64_t g = 0; g < s.G; ++g)
        for (int64_t blk = key ? s.Q : 0; blk < (key ? s.Q + 1 : s.Q); ++blk) {
          const int64_t e = r * s.row() + (g * (s.Q + 2) + blk) * s.D + d;
          acc += to_f(dy[e]) * to_f(x[e]) * rstd[r * s.heads() + g * (s.Q + 1) + blk];
        }
    part[chunk * 2 * s.D + c] = acc;
  }
}

__global__ void qk_norm_dw_final_kernel(float* dwq, float* dwk, const float* part, int64_t chunks, int64_t D) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= 2 * D) return;
  float acc = 0;
  for (int64_t k = 0; k < chunks; ++k) acc += part[k * 2 * D + c];
  if (c < D)
    dwq[c] += acc;
  else
    dwk[c - D] += acc;
}

unsigned head_blocks(const QkGeom& s) { return static_cast<unsigned>((s.N * s.heads() + kWarps - 1) / kWarps); }

}  // namespace

void qk_norm_forward(void* x, float* rstd, const void* wq, const void* wk, DType dt, const QkGeom& s, double eps) {
  if (s.N <= 0) return;
  MTNLG_DT_SWITCH(
      dt, T,
      MTNLG_LAUNCH(head_blocks(s), kThreads, 0, stream(), qk_norm_forward_kernel<T>)(
          static_cast<T*>(x), rstd, static_cast<const T*>(wq), static_cast<const T*>(wk), s, static_cast<float>(eps)));
  MTNLG_CUDA_LAUNCH_CHECK("qk_norm_forward_kernel");
}

void qk_norm_backward(void* dy, float* dwq, float* dwk, const void* x, const void* wq, const void* wk,
                      const float* rstd, DType dt, const QkGeom& s) {
  if (s.N <= 0) return;
  const int64_t chunks = (s.N + kRowChunk - 1) / kRowChunk;
  DeviceBuffer<float> part(chunks * 2 * s.D);
  const unsigned cb = col_blocks(2 * s.D, kThreads);
  const dim3 grid(cb, static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid, kThreads, 0, stream(), qk_norm_dw_partial_kernel<T>)(
                      part.data(), static_cast<const T*>(dy), static_cast<const T*>(x), rstd, s));
  MTNLG_CUDA_LAUNCH_CHECK("qk_norm_dw_partial_kernel");
  MTNLG_LAUNCH(cb, kThreads, 0, stream(), qk_norm_dw_final_kernel)(dwq, dwk, part.data(), chunks, s.D);
  MTNLG_CUDA_LAUNCH_CHECK("qk_norm_dw_final_kernel");
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(head_blocks(s), kThreads, 0, stream(), qk_norm_dx_kernel<T>)(
                      static_cast<T*>(dy), static_cast<const T*>(x), rstd, static_cast<const T*>(wq),
                      static_cast<const T*>(wk), s));
  MTNLG_CUDA_LAUNCH_CHECK("qk_norm_dx_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

namespace {
k::QkGeom geom(const char* op, const Tensor& qkv, int64_t heads, int64_t groups) {
  const op_checks::QkvShape s = op_checks::qkv_shape(op, qkv, heads, groups);
  return {s.B * s.T, s.G, s.per_group(), s.D};
}
}  // namespace

void qk_norm_forward(Tensor& out, Tensor& rstd, const Tensor& qkv, const Tensor& wq, const Tensor& wk, int64_t heads,
                     int64_t groups, double eps) {
  const char* op = "qk_norm_forward";
  const DType dt = cuda_dtype(op, "qkv", qkv.dtype());
  need_f32(op, "rstd", &rstd);
  const k::QkGeom s = geom(op, qkv, heads, groups);
  if (out.raw() != qkv.raw()) copy(out, qkv);
  k::qk_norm_forward(out.raw(), f(rstd), wq.raw(), wk.raw(), dt, s, eps);
}

void qk_norm_backward(Tensor& dqkv, Tensor& dwq, Tensor& dwk, const Tensor& dout, const Tensor& qkv, const Tensor& wq,
                      const Tensor& wk, const Tensor& rstd, int64_t heads, int64_t groups) {
  const char* op = "qk_norm_backward";
  const DType dt = cuda_dtype(op, "dqkv", dqkv.dtype());
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"dwq", &dwq}, {"dwk", &dwk}, {"rstd", &rstd}})
    need_f32(op, name, t);
  const k::QkGeom s = geom(op, qkv, heads, groups);
  if (dqkv.raw() != dout.raw()) copy(dqkv, dout);  // then in place: dv is dout's
  k::qk_norm_backward(dqkv.raw(), f(dwq), f(dwk), qkv.raw(), wq.raw(), wk.raw(), f(rstd), dt, s);
}

}  // namespace mtnlg::cuda
