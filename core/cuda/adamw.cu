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
                  MTNLG_LAUNCH(grid_for(n, kThreads), kThreads, 0, stream(), adamw_kernel<C>)(
                      param, grad, m, v, n, k, dsegs.data(), ns, static_cast<C*>(copy_out)));
  MTNLG_CUDA_LAUNCH_CHECK("adamw_kernel");
}

}  // namespace mtnlg::cuda::k

// ---- Tensor-level entry (core/cuda/ops_cuda.hpp; shapes and dtype roles were checked
// by the dispatcher in core/ops/) ------------------------------------------------

namespace mtnlg::cuda {

using namespace detail;
using k::Dt;

void adamw_flat(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& ap,
                const std::vector<AdamWSegment>& segments, Tensor* copy_out) {
  const char* op = "adamw";
  const std::pair<const char*, const Tensor*> args[] = {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}};
  for (const auto& [name, t] : args) {
    if (t->dtype() != DType::f32) throw_runtime("{}: {} must be f32 (the master copy) on CUDA, got {}", op, name,
                                                to_string(t->dtype()));
    if (t->device() != Device::cuda) throw_runtime("{}: {} is not on the CUDA device", op, name);
  }
  const int64_t n = param.numel();
  expect_numel(op, "grad", grad, n);
  expect_numel(op, "m", m, n);
  expect_numel(op, "v", v, n);
  Dt copy_dt = Dt::bf16;
  void* out = nullptr;
  if (copy_out && copy_out->defined()) {
    if (copy_out->device() != Device::cuda) throw_runtime("{}: copy_out is not on the CUDA device", op);
    expect_numel(op, "copy_out", *copy_out, n);
    copy_dt = kdt(op, "copy_out", copy_out->dtype());
    out = copy_out->raw();
  }
  std::vector<k::AdamSegment> segs;
  segs.reserve(segments.size());
  for (const auto& s : segments) segs.push_back(k::AdamSegment{s.offset, s.numel, s.weight_decay});
  const k::AdamArgs a{ap.lr, ap.beta1, ap.beta2, ap.eps, ap.weight_decay, ap.step, ap.grad_scale};
  if (ap.step < 1) throw_runtime("{}: step must be >= 1 (bias correction), got {}", op, ap.step);
  k::adamw(f(param), f(grad), f(m), f(v), n, a, segs.data(), static_cast<int64_t>(segs.size()), out, copy_dt);
}

void adamw_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const ops::AdamWParams& p, Tensor* copy_out) {
  if (copy_out && copy_out->defined() && copy_out->raw() == param.raw()) copy_out = nullptr;  // fp32: the master is the copy
  adamw_flat(param, grad, m, v, p, {AdamWSegment{0, param.numel(), true}}, copy_out);
}

}  // namespace mtnlg::cuda
