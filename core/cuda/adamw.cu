// AdamW over the flat fp32 master parameters in one launch. CPU reference:
// core/cpu/ops_cpu.cpp (adamw), which ops::adamw_step calls once per segment.
//
// Why one launch: a GPT stage has hundreds of parameter tensors but one flat buffer
// (model/params.hpp); launching per tensor costs more than the update. The per-tensor
// difference (weight decay 0 for biases and norm weights) comes from a small segment
// table searched per element. The optional copy-out writes the updated parameters in
// the forward dtype (bf16/fp16), so mixed precision needs no separate convert pass.
//
// Update (same formula and rounding points as the CPU): g = grad * grad_scale,
// m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2,
// p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps) + lr*wd * p.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cuda/common.cuh"

namespace mtnlg::cuda::k {

namespace {

constexpr int kThreads = 256;

struct DevSegment {
  int64_t begin, end;
  float decay;  // lr * weight_decay for this segment (0 without decay)
};

struct AdamConsts {
  float b1, b2, gs, step_size, inv_sqrt_bc2, eps;
};

template <typename C>
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n, AdamConsts k,
                             const DevSegment* segs, int nseg, C* copy_out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    // Last segment with begin <= i (segments sorted by begin, non-overlapping).
    int lo = 0, hi = nseg - 1, s = -1;
    while (lo <= hi) {
      const int mid = (lo + hi) / 2;
      if (segs[mid].begin <= i) {
        s = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    if (s < 0 || i >= segs[s].end) continue;
    const float g = grad[i] * k.gs;
    const float mi = k.b1 * m[i] + (1.0f - k.b1) * g;
    const float vi = k.b2 * v[i] + (1.0f - k.b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) * k.inv_sqrt_bc2 + k.eps;
    const float p = param[i] - (k.step_size * mi / denom + segs[s].decay * param[i]);
    param[i] = p;
    if (copy_out) copy_out[i] = from_f<C>(p);
  }
}

}  // namespace

void adamw(float* param, const float* grad, float* m, float* v, int64_t n, const AdamArgs& a, const AdamSegment* segs,
           int64_t nseg, void* copy_out, Dt copy_dt) {
  if (n <= 0 || nseg <= 0) return;
  std::vector<DevSegment> table;
  table.reserve(static_cast<size_t>(nseg));
  for (int64_t s = 0; s < nseg; ++s) {
    const auto& g = segs[s];
    if (g.numel <= 0) continue;
    if (g.offset < 0 || g.offset + g.numel > n) fail("adamw: a segment lies outside the flat buffer");
    table.push_back({g.offset, g.offset + g.numel, static_cast<float>(g.weight_decay ? a.lr * a.weight_decay : 0.0)});
  }
  std::sort(table.begin(), table.end(), [](const DevSegment& x, const DevSegment& y) { return x.begin < y.begin; });
  for (size_t s = 1; s < table.size(); ++s)
    if (table[s].begin < table[s - 1].end) fail("adamw: parameter segments overlap");
  if (table.empty()) return;
  DeviceBuffer<DevSegment> dsegs(static_cast<int64_t>(table.size()));
  // From pageable memory: the copy is staged before cudaMemcpyAsync returns, so the
  // host vector may go out of scope.
  CUDA_CHECK(cudaMemcpyAsync(dsegs.data(), table.data(), table.size() * sizeof(DevSegment), cudaMemcpyHostToDevice,
                             stream()));
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  const AdamConsts k{static_cast<float>(a.beta1),          static_cast<float>(a.beta2),
                     static_cast<float>(a.grad_scale),     static_cast<float>(a.lr / bc1),
                     static_cast<float>(1.0 / std::sqrt(bc2)), static_cast<float>(a.eps)};
  const int ns = static_cast<int>(table.size());
  MTNLG_DT_SWITCH(copy_dt, C,
                  adamw_kernel<C><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
                      param, grad, m, v, n, k, dsegs.data(), ns, static_cast<C*>(copy_out)));
  MTNLG_CUDA_LAUNCH_CHECK("adamw_kernel");
}

}  // namespace mtnlg::cuda::k
