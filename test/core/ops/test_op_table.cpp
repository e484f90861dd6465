// The drivers of the op table (test/core/ops/op_cases.hpp): one Catch2 test case per entry
// and mechanism, registered at start-up from the table, one DYNAMIC_SECTION per case so
// a failure names the op and the case:
//   "ops table: <op> (fp64 finite differences)"  [ops]  every case marked fd
//   "ops table: <op> in bf16/f16 is the f32 op rounded once (CPU)"
//                                                  [low_precision]  every case marked low
//   "cuda ops table: <op> vs CPU"                  [gpu]  every case marked device
// The CUDA driver exists in CUDA builds only (CPU builds exclude CUDA code); without a
// device it WARNs and returns unless MTNLG_REQUIRE_GPU=1 (cuda_test_util.hpp).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "core/half.hpp"
#include "test/core/ops/op_cases.hpp"
#ifdef MTNLG_HAVE_CUDA
#include "test/core/cuda/cuda_test_util.hpp"
#endif

using namespace mtnlg;
using namespace mtnlg::optable;

namespace {

void assert_checks(const std::vector<Check>& checks, const char* side) {
  for (const Check& c : checks) {
    INFO(side << ": " << c.what);
    CHECK(c.ok);
  }
}

// Checks the analytic gradient of p.loss() w.r.t. every element of each param
// (central differences, h = 1e-5).
void check_grad(const FdParam& fp, const std::function<double()>& loss, double tol) {
  INFO(fp.name);
  Tensor x = fp.x;
  REQUIRE(fp.grad.numel() == x.numel());
  const double h = 1e-5;
  double worst = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double& xi = x.data<double>()[i];
    const double old = xi;
    xi = old + h;
    const double lp = loss();
    xi = old - h;
    const double lm = loss();
    xi = old;
    const double num = (lp - lm) / (2 * h);
    const double ana = fp.grad.data<double>()[i];
    const double err = std::fabs(num - ana) / (1e-6 + std::fabs(num) + std::fabs(ana));
    worst = std::max(worst, err);
  }
  CHECK(worst < tol);
}

// `body(case, seed)` in a section of its own for every case of `e` marked by `flag`
// (fd, low, device): what each of the table's three runs walks.
template <typename Body>
void each_case(const Entry& e, bool Case::*flag, Body body) {
  for (size_t i = 0; i < e.cases.size(); ++i) {
    const Case& k = e.cases[i];
    if (!(k.*flag)) continue;
    DYNAMIC_SECTION(e.name << ": " << k.label) { body(k, case_seed(e, i)); }
  }
}

void run_fd(const Entry& e) {
  each_case(e, &Case::fd, [&](const Case& k, uint64_t seed) {
    Ctx c(Device::cpu, DType::f64, DType::f64, seed);
    const FdProblem p = e.fd(c, k);
    assert_checks(c.checks, "cpu f64");
    for (const FdParam& fp : p.params) check_grad(fp, p.loss, p.tol);
  });
}

// Case `k` of entry `e` run on a reference context and another, each context's own
// checks asserted; their outputs, the same count.
std::pair<std::vector<Output>, std::vector<Output>> run_both(const Entry& e, const Case& k, Ctx& ref,
                                                             const char* ref_what, Ctx& other, const char* other_what) {
  Run rr = e.prepare(ref, k);
  rr.exec();
  std::vector<Output> ro = rr.collect();
  Run otr = e.prepare(other, k);
  otr.exec();
  std::vector<Output> oo = otr.collect();
  assert_checks(ref.checks, ref_what);
  assert_checks(other.checks, other_what);
  REQUIRE(ro.size() == oo.size());
  return {std::move(ro), std::move(oo)};
}

// A bf16/f16 CPU run against the f32 CPU run on the same rounded inputs: each
// low-precision output equals the f32 value rounded once (the same bits), every f32
// output (statistics, parameter gradients) the same value.
void run_low(const Entry& e) {
  each_case(e, &Case::low, [&](const Case& k, uint64_t seed) {
    Ctx ref(Device::cpu, k.dt, DType::f32, seed), low(Device::cpu, k.dt, k.dt, seed);
    const auto [ro, lo] = run_both(e, k, ref, "cpu f32", low, "cpu low precision");
    for (size_t j = 0; j < ro.size(); ++j) {
      const Output &a = lo[j], &r = ro[j];
      INFO(r.name << " held in " << to_string(a.stored));
      REQUIRE(a.values.size() == r.values.size());
      int64_t bad = 0;
      if (a.stored == DType::bf16 || a.stored == DType::f16) {
        if (!r.rounded_once) continue;
        for (size_t q = 0; q < r.values.size(); ++q) {
          const float f = static_cast<float>(r.values[q]);
          const double want =
              a.stored == DType::bf16 ? half::bf16_to_f32(half::f32_to_bf16(f)) : half::f16_to_f32(half::f32_to_f16(f));
          bad += std::memcmp(&want, &a.values[q], sizeof want) != 0;
        }
      } else {
        for (size_t q = 0; q < r.values.size(); ++q) bad += !(a.values[q] == r.values[q]);
      }
      CHECK(bad == 0);
    }
  });
}

#ifdef MTNLG_HAVE_CUDA
// `dev` (CUDA) against `ref` (the CPU), one output, by the output's comparison.
void compare(const Output& dev, const Output& ref) {
  INFO(ref.name);
  REQUIRE(dev.values.size() == ref.values.size());
  const size_t n = ref.values.size();
  switch (ref.cmp) {
    case Cmp::bits: CHECK(std::memcmp(dev.values.data(), ref.values.data(), n * sizeof(double)) == 0); break;
    case Cmp::scalar_rel:
      REQUIRE(n == 1);
      CHECK(std::fabs(dev.values[0] - ref.values[0]) <= ref.rtol * ref.values[0]);
      break;
    case Cmp::close: {  // cuda_test_util.hpp's check_close on the host values
      double ss = 0;
      for (double r : ref.values) ss += r * r;
      const double rms = n ? std::sqrt(ss / static_cast<double>(n)) : 0.0, rtol = ref.rtol;
      double worst = 0;
      int64_t worst_i = -1;
      for (size_t i = 0; i < n; ++i) {
        const double x = dev.values[i], r = ref.values[i];
        const double e = std::fabs(x - r) / (rtol * (std::fabs(r) + rms) + 1e-30);
        if (!(e <= worst)) {  // NaN counts as the worst
          worst = std::isnan(e) ? INFINITY : e;
          worst_i = static_cast<int64_t>(i);
        }
      }
      INFO("worst element " << worst_i << ": gpu " << (worst_i >= 0 ? dev.values[worst_i] : 0.0) << " ref "
                            << (worst_i >= 0 ? ref.values[worst_i] : 0.0) << " (error " << worst
                            << " x tolerance, rtol " << rtol << ", rms " << rms << ")");
      CHECK(worst <= 1.0);
      break;
    }
  }
  if (ref.same_zeros) {
    int64_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += (dev.values[i] == 0) != (ref.values[i] == 0);
    INFO("elements zero on one device only");
    CHECK(differ == 0);
  }
}

void run_device(const Entry& e) {
  // Catch2 runs the test case once per section: the backend is set up on the first pass.
  static const bool ready = test::gpu_ready();
  if (!ready) return;
  each_case(e, &Case::device, [&](const Case& k, uint64_t seed) {
    Ctx ref(Device::cpu, k.dt, DType::f32, seed), dev(Device::cuda, k.dt, k.dt, seed);
    const auto [ro, dout] = run_both(e, k, ref, "cpu", dev, "cuda");
    for (size_t j = 0; j < ro.size(); ++j) compare(dout[j], ro[j]);
  });
}
#endif

// Registers the test cases from the table (Catch2's AutoReg, as TEST_CASE does).
struct Invoker : Catch::ITestInvoker {
  const Entry* entry;
  void (*fn)(const Entry&);
  Invoker(const Entry* e, void (*f)(const Entry&)) : entry(e), fn(f) {}
  void invoke() const override { fn(*entry); }
};

struct Registrar {
  std::deque<std::string> names;  // Catch keeps references to the names and tags
  std::deque<Catch::AutoReg> regs;
  Registrar() {
    for (const Entry& e : registry()) {
      bool fd = false, device = false, low = false;
      for (const Case& k : e.cases) fd |= k.fd, device |= k.device, low |= k.low;
      if (fd && e.fd) add(e, "ops table: " + e.name + " (fp64 finite differences)", "[ops]", run_fd);
      if (low && e.prepare)
        add(e, "ops table: " + e.name + " in bf16/f16 is the f32 op rounded once (CPU)", "[low_precision]", run_low);
#ifdef MTNLG_HAVE_CUDA
      if (device && e.prepare) add(e, "cuda ops table: " + e.name + " vs CPU", "[gpu]", run_device);
#else
      (void)device;
#endif
    }
  }
  void add(const Entry& e, std::string name, const char* tags, void (*fn)(const Entry&)) {
    names.push_back(std::move(name));
    names.push_back(tags);
    regs.emplace_back(new Invoker(&e, fn), Catch::SourceLineInfo(__FILE__, static_cast<std::size_t>(__LINE__)),
                      Catch::StringRef(), Catch::NameAndTags(names[names.size() - 2], names.back()));
  }
};
const Registrar registrar;

}  // namespace
