// Blended datasets (see blended_dataset.hpp).
#include "data/blended_dataset.hpp"

#include <cmath>

#include "core/error.hpp"

namespace mtnlg::data {

std::vector<double> normalize_weights(std::span<const double> weights) {
  if (weights.empty()) throw_input("data.blend: no sources (add {{weight, prefix}} entries or set data.mock: true)");
  double sum = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] > 0) || !std::isfinite(weights[i]))
      throw_input("data.blend[{}].weight: {} is not valid (expected a positive number)", i, weights[i]);
    sum += weights[i];
  }
  std::vector<double> w(weights.begin(), weights.end());
  for (auto& x : w) x /= sum;
  return w;
}

std::vector<int64_t> blend_source_samples(std::span<const double> w, int64_t n) {
  std::vector<int64_t> out;
  for (double x : w) out.push_back(static_cast<int64_t>(std::ceil(std::ceil(static_cast<double>(n) * x) * 1.005)));
  return out;
}

BlendIndex build_blend_index(std::span<const double> w, int64_t size) {
  MTNLG_CHECK(!w.empty() && w.size() <= 32767, "{} blend sources", w.size());
  BlendIndex b;
  const size_t k = w.size();
  b.dataset_index.resize(static_cast<size_t>(size));
  b.dataset_sample_index.resize(static_cast<size_t>(size));
  b.counts.assign(k, 0);
  for (int64_t i = 0; i < size; ++i) {
    const double at = std::max(static_cast<double>(i), 1.0);
    size_t best = 0;
    double best_err = w[0] * at - static_cast<double>(b.counts[0]);
    for (size_t d = 1; d < k; ++d) {
      const double err = w[d] * at - static_cast<double>(b.counts[d]);
      if (err > best_err) {
        best_err = err;
        best = d;
      }
    }
    b.dataset_index[static_cast<size_t>(i)] = static_cast<int16_t>(best);
    b.dataset_sample_index[static_cast<size_t>(i)] = b.counts[best]++;
  }
  return b;
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const GptDataset>> sources,
                               std::vector<double> normalized_weights, int64_t size)
    : sources_(std::move(sources)), weights_(std::move(normalized_weights)), size_(size) {
  MTNLG_CHECK(sources_.size() == weights_.size(), "{} sources, {} weights", sources_.size(), weights_.size());
  index_ = build_blend_index(weights_, size_);
  for (size_t d = 0; d < sources_.size(); ++d)
    if (index_.counts[d] > sources_[d]->size())
      throw_runtime("blend source {} ({}) would be oversampled: {} samples needed, {} built", d,
                    sources_[d]->dataset().prefix(), index_.counts[d], sources_[d]->size());
}

void BlendedDataset::sample(int64_t i, int32_t* out) const {
  MTNLG_CHECK(i >= 0 && i < size_, "blend sample {} of {}", i, size_);
  sources_[static_cast<size_t>(index_.dataset_index[static_cast<size_t>(i)])]->sample(
      index_.dataset_sample_index[static_cast<size_t>(i)], out);
}

}  // namespace mtnlg::data
