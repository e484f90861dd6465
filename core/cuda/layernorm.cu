// LayerNorm and RMSNorm forward/backward and the residual-stream forms. CPU reference:
// core/ops/layernorm.cpp.
//
// Gradient contract: dinp WRITTEN (or, with a residual gradient dres, dres + the
// norm's gradient: the residual stream's backward, dres may be dinp), dw and db
// ACCUMULATE (fp32). mean and rstd are saved in fp32 whatever the activation dtype.
//
// RMSNorm runs the same kernels with mean null: the mean taken as 0 (the second pass
// then sums x^2), no bias, no dnorm_mean term, no db; the LayerNorm's arithmetic is
// unchanged.
//
// Forward (optionally with the residual branch before it: the branch's bias, hidden
// dropout and the residual add, residual_layernorm_forward) and dinp: one warp per row,
// two passes over the row (mean, then the variance of the deviations, as the CPU does,
// which avoids E[x^2]-E[x]^2 cancellation); rows are short enough (C <= a few 10^4)
// that the re-reads hit L1/L2.
// dw/db: deterministic two-stage column sums over fixed 256-row chunks (no atomics).
#include "core/cuda/common.cuh"
#include "core/rng.hpp"

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;  // 8 warps = 8 rows per block
constexpr int kRowsPerBlock = kThreads / 32;
constexpr int64_t kRowChunk = 256;

// The residual branch that joins the stream before the LayerNorm: the row's input is
// sum = x + dropout(branch + bias) (bias optional, no dropout when p <= 0), each step
// rounded to T as bias_add_forward, dropout_forward and add() store it (the dropout
// product through __fmul_rn so that nvcc cannot contract it with the add into an FMA:
// the CPU rounds it first).
template <typename T>
struct Residual {
  const T* x = nullptr;  // null: the kernel reads its input as it is
  const T* branch = nullptr;
  const T* bias = nullptr;
  float p = 0, scale = 1;
  uint64_t key = 0, base = 0;
  DeviceKey dkey;  // key and base from device memory when set
};

// With a residual, the first pass stores the sum into `inp` (rounded to T); the LayerNorm
// then reads the stored sum, as the separate ops would (the same bits; each lane re-reads
// only the elements it wrote). out null: the sum only (residual_add_forward). mean null
// (with out): an RMSNorm, b unused.
template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, T* inp, const T* w, const T* b, int64_t N,
                                         int64_t C, float eps, Residual<T> res) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= N) return;
  T* x = inp + row * C;
  float s = 0;
  if (res.x) {
    const uint64_t key = res.dkey.key(res.key), base = res.dkey.offset(res.base);
    for (int64_t c = lane; c < C; c += 32) {
      const int64_t e = row * C + c;
      T v = res.branch[e];
      if (res.bias) v = from_f<T>(to_f(v) + to_f(res.bias[c]));
      if (res.p > 0)
        v = philox_uniform(key, 0, base + static_cast<uint64_t>(e)) >= res.p ? from_f<T>(__fmul_rn(to_f(v), res.scale))
                                                                             : from_f<T>(0.0f);
      x[c] = from_f<T>(to_f(res.x[e]) + to_f(v));
      s += to_f(x[c]);
    }
  } else if (mean) {  // an RMSNorm needs no mean
    for (int64_t c = lane; c < C; c += 32) s += to_f(x[c]);
  }
  if (!out) return;                  // uniform over the grid: no lane is left in a warp_sum
  const bool rms = mean == nullptr;  // uniform too
  const float m = rms ? 0.0f : warp_sum(s) / static_cast<float>(C);
  float v = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float d = to_f(x[c]) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(C) + eps);
  T* y = out + row * C;
  if (rms)
    for (int64_t c = lane; c < C; c += 32) y[c] = from_f<T>(to_f(x[c]) * r * to_f(w[c]));
  else
    for (int64_t c = lane; c < C; c += 32) y[c] = from_f<T>((to_f(x[c]) - m) * r * to_f(w[c]) + to_f(b[c]));
  if (lane == 0) {
    if (!rms) mean[row] = m;
    rstd[row] = r;
  }
}

template <typename T>
__global__ void layernorm_dinp_kernel(T* dinp, const T* dres, const T* dout, const T* inp, const T* w,
                                      const float* mean, const float* rstd, int64_t N, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kRowsPerBlock) + threadIdx.x / 32;
  if (row >= N) return;
  const T* x = inp + row * C;
  const T* dy = dout + row * C;
  const float m = mean ? mean[row] : 0.0f, r = rstd[row];  // mean null: an RMSNorm
  float a = 0, an = 0;                                     // sums of dnorm and dnorm*norm
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
  const float dnorm_mean = mean ? warp_sum(a) / static_cast<float>(C) : 0.0f;
  const float dnorm_norm_mean = warp_sum(an) / static_cast<float>(C);
  T* dx = dinp + row * C;
  const T* dr = dres ? dres + row * C : nullptr;
  for (int64_t c = lane; c < C; c += 32) {
    const float norm = (to_f(x[c]) - m) * r;
    const float dnorm = __fmul_rn(to_f(w[c]), to_f(dy[c]));  // rounded, never fused into what follows (below)
    float g = (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
    if (dr) g += to_f(dr[c]);
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
      aw += (to_f(inp[i * C + c]) - (mean ? mean[i] : 0.0f)) * rstd[i] * dy;
      ab += dy;
    }
    pw[chunk * C + c] = aw;
    if (pb) pb[chunk * C + c] = ab;
  }
}

__global__ void layernorm_dwdb_final_kernel(float* dw, float* db, const float* pw, const float* pb, int64_t chunks,
                                            int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float aw = 0, ab = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    aw += pw[k * C + c];
    if (pb) ab += pb[k * C + c];
  }
  dw[c] += aw;
  if (db) db[c] += ab;
}

unsigned row_blocks(int64_t N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b, DType dt,
                       int64_t N, int64_t C, double eps) {
  if (N <= 0) return;
  MTNLG_DT_SWITCH(
      dt, T,
      MTNLG_LAUNCH(row_blocks(N), kThreads, 0, stream(), layernorm_forward_kernel<T>)(
          static_cast<T*>(out), mean, rstd, static_cast<T*>(const_cast<void*>(inp)), static_cast<const T*>(w),
          static_cast<const T*>(b), N, C, static_cast<float>(eps), Residual<T>{}));
  MTNLG_CUDA_LAUNCH_CHECK("layernorm_forward_kernel");
}

// out null: the residual sum only. bias null: no bias; p <= 0: no dropout.
void residual_layernorm_forward(void* sum, void* out, float* mean, float* rstd, const void* x, const void* branch,
                                const void* bias, double p, uint64_t key, uint64_t base, const DeviceKey& dkey,
                                const void* w, const void* b, DType dt, int64_t N, int64_t C, double eps) {
  if (N <= 0) return;
  const float fp = p > 0 ? static_cast<float>(p) : 0.0f;
  const float scale = p > 0 ? static_cast<float>(1.0 / (1.0 - p)) : 1.0f;  // as dropout_forward rounds them
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(row_blocks(N), kThreads, 0, stream(), layernorm_forward_kernel<T>)(
                      static_cast<T*>(out), mean, rstd, static_cast<T*>(sum), static_cast<const T*>(w),
                      static_cast<const T*>(b), N, C, static_cast<float>(eps),
                      Residual<T>{static_cast<const T*>(x), static_cast<const T*>(branch), static_cast<const T*>(bias),
                                  fp, scale, key, base, dkey}));
  MTNLG_CUDA_LAUNCH_CHECK("layernorm_forward_kernel (residual)");
}

// dres null: dinp written; else dinp = dres + the norm's gradient. mean and db null: an
// RMSNorm.
void layernorm_backward(void* dinp, const void* dres, float* dw, float* db, const void* dout, const void* inp,
                        const void* w, const float* mean, const float* rstd, DType dt, int64_t N, int64_t C) {
  if (N <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(row_blocks(N), kThreads, 0, stream(), layernorm_dinp_kernel<T>)(
                      static_cast<T*>(dinp), static_cast<const T*>(dres), static_cast<const T*>(dout),
                      static_cast<const T*>(inp), static_cast<const T*>(w), mean, rstd, N, C));
  MTNLG_CUDA_LAUNCH_CHECK("layernorm_dinp_kernel");
  const int64_t chunks = (N + kRowChunk - 1) / kRowChunk;
  DeviceBuffer<float> partial((db ? 2 : 1) * chunks * C);
  const unsigned cb = col_blocks(C, kThreads);
  const dim3 grid(cb, static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(grid, kThreads, 0, stream(), layernorm_dwdb_partial_kernel<T>)(
                      partial.data(), db ? partial.data() + chunks * C : nullptr, static_cast<const T*>(dout),
                      static_cast<const T*>(inp), mean, rstd, N, C));
  MTNLG_CUDA_LAUNCH_CHECK("layernorm_dwdb_partial_kernel");
  MTNLG_LAUNCH(cb, kThreads, 0, stream(), layernorm_dwdb_final_kernel)
  (dw, db, partial.data(), db ? partial.data() + chunks * C : nullptr, chunks, C);
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

void residual_layernorm_forward(Tensor& sum, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x,
                                const Tensor& branch, const ops::ResidualBranch& br, const Tensor& w, const Tensor& b,
                                double eps) {
  const DType dt = cuda_dtype("residual_layernorm_forward", "out", out.dtype());
  const int64_t C = w.numel(), N = C ? sum.numel() / C : 0;
  k::residual_layernorm_forward(sum.raw(), out.raw(), f(mean), f(rstd), x.raw(), branch.raw(), p(br.bias), br.p, br.key,
                                br.base_index, br.dkey, w.raw(), b.raw(), dt, N, C, eps);
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& w, double eps) {
  const DType dt = cuda_dtype("rmsnorm_forward", "out", out.dtype());
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  k::layernorm_forward(out.raw(), nullptr, f(rstd), inp.raw(), w.raw(), nullptr, dt, N, C, eps);
}

void residual_rmsnorm_forward(Tensor& sum, Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& branch,
                              const ops::ResidualBranch& br, const Tensor& w, double eps) {
  const DType dt = cuda_dtype("residual_rmsnorm_forward", "out", out.dtype());
  const int64_t C = w.numel(), N = C ? sum.numel() / C : 0;
  k::residual_layernorm_forward(sum.raw(), out.raw(), nullptr, f(rstd), x.raw(), branch.raw(), p(br.bias), br.p, br.key,
                                br.base_index, br.dkey, w.raw(), nullptr, dt, N, C, eps);
}

void residual_add_forward(Tensor& sum, const Tensor& x, const Tensor& branch, const ops::ResidualBranch& br) {
  const DType dt = cuda_dtype("residual_add_forward", "sum", sum.dtype());
  const int64_t C = sum.dim(-1), N = C ? sum.numel() / C : 0;
  k::residual_layernorm_forward(sum.raw(), nullptr, nullptr, nullptr, x.raw(), branch.raw(), p(br.bias), br.p, br.key,
                                br.base_index, br.dkey, nullptr, nullptr, dt, N, C, 0.0);
}

void layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& mean, const Tensor& rstd, bool accumulate_dinp) {
  const char* op = "layernorm_backward";
  const DType dt = cuda_dtype(op, "dinp", dinp.dtype());
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  k::layernorm_backward(dinp.raw(), accumulate_dinp ? dinp.raw() : nullptr, f(dw), f(db), dout.raw(), inp.raw(),
                        w.raw(), f(mean), f(rstd), dt, N, C);
}

void residual_layernorm_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dresidual, const Tensor& dout,
                                 const Tensor& inp, const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  const DType dt = cuda_dtype("residual_layernorm_backward", "dinp", dinp.dtype());
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  k::layernorm_backward(dinp.raw(), dresidual.raw(), f(dw), f(db), dout.raw(), inp.raw(), w.raw(), f(mean), f(rstd), dt,
                        N, C);
}

void rmsnorm_backward(Tensor& dinp, Tensor& dw, const Tensor& dout, const Tensor& inp, const Tensor& w,
                      const Tensor& rstd, bool accumulate_dinp) {
  const DType dt = cuda_dtype("rmsnorm_backward", "dinp", dinp.dtype());
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  k::layernorm_backward(dinp.raw(), accumulate_dinp ? dinp.raw() : nullptr, f(dw), nullptr, dout.raw(), inp.raw(),
                        w.raw(), nullptr, f(rstd), dt, N, C);
}

void residual_rmsnorm_backward(Tensor& dinp, Tensor& dw, const Tensor& dresidual, const Tensor& dout, const Tensor& inp,
                               const Tensor& w, const Tensor& rstd) {
  const DType dt = cuda_dtype("residual_rmsnorm_backward", "dinp", dinp.dtype());
  const int64_t C = w.numel(), N = C ? inp.numel() / C : 0;
  k::layernorm_backward(dinp.raw(), dresidual.raw(), f(dw), nullptr, dout.raw(), inp.raw(), w.raw(), nullptr, f(rstd),
                        dt, N, C);
}

}  // namespace mtnlg::cuda
