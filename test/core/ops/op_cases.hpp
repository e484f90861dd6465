// The op table: every op family's cases in one place, driven by four mechanisms that
// iterate the same entries (as ggml's test-backend-ops does):
//   - finite differences on the CPU in fp64 (test/core/ops/test_op_table.cpp, tag [ops]):
//     an entry's `fd` builds a scalar loss and the gradients its backward gives;
//   - CUDA vs CPU (test/core/ops/test_op_table.cpp, tag [gpu]; on the emulated backend in
//     CI): an entry's `prepare` runs once on each device on the same deterministic
//     inputs and the outputs are compared with the metric of cuda_test_util.hpp;
//   - bf16/f16 storage on the CPU (test/core/ops/test_op_table.cpp, tag [low_precision]):
//     `prepare` with low-precision activations against the f32 run on the same rounded
//     inputs: each low-precision output is the f32 result rounded once (bit for bit),
//     statistics and parameter gradients (f32) are equal;
//   - a speed line (scripts/bench/op_bench.cpp, CMake target op_bench): `prepare` once,
//     then its `exec` timed on the chosen device.
// This file and op_cases.cpp use no Catch2 (op_bench links them without it): extra
// assertions an entry makes are collected in Ctx::checks and asserted by the driver.
// Cases too special for the table (counted fused GEMMs, the allocator, real-shape
// [large] runs, the two attention forms against each other, reference values, dtype-role
// errors) stay TEST_CASEs in test_cuda_ops.cpp, test_ops_grad.cpp and
// test_low_precision.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace mtnlg::optable {

// The CUDA-vs-CPU tolerances (cuda_test_util.hpp's kRtolF32 / kRtolLow, repeated here so
// that this file compiles without CUDA).
constexpr double kRtolF32 = 1e-5;
constexpr double kRtolLow = 1e-2;
inline double rtol_for(DType dt) { return dt == DType::f32 ? kRtolF32 : kRtolLow; }

// An assertion an entry makes beyond its outputs (a counter, a bit-equality on one device,
// a naive formula); the drivers turn each into a CHECK naming `what`.
struct Check {
  bool ok;
  std::string what;
};

// One case of an entry: a label (shown in the section name), the activation dtype, the
// op-specific sizes and reals, and the mechanisms it takes part in.
struct Case {
  std::string label;
  DType dt = DType::f32;
  std::vector<int64_t> n;  // sizes, flags, modes (meaning per entry)
  std::vector<double> x;   // probabilities and other reals
  bool fd = false;         // finite differences (fp64 CPU, `fd`)
  bool device = false;     // CUDA vs CPU (`prepare`)
  bool bench = false;      // op_bench's default set
  bool low = false;        // CPU bf16/f16 storage vs the CPU f32 op rounded once (`prepare`)
  uint64_t seed = 0;       // the inputs' seed; 0: case_seed()
};

// Where and how one run happens. Inputs are drawn in the same order whatever the device,
// so both devices see the same values.
//   check mode (`reference`): the CPU runs in f32 on inputs rounded to `dt` (the
//     reference of the GPU's mixed precision), CUDA stores activations in `dt`;
//   fd mode: the CPU in f64;
//   bench mode: the op as the trainer runs it, activations stored in `dt` on either device.
struct Ctx {
  Device dev = Device::cpu;
  DType dt = DType::f32;     // the case's activation dtype (inputs are rounded to it)
  DType store = DType::f32;  // the dtype activations are stored in on `dev`
  std::mt19937_64 g;
  std::vector<Check> checks;
  double bytes = 0;  // bytes of the tensors made through this context (the speed line's GB/s)

  Ctx(Device d, DType case_dt, DType stored, uint64_t seed) : dev(d), dt(case_dt), store(stored), g(seed) {}
  bool cuda() const { return dev == Device::cuda; }

  // Normal(0, scale) activations, rounded to dt, stored in `store` on dev.
  Tensor act(const Shape& s, double scale = 1.0);
  // Normal(0, scale) in f32 on dev, not rounded (statistics, parameter gradients, the
  // starting value of accumulated outputs); f64 in fd mode.
  Tensor f32(const Shape& s, double scale = 1.0);
  // Uniform integers in [lo, hi], i32 on dev.
  Tensor ids(const Shape& s, int lo, int hi);
  // An output in dtype `dt_out` (`store` when omitted): NaN on CUDA so that a kernel
  // skipping an element is caught, zeros on the CPU.
  Tensor out(const Shape& s);
  Tensor out(const Shape& s, DType dt_out);
  // A forward output as the backward sees it once stored: rounded to dt on the CPU
  // reference (the GPU stores it in dt), itself otherwise.
  Tensor stored(const Tensor& t);
  void expect(bool ok, std::string what) { checks.push_back({ok, std::move(what)}); }
};

// How two devices' copies of one output are compared.
enum class Cmp {
  close,       // |a - r| <= rtol * (|r| + rms(r)) per element (cuda_test_util.hpp)
  bits,        // the same bits (f32 outputs)
  scalar_rel,  // one value: |a - r| <= rtol * |r|
};

struct Output {
  std::string name;
  std::vector<double> values;  // on the host
  Cmp cmp = Cmp::close;
  double rtol = 0;
  bool same_zeros = false;    // also: zero exactly where the other device has zero (dropout masks)
  DType stored = DType::f32;  // the dtype the output was held in
  // In a bf16/f16 run on the CPU: the f32 run's value rounded once at the store (false
  // where the entry chains two stores, e.g. a scale after an add).
  bool rounded_once = true;
};
// A device tensor (any float dtype) as host values; `rtol` per the comparison.
Output output(const std::string& name, const Tensor& t, double rtol, Cmp cmp = Cmp::close);

// One prepared run: `exec` runs the op(s) (forward and backward) on tensors built by
// `prepare`; `collect` returns the outputs after exec ran once (and may add to the
// checks of the Ctx it was prepared with, which must outlive it). flops: per exec, 0 where
// the op is memory bound (the speed line then shows GB/s from Ctx::bytes).
struct Run {
  std::function<void()> exec;
  std::function<std::vector<Output>()> collect;
  double flops = 0;
};

// Finite differences: loss() after perturbing each element of each param's `x` against
// the analytic `grad` computed by `fd` (|num - ana| / (1e-6 + |num| + |ana|) < tol).
struct FdParam {
  std::string name;
  Tensor x;  // shares storage with the tensor loss() reads
  Tensor grad;
};
struct FdProblem {
  std::function<double()> loss;
  std::vector<FdParam> params;
  double tol = 1e-6;
};

struct Entry {
  std::string name;
  std::vector<Case> cases;
  std::function<Run(Ctx&, const Case&)> prepare;   // null: no device cases
  std::function<FdProblem(Ctx&, const Case&)> fd;  // null: no finite differences
};

// The flash attention backward's dqkv bound against the CPU (why: op_cases.cpp); also
// used by the real-shape case in test_cuda_ops.cpp.
double dqkv_rtol(DType dt, double p);

// Every entry, in a fixed order.
const std::vector<Entry>& registry();

// The seed of one case's inputs (the same for both devices of one comparison): the
// case's own seed when it has one, else a hash of the entry's name and the case's label.
uint64_t case_seed(const Entry& e, size_t case_index);

// Sets the process up to run ops on CUDA device 0; false when there is none (or a
// CPU-only build).
bool cuda_available();
void synchronize(Device dev);

}  // namespace mtnlg::optable
