// LayerNorm forward/backward. CPU reference: core/ops/layernorm.cpp.
//
// Gradient contract: dinp WRITTEN (or += with accumulate_dinp, used for the residual
// stream), dw and db ACCUMULATE (fp32). mean and rstd are saved in fp32 whatever the
// activation dtype.
//
// Forward (optionally with the residual add before it: add_layernorm_forward) and dinp:
// one warp per row, two passes over the row (mean, then the
// variance of the deviations, as the CPU does, which avoids E[x^2]-E[x]^2
// cancellation); rows are short enough (C <= a few 10^4) that the re-reads hit L1/L2.
// dw/db: deterministic two-stage column sums over fixed 256-row chunks (no atomics).
#include "core/cuda/common.cuh"

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;  // 8 warps = 8 rows per block
constexpr int kRowsPerBlock = kThreads / 32;
constexpr int64_t kRowChunk = 256;

// With `res_a` and `res_b`, the input row is their sum, stored into `inp` (rounded to T)
// by the first pass; the LayerNorm then reads the stored sum, as add() then this kernel
// would (the same bits; each lane re-reads only the elements it wrote).
template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, T* inp, const T* w, const T* b, int64_t N,
                                         int64_t C, float eps, const T* res_a, const T* res_b) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= N) return;
  T* x = inp + row * C;
  float s = 0;
  if (res_a) {
    for (int64_t c = lane; c < C; c += 32) {
      x[c] = from_f<T>(to_f(res_a[row * C + c]) + to_f(res_b[row * C + c]));
      s += to_f(x[c]);
    }
  } else {
    for (int64_t c = lane; c < C; c += 32) s += to_f(x[c]);
  }
  const float m = warp_sum(s) / static_cast<float>(C);
  float v = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = to_f(x[c]) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  T* y = out + row * C;
  for (int64_t c = lane; c < C; c += 32) y[c] = from_f<T>((to_f(x[c]) - m) * r * to_f(w[c]) + to_f(b[c]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

template <typename T>
__global__ void layernorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* w, const float* mean, const float* rstd,
                                      int64_t N, int64_t C, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= N) return;
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  const float m = mean[row], r = rstd[row];
  float a = 0, an = 0;  // sums of dnorm and dnorm*norm
  for (int64_t c = lane; c < C; c += 32) {
    const float norm = (to_f(x[c]) - m) * r;
    const float dnorm = __fmul_rn(to_f(w[c]), to_f(dy[c]));  // rounded, never fused into what follows (below)
    a += dnorm;
    an += dnorm * norm;
  }
  // dnorm is the same rounded product in both loops: nvcc would otherwise contract the
  // second loop's dnorm - dnorm_mean into an FMA with the exact product, leaving the
  // product's rounding error times rstd where the true value is 0 (a row of one element:
  // -4.5e-6 with rstd = 1/sqrt(eps) on an H200, exactly 0 on the CPU).
  const float dnorm_mean = warp_sum(a) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(an) / static_cast<float>(C);
  T* dx = dinp + row * C;
  for (int64_t c = lane; c < C; c += 32) {
    const float norm = (to_f(x[c]) - m) * r;
    const float dnorm = __fmul_rn(to_f(w[c]), to_f(dy[c]));  // rounded, never fused into what follows (below)
    float g = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
    if (accumulate) g += to_f(dx[c]);
    dx[c] = from_f<T>(g);
  }
}

template <typename T>
__global__ void layernorm_dwdb_partial_kernel(float* pw, float* pb, const T* dout, const T* inp, const float* mean,
                                              const float* rstd, int64_t N, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  for (int64_t chunk = blockIdx.y; chunk * kRowChunk < N; chunk += gridDim.y) {
    const int64_t r1 = (N < (chunk + 1) * kRowChunk ? N : (chunk + 1) * kRowChunk);
    float aw = 0, ab = 0;
    for (int64_t i = chunk * kRowChunk; i < r1; ++i) {
      const float dy = to_f(dout[i * C + c]);
      aw += (to_f(inp[i * C + c]) - mean[i]) * rstd[i] * dy;
      ab += dy;
    }
    pw[chunk * C + c] = aw;
    pb[chunk * C + c] = ab;
  }
}

__global__ void layernorm_dwdb_final_kernel(float* dw, float* db, const float* pw, const float* pb, int64_t chunks,
                                            int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float aw = 0, ab = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    aw += pw[k * C + c];
    ab += pb[k * C + c];
  }
  dw[c] += aw;
  db[c] += ab;
}

unsigned row_blocks(int64_t N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b, DType dt, int64_t N,
                       int64_t C, double eps) {
  if (N <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(row_blocks(N), kThreads, 0, stream(), layernorm_forward_kernel<T>)(
                      static_cast<T*>(out), mean, rstd, static_cast<T*>(const_cast<void*>(inp)),
                      static_cast<const T*>(w), static_cast<const T*>(b), N, C, static_cast<float>(eps), nullptr,
                      nullptr));
  MTNLG_CUDA_LAUNCH_CHECK("layernorm_forward_kernel");
}

void add_layernorm_forward(void* sum, void* out, float* mean, float* rstd, const void* a, const void* b, const void* w,
                           const void* bias, DType dt, int64_t N, int64_t C, double eps) {
  if (N <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(row_blocks(N), kThreads, 0, stream(), layernorm_forward_kernel<T>)(
                      static_cast<T*>(out), mean, rstd, static_cast<T*>(sum), static_cast<const T*>(w),
                      static_cast<const T*>(bias), N, C, static_cast<float>(eps), static_cast<const T*>(a),
                      static_cast<const T*>(b)));
  MTNLG_CUDA_LAUNCH_CHECK("layernorm_forward_kernel (residual)");
}

void layernorm_backward(void* dinp, float* dw, float* db, const void* dout, const void* inp, const void* w,
                        const float* mean, const float* rstd, DType dt, int64_t N, int64_t C, bool accumulate_dinp) {
  if (N <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(row_blocks(N), kThreads, 0, stream(), layernorm_dinp_kernel<T>)(
                      static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp),
                      static_cast<const T*>(w), mean, rstd, N, C, accumulate_dinp));
  MTNLG_CUDA_LAUNCH_CHECK("layernorm_dinp_kernel");
  const int64_t chunks = (N + kRowChunk - 1) / kRowChunk;
  DeviceBuffer<float> partial(2 * chunks * C);
  const unsigned cb = col_blocks(C, kThreads);
  const dim3 grid(cb, static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid, kThreads, 0, stream(), layernorm_dwdb_partial_kernel<T>)(
                      partial.data(), partial.data() + chunks * C, static_cast<const T*>(dout),
                      static_cast<const T*>(inp), mean, rstd, N, C));
  MTNLG_CUDA_LAUNCH_CHECK("layernorm_dwdb_partial_kernel");
  MTNLG_LAUNCH(cb, kThreads, 0, stream(), layernorm_dwdb_final_kernel)(dw, db, partial.data(), partial.data() + chunks * C, chunks, C);
  MTNLG_CUDA_LAUNCH_CHECK("layernorm_dwdb_final_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp, const Tensor& w, const Tensor& b,
                       double eps) {
  const char* op = "layernorm_forward";
  const DType dt = cuda_dtype(op, "out", out.dtype());
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  k::layernorm_forward(out.raw(), f(mean), f(rstd), inp.raw(), w.raw(), b.raw(), dt, N, C, eps);
}

void add_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a, const Tensor& b,
                           const Tensor& w, const Tensor& bias, double eps) {
  const DType dt = cuda_dtype("add_layernorm_forward", "out", out.dtype());
  const int64_t C = w.numel(), N = C ? sum.numel() / C : 0;
  k::add_layernorm_forward(sum.raw(), out.raw(), f(mean), f(rstd), a.raw(), b.raw(), w.raw(), bias.raw(), dt, N, C, eps);
}

void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dinp) {
  const char* op = "layernorm_backward";
  const DType dt = cuda_dtype(op, "dinp", dinp.dtype());
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  k::layernorm_backward(dinp.raw(), f(dw), f(db), dout.raw(), inp.raw(), w.raw(), f(mean), f(rstd), dt, N, C,
                        accumulate_dinp);
}

}  // namespace mtnlg::cuda
