// DistributedAdamW (optimizer/distributed_adamw.hpp) in one process, without ZeRO-1
// (the sharded form is proven against it under mpirun by the trainer's layout tests):
// the update against AdamW written out in double (decoupled weight decay only on the
// segments that take it, bias correction, global-norm clipping with the norm reported
// before clipping), a skipped step on a non-finite gradient, the compute copy.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "core/half.hpp"
#include "core/tensor.hpp"
#include "optimizer/distributed_adamw.hpp"
#include "test/support/process_groups.hpp"

using namespace mtnlg;

namespace {
Tensor filled(const std::vector<float>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = v[i];
  return t;
}
}  // namespace

TEST_CASE("distributed adamw: two steps equal AdamW written out, clipping by the global norm", "[optimizer]") {
  optimizer::AdamWConfig cfg;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.weight_decay = 0.1;
  cfg.clip_grad = 1.0;
  // two segments: [0, 3) with weight decay (a weight), [3, 5) without (a bias)
  std::vector<optimizer::ParamSegment> segs{{{0, 3, true}, true}, {{3, 2, false}, true}};
  optimizer::DistributedAdamW opt(cfg, segs, 5, test::single_process_groups(), /*zero1=*/false, 0);
  Tensor p = filled({0.5f, -1.0f, 2.0f, 0.25f, -0.75f});
  const std::vector<std::vector<float>> gs{{3.0f, -4.0f, 0.0f, 1.0f, 2.0f}, {0.1f, 0.2f, -0.3f, 0.05f, 0.0f}};
  std::vector<double> ref(p.data<float>(), p.data<float>() + 5), m(5, 0.0), v(5, 0.0);
  const double lr = 0.01;
  for (int step = 1; step <= 2; ++step) {
    Tensor g = filled(gs[step - 1]);
    double sq = 0;
    for (float x : gs[step - 1]) sq += double(x) * x;
    const double norm = std::sqrt(sq), coeff = std::min(1.0, cfg.clip_grad / (norm + 1e-6));
    const optimizer::StepResult r = opt.step(p, g, lr);
    INFO("step " << step);
    CHECK_FALSE(r.skipped);
    CHECK(r.grad_norm == Approx(norm).epsilon(1e-6));  // before clipping
    for (int i = 0; i < 5; ++i) {
      const double gi = gs[step - 1][i] * coeff;
      m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * gi;
      v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * gi * gi;
      const double mhat = m[i] / (1 - std::pow(cfg.beta1, step)), vhat = v[i] / (1 - std::pow(cfg.beta2, step));
      const double wd = i < 3 ? cfg.weight_decay : 0.0;
      ref[i] -= lr * (mhat / (std::sqrt(vhat) + cfg.eps) + wd * ref[i]);
      CHECK(p.data<float>()[i] == Approx(ref[i]).epsilon(2e-6));
    }
  }
  CHECK(opt.steps_taken() == 2);
  CHECK(opt.state_bytes() == 2 * 5 * 4);
}

TEST_CASE("distributed adamw: a non-finite gradient skips the step; the compute copy follows the master",
          "[optimizer]") {
  optimizer::DistributedAdamW opt(optimizer::AdamWConfig{}, {{{0, 4, true}, true}}, 4, test::single_process_groups(),
                                  false, 0);
  Tensor p = filled({1.0f, 2.0f, 3.0f, 4.0f});
  Tensor g = filled({0.1f, NAN, 0.1f, 0.1f});
  const optimizer::StepResult r = opt.step(p, g, 0.1);
  CHECK(r.skipped);
  CHECK(opt.steps_taken() == 0);
  for (int i = 0; i < 4; ++i) CHECK(p.data<float>()[i] == float(i + 1));  // untouched
  Tensor w = Tensor::empty({4}, DType::bf16);
  Tensor g2 = filled({0.1f, -0.2f, 0.3f, -0.4f});
  CHECK_FALSE(opt.step(p, g2, 0.1, &w).skipped);
  for (int i = 0; i < 4; ++i)
    CHECK(half::bf16_to_f32(w.data<uint16_t>()[i]) == half::bf16_to_f32(half::f32_to_bf16(p.data<float>()[i])));
}
