// GPT training samples from one indexed dataset, with Megatron's index semantics
// (megatron.md section 3) so that the same seed visits samples in Megatron's order:
//   doc_idx     document (sequence) ids of the split, tiled over E epochs, shuffled;
//               a short final epoch is shuffled separately and appended
//   sample_idx  rows (position in doc_idx, token offset); sample j spans rows j..j+1
//               inclusive: seq_length+1 tokens across document boundaries, stride S
//   shuffle_idx permutation of samples (the separate final epoch's samples apart)
// The shuffles reproduce numpy's legacy RandomState(seed).shuffle bit for bit.
// Indices are cached on disk (temp file + rename) keyed by a hash of everything they
// depend on: dataset path, file sizes and mtimes, split, seed, seq_length, num_samples.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "data/indexed_dataset.hpp"

namespace mtnlg::data {

// numpy.random.RandomState(seed) for the operations Megatron uses: MT19937 seeded with
// init_genrand (== std::mt19937(seed)), and the legacy shuffle.
class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}
  // numpy's random_interval: uniform in [0, max] by masked rejection sampling.
  uint64_t random_interval(uint64_t max);
  // numpy's legacy 1-D shuffle: backward Fisher-Yates, j = random_interval(i).
  template <typename T>
  void shuffle(std::span<T> x) {
    for (int64_t i = static_cast<int64_t>(x.size()) - 1; i >= 1; --i) {
      const auto j = static_cast<int64_t>(random_interval(static_cast<uint64_t>(i)));
      std::swap(x[static_cast<size_t>(i)], x[static_cast<size_t>(j)]);
    }
  }

 private:
  std::mt19937 mt_;
};

// "969,30,1" -> three fractions summing to 1 (missing entries are 0). InputError on junk.
std::vector<double> parse_split(const std::string& split);
// Megatron-Core's split bounds over `n` sequences (blended_megatron_dataset_builder,
// since late 2023): part k is [round(b_k * n), round(b_{k+1} * n)), where b_0 = 0 and
// b_{k+1} = b_k + f_k are the cumulative bookends of the normalized fractions, summed
// left to right in doubles as Python does; round is Python's (half to even).
// (Legacy Megatron and Megatron-DeepSpeed round each part, sum, and shift the bounds so
// the last equals n; the two differ for about a quarter of counts under "969,30,1".)
std::vector<int64_t> split_bounds(const std::string& split, int64_t n);

struct GptIndices {
  std::vector<int32_t> doc_idx;
  std::vector<int64_t> sample_idx;   // flattened [rows][2]
  std::vector<int64_t> shuffle_idx;  // Megatron stores uint32 (int64 when >= 2^32-2 samples)
  int64_t num_epochs = 0;
  int64_t tokens_per_epoch = 0;
  bool separate_final_epoch = false;
  int64_t num_samples() const { return static_cast<int64_t>(sample_idx.size() / 2) - 1; }
};

// Builds the indices for documents [doc_begin, doc_end) of `sizes` (sequence lengths).
// num_samples < 0 is Megatron's num_samples=None: exactly one epoch.
// A part with fewer tokens than one sample (seq_length+1) is built as Megatron does:
// samples wrap over as many epochs as they need. Throws InputError naming the token
// counts when the part has no tokens at all, or needs more than 2^31 document entries.
// `what` names the dataset in messages.
GptIndices build_gpt_indices(std::span<const int32_t> sizes, int64_t doc_begin, int64_t doc_end, int64_t seq_length,
                             int64_t num_samples, uint32_t seed, const std::string& what);

// "" when `r` is a sound index for documents [doc_begin, doc_end) of `sizes` holding at
// least min_samples samples, else what is wrong (used to vet index caches read back).
std::string check_gpt_indices(const GptIndices& r, std::span<const int32_t> sizes, int64_t doc_begin, int64_t doc_end,
                              int64_t seq_length, int64_t min_samples);

struct GptDatasetConfig {
  int64_t seq_length = 0;
  int64_t num_samples = 0;  // requested; the dataset may hold more (whole epochs)
  uint32_t seed = 1234;
  std::string split = "969,30,1";
  int split_index = 0;    // 0 train, 1 valid, 2 test
  std::string cache_dir;  // "" = no on-disk cache
};

class GptDataset {
 public:
  // Throws InputError when the split part is empty or shorter than one sample.
  GptDataset(std::shared_ptr<const IndexedDataset> ds, const GptDatasetConfig& cfg);
  int64_t size() const { return idx_.num_samples(); }
  int64_t seq_length() const { return cfg_.seq_length; }
  // seq_length+1 token ids of sample i (after shuffling), into out.
  void sample(int64_t i, int32_t* out) const;
  // The sequence ids (document ids in the .idx) that sample i's tokens come from, in order.
  std::vector<int64_t> documents(int64_t i) const;
  // [begin, end) sequences of this split part.
  std::pair<int64_t, int64_t> part_range() const { return range_; }
  const GptIndices& indices() const { return idx_; }
  const IndexedDataset& dataset() const { return *ds_; }
  bool loaded_from_cache() const { return from_cache_; }
  const std::string& cache_file() const { return cache_file_; }

 private:
  std::shared_ptr<const IndexedDataset> ds_;
  GptDatasetConfig cfg_;
  GptIndices idx_;
  bool from_cache_ = false;
  std::string cache_file_;
  std::pair<int64_t, int64_t> range_{0, 0};
};

// Stable 64-bit FNV-1a (cache keys must not depend on the standard library's hash).
uint64_t fnv1a64(std::string_view s);

}  // namespace mtnlg::data
