// `mtnlg plan --calibrate`: fit a GPU description's constants to measured step times, so
// that the planner predicts the user's own machine (docs/PLANNER.md "Calibration").
#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "planner/cost_model.hpp"

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

// The log-multipliers' search ranges: the coarse grid (factors e^-4 .. e^4; the latency
// e^-2 .. e^10: on a loaded machine a message waits for a time slice, milliseconds against
// the microseconds of an idle one; the slots e^-3 .. e^1) and the bounds of the coordinate
// search (e^+-6, latency e^-4 .. e^12, slots e^-4 .. e^3), so that a constant the runs
// cannot see (a roofline term that never binds) does not run away. A physical fit narrows
// the bounds (and with them the grid) to physical ranges.
struct SearchBounds {
  double lo[kParams] = {-4, -4, -4, -2, -3}, hi[kParams] = {4, 4, 4, 10, 1};
  double lo_b[kParams] = {-6, -6, -6, -4, -4}, hi_b[kParams] = {6, 6, 6, 12, 3};
};

// Coarse grid over the free log-multipliers, then coordinate search with halving steps from
// the best grid point, within the bounds. `x` starts at 0 (no change; brought inside the
// bounds) and ends at the best point found.
template <class Loss>
void search_multipliers(const Loss& eval, const bool (&is_free)[kParams], const SearchBounds& b, double (&x)[kParams]) {
  for (int k = 0; k < kParams; ++k) x[k] = is_free[k] ? std::clamp(x[k], b.lo_b[k], b.hi_b[k]) : x[k];
  double best = eval(x);
  int n[kParams];
  for (int k = 0; k < kParams; ++k) n[k] = is_free[k] ? static_cast<int>(b.hi[k] - b.lo[k]) + 1 : 1;
  for (int i = 0; i < n[0]; ++i)
    for (int j = 0; j < n[1]; ++j)
      for (int k = 0; k < n[2]; ++k)
        for (int q = 0; q < n[3]; ++q)
          for (int w = 0; w < n[4]; ++w) {
            const int idx[kParams] = {i, j, k, q, w};
            double y[kParams];
            for (int d = 0; d < kParams; ++d)
              y[d] = is_free[d] ? std::clamp(b.lo[d] + idx[d], b.lo_b[d], b.hi_b[d]) : x[d];
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
        y[k] = std::clamp(y[k] + dir * step, b.lo_b[k], b.hi_b[k]);
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
  // A physical base (a GPU with its data sheet's bandwidth): the GEMM efficiency stays a
  // fraction of peak (<= 1), the bandwidth at most the data sheet's, the kernel overhead in
  // kKernelOverheadRange; and the hardware multipliers are regularised toward the base's
  // sourced constants (a Gaussian prior on their logs, widths kCalibrationPriorWidth against
  // kCalibrationRunSigma per run), so that directions the runs cannot tell apart (a slower
  // GEMM against a faster memory) stay where the sources put them. The `cpu` entry is only
  // a starting point: its fits stay free.
  const bool physical = base.hbm_peak_bw > 0;
  SearchBounds bounds;
  double prior_w[kParams] = {0, 0, 0, 0, 0};
  if (physical) {
    const double b_lo[3] = {-6, -6, std::log(kKernelOverheadRange[0] / base.kernel_overhead)};
    const double b_hi[3] = {std::log(1.0 / base.gemm_eff_max), std::log(base.hbm_peak_bw / base.hbm_bw),
                            std::log(kKernelOverheadRange[1] / base.kernel_overhead)};
    for (int k = 0; k < 3; ++k) {
      bounds.lo_b[k] = b_lo[k];
      bounds.hi_b[k] = std::max(b_lo[k], b_hi[k]);
      const double w = kCalibrationRunSigma / kCalibrationPriorWidth[k];
      prior_w[k] = w * w;
    }
  }
  auto eval = [&](const double y[kParams]) {
    double l = loss(predict(scaled(base, y, slots0), runs, gpus_per_node, software), runs);
    for (int k = 0; k < kParams; ++k) l += prior_w[k] * y[k] * y[k];
    return l;
  };
  double x[kParams] = {0, 0, 0, 0, 0};
  search_multipliers(eval, is_free, bounds, x);
  CalibrationResult r;
  r.gpu = scaled(base, x, slots0);
  r.compute_scale = std::exp(x[0]);
  r.bandwidth_scale = std::exp(x[1]);
  r.overhead_scale = std::exp(x[2]);
  r.latency_scale = std::exp(x[3]);
  r.compute_slots = r.gpu.compute_slots;
  r.free_parameters = free_hw + static_cast<int>(comm_params);
  r.physical = physical;
  if (physical) {
    const char* names[3] = {"GEMM efficiency (at most 1 of peak)", "memory bandwidth (at most the data sheet's)",
                            "kernel overhead"};
    for (int k = 0; k < 3; ++k)
      if (is_free[k] && (x[k] >= bounds.hi_b[k] - 1e-9 || x[k] <= bounds.lo_b[k] + 1e-9))
        r.at_bound.push_back(names[k]);
  }
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

// ---- kernel calibration: GEMM curve and fused-attention rates (`plan --calibrate BENCH.json`) ----

namespace mtnlg::cost {

namespace {

double rms_log(const std::vector<double>& pred, const std::vector<double>& meas) {
  double s = 0;
  for (size_t i = 0; i < pred.size(); ++i) {
    const double d = pred[i] / meas[i] - 1.0;
    s += d * d;
  }
  return pred.empty() ? 0 : std::sqrt(s / double(pred.size()));
}

// Geometric grid from lo to hi (n points), with 0 first when `zero`.
std::vector<double> geo(double lo, double hi, int n, bool zero) {
  std::vector<double> v;
  if (zero) v.push_back(0);
  for (int i = 0; i < n; ++i) v.push_back(lo * std::pow(hi / lo, double(i) / double(n - 1)));
  return v;
}

}  // namespace

namespace {

void check_kernel_samples(const std::vector<GemmSample>& gemms, const std::vector<AttentionSample>& attention) {
  if (gemms.empty() && attention.empty())
    throw_input("calibrate: the benchmark file has no GEMM and no attention samples");
  for (auto& x : gemms)
    if (!(x.seconds > 0) || x.m <= 0 || x.n <= 0 || x.k <= 0 || x.batch <= 0)
      throw_input("calibrate: GEMM {}x{}x{}: sizes and seconds must be positive", x.m, x.n, x.k);
  for (auto& x : attention)
    if (!(x.fwd_seconds > 0) || !(x.bwd_seconds > 0) || x.seq <= 0 || x.head_dim <= 0 || x.batch_heads <= 0)
      throw_input("calibrate: attention seq {} head dim {}: sizes and seconds must be positive", x.seq, x.head_dim);
}

// Sum of squared log(predicted / measured) over the GEMM samples; stops adding once past
// `stop` (a grid point that cannot win).
double gemm_loss(const GpuSpec& t, const std::vector<GemmSample>& gemms, double stop = 1e300) {
  double l = 0;
  for (auto& x : gemms) {
    const double d = std::log(gemm_seconds(t, x.m, x.n, x.k, x.batch) / x.seconds);
    l += d * d;
    if (l >= stop) break;
  }
  return l;
}

// The GEMM curve's three constants (efficiency ceiling, reduction-length half point,
// per-kernel overhead): a grid, then coordinate search on the logs from its best point
// (step halved when no move helps). Writes them into g and the fit's predictions.
void fit_gemm_curve(GpuSpec& g, const std::vector<GemmSample>& gemms, KernelFit& fit) {
  double best = 1e300;
  GpuSpec trial = g;
  for (double kh : geo(8, 8192, 31, true))
    for (double ov : geo(0.3e-6, 60e-6, 25, false))
      for (double eff = 0.20; eff <= 1.0001; eff += 0.005) {
        trial.gemm_k_half = kh;
        trial.kernel_overhead = ov;
        trial.gemm_eff_max = eff;
        const double l = gemm_loss(trial, gemms, best);
        if (l < best) {
          best = l;
          g.gemm_k_half = kh;
          g.kernel_overhead = ov;
          g.gemm_eff_max = eff;
        }
      }
  double step = 0.2;
  for (int it = 0; it < 200 && step > 1e-4; ++it) {
    bool moved = false;
    for (int p = 0; p < 3; ++p)
      for (double dir : {1.0, -1.0}) {
        GpuSpec t = g;
        double* v = p == 0 ? &t.gemm_eff_max : p == 1 ? &t.gemm_k_half : &t.kernel_overhead;
        *v = (*v > 0 ? *v : 1.0) * std::exp(dir * step);
        if (t.gemm_eff_max > 1.0) continue;
        const double l = gemm_loss(t, gemms);
        if (l < best) {
          best = l;
          g = t;
          moved = true;
        }
      }
    if (!moved) step *= 0.5;
  }
  std::vector<double> meas;
  for (auto& x : gemms) {
    fit.gemm_predicted.push_back(gemm_seconds(g, x.m, x.n, x.k, x.batch));
    meas.push_back(x.seconds);
  }
  fit.gemm_rms = rms_log(fit.gemm_predicted, meas);
}

// The attention rate a sample implies for given half points (the kernel overhead taken
// off first), in the units of attn_fwd_flops / attn_bwd_flops.
double implied_attention_rate(const GpuSpec& g, const AttentionSample& x, bool bwd, double sh, double dh) {
  const double work =
      4.0 * double(x.seq) * double(x.seq) * double(x.head_dim) * double(x.batch_heads) * 0.5 * (bwd ? 2.5 : 1.0);
  const double t = std::max((bwd ? x.bwd_seconds : x.fwd_seconds) - g.kernel_overhead, 1e-12);
  const double ramp = double(x.seq) / (double(x.seq) + sh);
  const double dim = (double(x.head_dim) / (double(x.head_dim) + dh)) / (128.0 / (128.0 + dh));
  return work / t / (ramp * dim);
}

// The attention constants: for given half points the best rate is the geometric mean of
// the samples' implied rates, so a grid over the two half points decides.
void fit_attention(GpuSpec& g, const std::vector<AttentionSample>& attention, KernelFit& fit) {
  double best = 1e300;
  for (double sh : geo(16, 16384, 41, true))
    for (double dh : geo(4, 4096, 31, true)) {
      double l = 0, rates[2] = {0, 0};
      for (int bwd = 0; bwd < 2; ++bwd) {
        double mean = 0;
        for (auto& x : attention) mean += std::log(implied_attention_rate(g, x, bwd != 0, sh, dh));
        mean /= double(attention.size());
        rates[bwd] = std::exp(mean);
        for (auto& x : attention) {
          const double d = std::log(implied_attention_rate(g, x, bwd != 0, sh, dh)) - mean;
          l += d * d;
        }
      }
      if (l < best) {
        best = l;
        g.attn_seq_half = sh;
        g.attn_dim_half = dh;
        g.attn_fwd_flops = rates[0];
        g.attn_bwd_flops = rates[1];
      }
    }
  std::vector<double> pred, meas;
  for (auto& x : attention) {
    fit.attention_fwd_predicted.push_back(attention_seconds(g, x.seq, x.head_dim, x.batch_heads, false));
    fit.attention_bwd_predicted.push_back(attention_seconds(g, x.seq, x.head_dim, x.batch_heads, true));
    pred.push_back(fit.attention_fwd_predicted.back());
    pred.push_back(fit.attention_bwd_predicted.back());
    meas.push_back(x.fwd_seconds);
    meas.push_back(x.bwd_seconds);
  }
  fit.attention_rms = rms_log(pred, meas);
}

}  // namespace

KernelFit calibrate_kernels(const GpuSpec& base, const std::vector<GemmSample>& gemms,
                            const std::vector<AttentionSample>& attention) {
  check_kernel_samples(gemms, attention);
  KernelFit fit;
  fit.gpu = base;
  if (!gemms.empty()) fit_gemm_curve(fit.gpu, gemms, fit);
  if (!attention.empty()) fit_attention(fit.gpu, attention, fit);
  return fit;
}

}  // namespace mtnlg::cost
