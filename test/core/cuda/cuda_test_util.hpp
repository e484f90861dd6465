// Helpers for the CUDA op tests (test/core/test_cuda_*.cpp): device detection, host
// <-> device copies with dtype conversion, NaN-poisoned outputs and THE tolerance
// metric used by every GPU-vs-CPU comparison:
//
//   pass iff for every element i:  |gpu_i - ref_i| <= rtol * (|ref_i| + rms(ref))
//
// i.e. a relative error per element, floored at the tensor's RMS so that elements that
// cancel to ~0 (matmul outputs, gradients) are judged at the tensor's scale. rtol is
// per dtype: kRtolF32 for fp32 kernels, kRtolLow for bf16/fp16 storage. Override
// only with a comment saying why.
#pragma once
#ifdef MTNLG_HAVE_CUDA
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/backend_kind.hpp"
#include "core/cuda/device.hpp"
#include "core/ops.hpp"
#include "core/switches.hpp"
#include "core/tensor.hpp"

namespace mtnlg::test {

constexpr double kRtolF32 = 1e-5;
constexpr double kRtolLow = 1e-2;
inline double rtol_for(DType dt) { return dt == DType::f32 ? kRtolF32 : kRtolLow; }

// True when a device is present (the backend is then initialised on device 0). With no
// device: FAIL when MTNLG_REQUIRE_GPU=1 (the gpu label on a GPU machine), else WARN
// and let the case return, so an accidental run elsewhere does not break.
// True on the emulated CUDA backend (the [gpu] cases run on the CPU there, so the
// [large] cases scale their shapes down while keeping what they exercise).
inline bool emulated_device() { return cuda::emulated_backend(); }

inline bool gpu_ready() {
  if (cuda::device_count() > 0) {
    cuda::init_backend(0);
    return true;
  }
  if (switches::on(Switch::require_gpu)) FAIL("MTNLG_REQUIRE_GPU=1 but no CUDA device is visible (nvidia-smi -L?)");
  WARN("no CUDA device visible: [gpu] case skipped (set MTNLG_REQUIRE_GPU=1 to make this a failure)");
  return false;
}

inline Tensor randn(const Shape& s, std::mt19937_64& g, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::f32);
  std::normal_distribution<float> d(0.0f, static_cast<float>(scale));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  return t;
}

// CPU f32 -> device tensor of dtype dt.
inline Tensor to_gpu(const Tensor& cpu, DType dt = DType::f32) {
  Tensor g = cpu.to(Device::cuda);
  if (dt == cpu.dtype()) return g;
  Tensor out = Tensor::empty(cpu.shape(), dt, Device::cuda);
  ops::convert(out, g);
  return out;
}

// Device tensor (any float dtype) -> CPU f32.
inline Tensor to_cpu_f32(const Tensor& g) {
  if (g.dtype() == DType::f32 || g.dtype() == DType::i32) return g.to(Device::cpu);
  Tensor f = Tensor::empty(g.shape(), DType::f32, Device::cuda);
  ops::convert(f, g);
  return f.to(Device::cpu);
}

// The values the device sees after rounding to dt (the CPU reference's inputs).
inline Tensor rounded(const Tensor& cpu, DType dt) {
  return dt == DType::f32 ? cpu.clone() : to_cpu_f32(to_gpu(cpu, dt));
}

// A device tensor filled with NaN, so a kernel that skips an element is caught.
inline Tensor poisoned(const Shape& s, DType dt) {
  Tensor t = Tensor::empty(s, dt, Device::cuda);
  ops::fill(t, std::nan(""));
  return t;
}

// The metric above. `gpu` is a device tensor (any float dtype), `ref` a CPU f32 tensor.
// `extra` (empty, or one per element): an absolute allowance added to an element's bound,
// where an algorithm's own rounding is derived per element (each caller says how).
inline void check_close(const std::string& what, const Tensor& gpu, const Tensor& ref, double rtol,
                        const std::vector<double>& extra = {}) {
  INFO(what);
  Tensor a = to_cpu_f32(gpu);
  REQUIRE(a.numel() == ref.numel());
  REQUIRE((extra.empty() || static_cast<int64_t>(extra.size()) == ref.numel()));
  double ss = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) ss += static_cast<double>(ref.data<float>()[i]) * ref.data<float>()[i];
  const double rms = ref.numel() ? std::sqrt(ss / static_cast<double>(ref.numel())) : 0.0;
  double worst = 0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double x = a.data<float>()[i], r = ref.data<float>()[i];
    const double allowance = extra.empty() ? 0.0 : extra[static_cast<size_t>(i)];
    const double e = std::fabs(x - r) / (rtol * (std::fabs(r) + rms) + allowance + 1e-30);
    if (!(e <= worst)) {  // NaN counts as the worst
      worst = std::isnan(e) ? INFINITY : e;
      worst_i = i;
    }
  }
  INFO("worst element " << worst_i << ": gpu " << (worst_i >= 0 ? a.data<float>()[worst_i] : 0.0f) << " ref "
                        << (worst_i >= 0 ? ref.data<float>()[worst_i] : 0.0f) << " (error " << worst
                        << " x tolerance, rtol " << rtol << ", rms " << rms << ")");
  CHECK(worst <= 1.0);
}

}  // namespace mtnlg::test
#endif  // MTNLG_HAVE_CUDA
