// Blends of GPT datasets with Megatron's semantics (megatron.md section 3):
// weights are sample proportions, normalized to sum to 1; source d is built for
// ceil(ceil(n*w_d)*1.005) samples; output sample i comes from the source with the
// largest error w_d*max(i,1) - count_d (strict >, ties to the lowest index), which
// keeps every prefix of the blend as close to the weights as possible.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/gpt_dataset.hpp"

namespace mtnlg::data {

// Normalizes weights to sum 1; InputError when one is not positive and finite.
std::vector<double> normalize_weights(std::span<const double> weights);
// Samples to build per source for a blend of n samples: ceil(ceil(n*w)*1.005).
std::vector<int64_t> blend_source_samples(std::span<const double> normalized_weights, int64_t n);

struct BlendIndex {
  std::vector<int16_t> dataset_index;         // source of output sample i
  std::vector<int64_t> dataset_sample_index;  // sample within that source
  std::vector<int64_t> counts;                // samples taken per source
};
// Megatron's greedy error-minimising interleave of `size` samples.
BlendIndex build_blend_index(std::span<const double> normalized_weights, int64_t size);

class BlendedDataset {
 public:
  // RuntimeError if a source would be oversampled beyond its size.
  BlendedDataset(std::vector<std::shared_ptr<const GptDataset>> sources, std::vector<double> normalized_weights,
                 int64_t size);
  int64_t size() const { return size_; }
  void sample(int64_t i, int32_t* out) const;
  int source_of(int64_t i) const { return index_.dataset_index[static_cast<size_t>(i)]; }
  const BlendIndex& index() const { return index_; }
  const std::vector<std::shared_ptr<const GptDataset>>& sources() const { return sources_; }

 private:
  std::vector<std::shared_ptr<const GptDataset>> sources_;
  std::vector<double> weights_;
  int64_t size_;
  BlendIndex index_;
};

}  // namespace mtnlg::data
