// AdamW over the flat fp32 master parameters in one launch. CPU reference:
// core/ops/adamw.cpp (cpu::adamw), which ops::adamw_step calls once per tensor.
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

struct AdamConsts {
  float b1, b2, gs, step_size, inv_sqrt_bc2, eps, decay;  // decay = lr * weight_decay
};

template <typename C>
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n, AdamConsts k,
                             const ops::AdamWSegment* segs, int nseg, C* copy_out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    // Last segment with offset <= i (segments sorted by offset, non-overlapping).
    int lo = 0, hi = nseg - 1, s = -1;
    while (lo <= hi) {
      const int mid = (lo + hi) / 2;
      if (segs[mid].offset <= i) {
        s = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    if (s < 0 || i >= segs[s].offset + segs[s].numel) continue;
    const float g = grad[i] * k.gs;
    const float mi = k.b1 * m[i] + (1.0f - k.b1) * g;
    const float vi = k.b2 * v[i] + (1.0f - k.b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) * k.inv_sqrt_bc2 + k.eps;
    const float decay = segs[s].weight_decay ? k.decay : 0.0f;
    const float p = param[i] - (k.step_size * mi / denom + decay * param[i]);
    param[i] = p;
    if (copy_out) copy_out[i] = from_f<C>(p);
  }
}

}  // namespace

// Segments sorted, disjoint and inside [0, n) (checked by ops::adamw_flat).
void adamw(float* param, const float* grad, float* m, float* v, int64_t n, const ops::AdamWParams& a,
           const std::vector<ops::AdamWSegment>& segments, void* copy_out, DType copy_dt) {
  std::vector<ops::AdamWSegment> table;
  table.reserve(segments.size());
  for (const auto& g : segments)
    if (g.numel > 0) table.push_back(g);
  if (n <= 0 || table.empty()) return;
  DeviceBuffer<ops::AdamWSegment> dsegs(static_cast<int64_t>(table.size()));
  // From pageable memory: the copy is staged before cudaMemcpyAsync returns, so the
  // host vector may go out of scope.
  CUDA_CHECK(cudaMemcpyAsync(dsegs.data(), table.data(), table.size() * sizeof(ops::AdamWSegment),
                             cudaMemcpyHostToDevice, stream()));
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(a.step));
  const AdamConsts k{static_cast<float>(a.beta1),
                     static_cast<float>(a.beta2),
                     static_cast<float>(a.grad_scale),
                     static_cast<float>(a.lr / bc1),
                     static_cast<float>(1.0 / std::sqrt(bc2)),
                     static_cast<float>(a.eps),
                     static_cast<float>(a.lr * a.weight_decay)};
  const int ns = static_cast<int>(table.size());
  MTNLG_DT_SWITCH(copy_dt, C,
                  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), adamw_kernel<C>)(
                      param, grad, m, v, n, k, dsegs.data(), ns, static_cast<C*>(copy_out)));
  MTNLG_CUDA_LAUNCH_CHECK("adamw_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes, dtype roles and segments were
// checked by the dispatcher in core/ops/adamw.cpp) ------------------------------------

namespace mtnlg::cuda {

using namespace detail;

void adamw_flat(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& ap,
                const std::vector<ops::AdamWSegment>& segments, Tensor* copy_out) {
  const char* op = "adamw";
  const std::pair<const char*, const Tensor*> args[] = {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}};
  for (const auto& [name, t] : args)
    if (t->dtype() != DType::f32)
      throw_runtime("{}: {} must be f32 (the master copy) on CUDA, got {}", op, name, to_string(t->dtype()));
  DType copy_dt = DType::bf16;
  void* out = nullptr;
  if (copy_out && copy_out->defined()) {
    copy_dt = cuda_dtype(op, "copy_out", copy_out->dtype());
    out = copy_out->raw();
  }
  k::adamw(f(param), f(grad), f(m), f(v), param.numel(), ap, segments, out, copy_dt);
}

}  // namespace mtnlg::cuda
