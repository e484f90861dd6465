// Harness metrics (metrics.hpp).
#include "data/eval/metrics.hpp"

#include <cmath>
#include <limits>

#include "data/eval/py_random.hpp"
#include "data/eval/tasks.hpp"

namespace mtnlg::data::eval {

double mean(const std::vector<double>& xs) {
  if (xs.empty()) return std::numeric_limits<double>::quiet_NaN();
  double s = 0;
  for (double x : xs) s += x;  // left to right, as Python's sum
  return s / static_cast<double>(xs.size());
}

double sample_stddev(const std::vector<double>& xs) {
  if (xs.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  const double mu = mean(xs);
  double s = 0;
  for (double x : xs) s += (x - mu) * (x - mu);
  return std::sqrt(s / static_cast<double>(xs.size() - 1));
}

double mean_stderr(const std::vector<double>& xs) {
  return sample_stddev(xs) / std::sqrt(static_cast<double>(xs.size()));
}

double perplexity(const std::vector<double>& lls) { return std::exp(-mean(lls)); }

double bootstrap_perplexity_stderr(const std::vector<double>& lls, int64_t iters) {
  if (lls.empty() || iters < 2) return std::numeric_limits<double>::quiet_NaN();
  const int64_t chunk = std::min<int64_t>(1000, iters), chunks = iters / chunk, n = static_cast<int64_t>(lls.size());
  std::vector<double> reps(static_cast<size_t>(chunks * chunk));
#pragma omp parallel for schedule(dynamic)
  for (int64_t c = 0; c < chunks; ++c) {
    PyRandom rnd(c);
    const double dn = static_cast<double>(n);
    for (int64_t r = 0; r < chunk; ++r) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += lls[static_cast<size_t>(std::floor(rnd.random() * dn))];
      reps[static_cast<size_t>(c * chunk + r)] = std::exp(-(s / dn));
    }
  }
  return sample_stddev(reps);
}

int64_t argmax(const std::vector<double>& xs) {
  int64_t best = 0;
  for (size_t i = 1; i < xs.size(); ++i)
    if (xs[i] > xs[static_cast<size_t>(best)] || (std::isnan(xs[i]) && !std::isnan(xs[static_cast<size_t>(best)])))
      best = static_cast<int64_t>(i);
  return best;
}

std::vector<double> length_normalized(const std::vector<double>& lls, const std::vector<std::string>& choices) {
  std::vector<double> out(lls.size());
  for (size_t i = 0; i < lls.size(); ++i) out[i] = lls[i] / static_cast<double>(utf8_length(choices.at(i)));
  return out;
}

}  // namespace mtnlg::data::eval
