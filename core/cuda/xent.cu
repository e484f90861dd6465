// Vocab-parallel softmax cross-entropy pieces (the stages between the tensor-parallel
// reductions of the row max and the sum of exponentials). CPU reference:
// core/ops/xent.cpp (xent_rowmax, xent_sumexp_target, xent_backward, xent_loss_accumulate).
//
// Gradient contract: dlogits is WRITTEN (padding columns >= valid get 0) and may alias
// logits: each element is read and written by the same thread, the target column
// included (its -dloss is folded into the same write). Statistics are fp32; logits
// and dlogits have the activation dtype. One block per row.
#include <cfloat>

#include "core/cuda/common.cuh"

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;

// Block reductions; the result is valid in every thread. `sh` has 32 floats.
__device__ float block_max(float v, float* sh) {
  v = warp_max(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  __syncthreads();  // sh may still be read by a previous reduction
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : -INFINITY;
  return warp_max(v);
}
__device__ float block_sum(float v, float* sh) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.0f;
  return warp_sum(v);
}

template <typename T>
__global__ void xent_rowmax_kernel(float* rowmax, const T* logits, int64_t N, int64_t V, int64_t valid) {
  __shared__ float sh[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* l = logits + row * V;
    float m = -INFINITY;
    for (int64_t v = threadIdx.x; v < valid; v += blockDim.x) m = fmaxf(m, to_f(l[v]));
    m = block_max(m, sh);
    if (threadIdx.x == 0) rowmax[row] = m;
  }
}

template <typename T>
__global__ void xent_sumexp_target_kernel(float* sumexp, float* target_logit, const T* logits, const int32_t* targets,
                                          const float* rowmax, int64_t N, int64_t V, int64_t vstart, int64_t valid) {
  __shared__ float sh[32];
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* l = logits + row * V;
    const float m = rowmax[row];
    float s = 0;
    for (int64_t v = threadIdx.x; v < valid; v += blockDim.x) s += expf(to_f(l[v]) - m);
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
      sumexp[row] = s;
      const int64_t t = static_cast<int64_t>(targets[row]) - vstart;
      target_logit[row] = (t >= 0 && t < valid) ? to_f(l[t]) : 0.0f;
    }
  }
}

template <typename T>
__global__ void xent_backward_kernel(T* dlogits, const T* logits, const int32_t* targets, const float* rowmax,
                                     const float* sumexp, const float* dloss, int64_t N, int64_t V, int64_t vstart,
                                     int64_t valid) {
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* l = logits + row * V;
    T* dl = dlogits + row * V;
    const float m = rowmax[row], inv = 1.0f / sumexp[row], g = dloss[row];
    const int64_t t = static_cast<int64_t>(targets[row]) - vstart;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      float d = 0.0f;
      if (v < valid) {
        d = expf(to_f(l[v]) - m) * inv * g;
        if (v == t) d -= g;
      }
      dl[v] = from_f<T>(d);
    }
  }
}

unsigned row_grid(int64_t N) { return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(N, 1), 65535)); }

}  // namespace

void xent_rowmax(float* rowmax, const void* logits, DType dt, int64_t N, int64_t V, int64_t valid) {
  if (N <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(row_grid(N), kThreads, 0, stream(), xent_rowmax_kernel<T>)(
                      rowmax, static_cast<const T*>(logits), N, V, valid));
  MTNLG_CUDA_LAUNCH_CHECK("xent_rowmax_kernel");
}

void xent_sumexp_target(float* sumexp, float* target_logit, const void* logits, const int32_t* targets,
                        const float* rowmax, DType dt, int64_t N, int64_t V, int64_t vstart, int64_t valid) {
  if (N <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(row_grid(N), kThreads, 0, stream(), xent_sumexp_target_kernel<T>)(
                      sumexp, target_logit, static_cast<const T*>(logits), targets, rowmax, N, V, vstart, valid));
  MTNLG_CUDA_LAUNCH_CHECK("xent_sumexp_target_kernel");
}

void xent_backward(void* dlogits, const void* logits, const int32_t* targets, const float* rowmax, const float* sumexp,
                   const float* dloss, DType dt, int64_t N, int64_t V, int64_t vstart, int64_t valid) {
  if (N <= 0) return;
  MTNLG_DT_SWITCH(dt, T,
                  MTNLG_LAUNCH(row_grid(N), kThreads, 0, stream(), xent_backward_kernel<T>)(
                      static_cast<T*>(dlogits), static_cast<const T*>(logits), targets, rowmax, sumexp, dloss, N, V,
                      vstart, valid));
  MTNLG_CUDA_LAUNCH_CHECK("xent_backward_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- the per-step loss accumulator: acc[0] += sum_i w_i (log sumexp_i + rowmax_i -
// target_i), acc[1] += sum_i w_i, in f64, one block in a fixed order.

namespace mtnlg::cuda::k {

namespace {

__global__ void xent_loss_kernel(double* acc, const float* rowmax, const float* sumexp, const float* target,
                                 const float* mask, int64_t N) {
  __shared__ double sh[kThreads];
  double loss = 0, count = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    const double w = mask ? double(mask[i]) : 1.0;
    loss += w * (log(double(sumexp[i])) + double(rowmax[i]) - double(target[i]));
    count += w;
  }
  const double l = block_sum_double(loss, sh);
  __syncthreads();
  const double c = block_sum_double(count, sh);
  if (threadIdx.x == 0) {
    acc[0] += l;
    acc[1] += c;
  }
}

}  // namespace

void xent_loss_accumulate(double* acc, const float* rowmax, const float* sumexp, const float* target, const float* mask,
                          int64_t N) {
  if (N <= 0) return;
  MTNLG_LAUNCH(1, kThreads, 0, stream(), xent_loss_kernel)(acc, rowmax, sumexp, target, mask, N);
  MTNLG_CUDA_LAUNCH_CHECK("xent_loss_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;

void xent_rowmax(Tensor& rowmax, const Tensor& logits, int64_t valid_local) {
  const DType dt = cuda_dtype("xent_rowmax", "logits", logits.dtype());
  const int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  k::xent_rowmax(f(rowmax), logits.raw(), dt, N, V, valid_local);
}

void xent_sumexp_target(Tensor& sumexp, Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                        const Tensor& rowmax, int64_t vocab_start, int64_t valid_local) {
  const char* op = "xent_sumexp_target";
  const DType dt = cuda_dtype(op, "logits", logits.dtype());
  const int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  k::xent_sumexp_target(f(sumexp), f(target_logit), logits.raw(), ip(targets), f(rowmax), dt, N, V, vocab_start,
                        valid_local);
}

void xent_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& rowmax,
                   const Tensor& sumexp, const Tensor& dloss, int64_t vocab_start, int64_t valid_local) {
  const char* op = "xent_backward";
  const DType dt = cuda_dtype(op, "dlogits", dlogits.dtype());
  const int64_t N = rowmax.numel(), V = N ? logits.numel() / N : 0;
  k::xent_backward(dlogits.raw(), logits.raw(), ip(targets), f(rowmax), f(sumexp), f(dloss), dt, N, V, vocab_start,
                   valid_local);
}

void xent_loss_accumulate(Tensor& acc, const Tensor& rowmax, const Tensor& sumexp, const Tensor& target_logit,
                          const Tensor* mask) {
  need_f32("xent_loss_accumulate", "rowmax", &rowmax);  // f64 statistics are CPU-only
  k::xent_loss_accumulate(static_cast<double*>(acc.raw()), f(rowmax), f(sumexp), f(target_logit), p<const float>(mask),
                          rowmax.numel());
}

}  // namespace mtnlg::cuda
