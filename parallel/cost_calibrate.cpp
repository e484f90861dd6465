// `mtnlg plan --calibrate`: fit a GPU description's constants to measured step times, so
// that the planner predicts the user's own machine (docs/PLANNER.md "Calibration").
#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "parallel/cost_model.hpp"

namespace mtnlg::cost {

namespace {

// log-multipliers of: GEMM efficiency, memory bandwidth, kernel overhead, link latency,
// compute slots (from `slots0`: the base's, or when it has none the most processes a run
// had; 0 when the slots are not fitted)
constexpr int kParams = 5;

GpuSpec scaled(const GpuSpec& base, const double logk[kParams], double slots0) {
  GpuSpec g = base;
  g.gemm_eff_max = base.gemm_eff_max * std::exp(logk[0]);
  g.hbm_bw = base.hbm_bw * std::exp(logk[1]);
  g.kernel_overhead = base.kernel_overhead * std::exp(logk[2]);
  // The per-step latency of a collective or a point-to-point message (inside and across
  // nodes alike): what a process waits for its peers, scheduling included.
  g.nvlink_alpha = base.nvlink_alpha * std::exp(logk[3]);
  g.ib_alpha = base.ib_alpha * std::exp(logk[3]);
  // How many of a node's processes compute at full speed at once (GpuSpec::compute_slots).
  // slots0 == 0: not fitted, the base's value stays.
  if (slots0 > 0) g.compute_slots = slots0 * std::exp(logk[4]);
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
  // As many free multipliers as the runs can determine: the communication latency when a
  // run has several processes (one such run fixes it: nothing else makes those runs
  // slower than their single-process counterparts), with a second multi-process run the
  // compute slots (a run whose processes compute more than they communicate tells how much
  // slower they compute side by side), and with the remaining runs the compute rate, then
  // bandwidth, then overhead.
  size_t multi = 0;
  int64_t most = 1;
  for (auto& o : runs)
    if (o.layout.gpus() > 1) ++multi, most = std::max(most, std::min<int64_t>(o.layout.gpus(), gpus_per_node));
  const bool latency_free = multi > 0 && runs.size() >= 2;
  const bool slots_free = multi > 1 && runs.size() >= 3;
  const size_t comm_params = (latency_free ? 1 : 0) + (slots_free ? 1 : 0);
  const int free_hw = static_cast<int>(std::min<size_t>(3, runs.size() - comm_params));
  const double slots0 = !slots_free ? 0.0 : base.compute_slots > 0 ? base.compute_slots : double(most);
  bool is_free[kParams] = {true, free_hw > 1, free_hw > 2, latency_free, slots_free};
  // Coarse grid over the free log-multipliers (factors e^-4 .. e^4; the latency e^-2 .. e^10:
  // on a loaded machine a message waits for a time slice, milliseconds against the
  // microseconds of an idle one; the slots e^-3 .. e^1), then coordinate search with halving
  // steps from the best grid point, within e^+-6 (latency e^-4 .. e^12, slots e^-4 .. e^3)
  // so that a constant the runs cannot see (a roofline term that never binds) does not run
  // away.
  const double lo[kParams] = {-4, -4, -4, -2, -3}, hi[kParams] = {4, 4, 4, 10, 1};
  const double lo_b[kParams] = {-6, -6, -6, -4, -4}, hi_b[kParams] = {6, 6, 6, 12, 3};
  auto eval = [&](const double y[kParams]) {
    return loss(predict(scaled(base, y, slots0), runs, gpus_per_node, software), runs);
  };
  double x[kParams] = {0, 0, 0, 0, 0};
  double best = eval(x);
  int n[kParams];
  for (int k = 0; k < kParams; ++k) n[k] = is_free[k] ? static_cast<int>(hi[k] - lo[k]) + 1 : 1;
  for (int i = 0; i < n[0]; ++i)
    for (int j = 0; j < n[1]; ++j)
      for (int k = 0; k < n[2]; ++k)
        for (int q = 0; q < n[3]; ++q)
          for (int w = 0; w < n[4]; ++w) {
            const int idx[kParams] = {i, j, k, q, w};
            double y[kParams];
            for (int d = 0; d < kParams; ++d) y[d] = is_free[d] ? lo[d] + idx[d] : 0.0;
            const double l = eval(y);
            if (l < best) {
              best = l;
              std::copy(y, y + kParams, x);
            }
          }
  double step = 0.5;
  for (int it = 0; it < 2000 && step > 1e-5; ++it) {
    bool improved = false;
    for (int k = 0; k < kParams; ++k) {
      if (!is_free[k]) continue;
      for (double dir : {+1.0, -1.0}) {
        double y[kParams];
        std::copy(x, x + kParams, y);
        y[k] = std::clamp(y[k] + dir * step, lo_b[k], hi_b[k]);
        const double l = eval(y);
        if (l < best - 1e-15) {
          best = l;
          std::copy(y, y + kParams, x);
          improved = true;
          break;
        }
      }
    }
    if (!improved) step *= 0.5;
  }
  CalibrationResult r;
  r.gpu = scaled(base, x, slots0);
  r.compute_scale = std::exp(x[0]);
  r.bandwidth_scale = std::exp(x[1]);
  r.overhead_scale = std::exp(x[2]);
  r.latency_scale = std::exp(x[3]);
  r.compute_slots = r.gpu.compute_slots;
  r.free_parameters = free_hw + static_cast<int>(comm_params);
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
