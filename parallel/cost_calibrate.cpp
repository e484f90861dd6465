// `mtnlg plan --calibrate`: fit a GPU description's constants to measured step times, so
// that the planner predicts the user's own machine (docs/PLANNER.md "Calibration").
#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "parallel/cost_model.hpp"

namespace mtnlg::cost {

namespace {

GpuSpec scaled(const GpuSpec& base, const double logk[3]) {
  GpuSpec g = base;
  g.gemm_eff_max = base.gemm_eff_max * std::exp(logk[0]);
  g.hbm_bw = base.hbm_bw * std::exp(logk[1]);
  g.kernel_overhead = base.kernel_overhead * std::exp(logk[2]);
  return g;
}

std::vector<double> predict(const GpuSpec& g, const std::vector<Observation>& runs, int64_t per_node,
                            const SoftwareProfile& sw) {
  std::vector<double> out;
  for (auto& o : runs) {
    Cluster c{g, per_node, sw};
    out.push_back(iteration_time(o.recipe, o.layout, c, o.recipe.training.global_batch_size));
  }
  return out;
}

double loss(const std::vector<double>& pred, const std::vector<Observation>& runs) {
  double s = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const double d = std::log(pred[i] / runs[i].step_time_s);
    s += d * d;
  }
  return s;
}

}  // namespace

CalibrationResult calibrate(const GpuSpec& base, const std::vector<Observation>& runs, int64_t gpus_per_node,
                            const SoftwareProfile& software) {
  if (runs.empty()) throw_input("calibrate: no measured runs");
  for (auto& o : runs)
    if (!(o.step_time_s > 0) || !std::isfinite(o.step_time_s))
      throw_input("calibrate: {}: no positive step time", o.label);
  // As many free multipliers as the runs can determine: compute, then bandwidth, then overhead.
  const int free = static_cast<int>(std::min<size_t>(3, runs.size()));
  // Coarse grid over the free log-multipliers (factors e^-4 .. e^4), then coordinate
  // search with halving steps from the best grid point; multipliers stay within e^+-6 so a
  // constant the runs cannot see (a roofline term that never binds) does not run away.
  auto eval = [&](const double y[3]) { return loss(predict(scaled(base, y), runs, gpus_per_node, software), runs); };
  double x[3] = {0, 0, 0};
  double best = eval(x);
  const int n0 = 9, n1 = free > 1 ? 9 : 1, n2 = free > 2 ? 9 : 1;
  for (int i = 0; i < n0; ++i)
    for (int j = 0; j < n1; ++j)
      for (int k = 0; k < n2; ++k) {
        const double y[3] = {-4.0 + i, free > 1 ? -4.0 + j : 0.0, free > 2 ? -4.0 + k : 0.0};
        const double l = eval(y);
        if (l < best) {
          best = l;
          std::copy(y, y + 3, x);
        }
      }
  double step = 0.5;
  for (int it = 0; it < 2000 && step > 1e-5; ++it) {
    bool improved = false;
    for (int k = 0; k < free; ++k) {
      for (double dir : {+1.0, -1.0}) {
        double y[3] = {x[0], x[1], x[2]};
        y[k] = std::clamp(y[k] + dir * step, -6.0, 6.0);
        const double l = eval(y);
        if (l < best - 1e-15) {
          best = l;
          std::copy(y, y + 3, x);
          improved = true;
          break;
        }
      }
    }
    if (!improved) step *= 0.5;
  }
  CalibrationResult r;
  r.gpu = scaled(base, x);
  r.compute_scale = std::exp(x[0]);
  r.bandwidth_scale = std::exp(x[1]);
  r.overhead_scale = std::exp(x[2]);
  r.free_parameters = free;
  r.predicted = predict(r.gpu, runs, gpus_per_node, software);
  double s = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const double e = r.predicted[i] / runs[i].step_time_s - 1.0;
    s += e * e;
  }
  r.rms_relative_error = std::sqrt(s / double(runs.size()));
  return r;
}

}  // namespace mtnlg::cost
