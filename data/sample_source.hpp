// What the trainer consumes: training samples by global sample index (SampleSource)
// and this data-parallel rank's slice of each global batch (Loader).
//  - Mock source: tokens are a pure function of (seed, index) (Philox), so every layout
//    and a resumed run see the same data without files.
//  - Blend source: a blend (the recipe's data.blend) over Megatron .bin/.idx prefixes, one
//    split part, with Megatron's index and blend semantics (gpt_dataset.hpp, blended_dataset.hpp).
//  - Loader: Megatron's sampler. The global batch starting at consumed_samples covers
//    indices [consumed, consumed+gbs); micro batch k of dp rank r takes
//    consumed + k*mbs*dp + r*mbs ... +mbs. Resume needs only consumed_samples.
#pragma once
#include <array>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/data.hpp"
#include "config/training.hpp"

namespace mtnlg::data {

// Training samples by global sample index: seq_length+1 token ids each
// (tokens = first S, labels = last S). sample() is const and thread-safe.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;  // samples available
  virtual int64_t seq_length() const = 0;
  virtual void sample(int64_t index, int32_t* out /* seq_length+1 */) const = 0;
  virtual int source_of(int64_t /*index*/) const { return 0; }  // blend source of a sample
  virtual std::vector<std::string> source_names() const { return {"mock"}; }
  // Document (sequence) ids of the source's .idx that a sample's tokens come from, in
  // order; empty for the mock source.
  virtual std::vector<int64_t> documents_of(int64_t /*index*/) const { return {}; }
};

// Mock: token k of sample i is uniform in [0, vocab_size) from Philox keyed by the seed.
// size() is 2^62; indices wrap modulo size().
std::unique_ptr<SampleSource> make_mock_source(int64_t vocab_size, int64_t seq_length, uint64_t seed);

// What a blend source is built from (the app makes it from a recipe: app::blend_spec in
// app/process/module_configs.hpp).
struct BlendSpec {
  std::vector<mtnlg::BlendSource> blend;  // data.blend
  std::string split;                      // data.split
  int64_t seq_length = 0;                 // model.seq_length
  int64_t vocab_size = 0;                 // model.vocab_size
  int64_t seed = 0;                       // training.seed: the shuffles' seed, 0..2^32-1
};

// The blend of `spec`, split part `split_index` (0 train, 1 valid, 2 test), built for
// `num_samples` samples; index caches under cache_dir ("" = none). Throws InputError for
// a missing prefix, a split that leaves a part empty or without tokens.
//  - A single source without a weight (data.path, or a blend of one entry without
//    weight) is Megatron's unweighted `--data-path PREFIX`: the GPT dataset built for
//    exactly num_samples, read in its own order; size() is all the samples of its
//    epochs (>= num_samples).
//  - Otherwise (weighted entries, `--data-path W1 P1 ...`, one entry too) a blend:
//    each source built for ceil(ceil(n w) 1.005) samples, interleaved;
//    size() == num_samples.
// sample() beyond size() is a RuntimeError.
std::unique_ptr<SampleSource> make_blend_source(const BlendSpec& spec, int split_index, int64_t num_samples,
                                                const std::string& cache_dir);

// Samples Megatron asks each split part for (train, valid, test), for a run of `t` at
// `seq_length` tokens per sample:
//   train = the run's samples (schedules::run_length)
//   valid = (iterations / eval_interval + 1) * eval_iters * global_batch_size
//           (eval_interval 0: one evaluation, eval_iters * global_batch_size)
//   test  = eval_iters * global_batch_size
std::array<int64_t, 3> split_num_samples(const TrainingConfig& t, int64_t seq_length);

// Whether split part k (0 train, 1 valid, 2 test) exists: Megatron-Core builds no
// dataset for a part whose fraction is 0.
bool split_part_present(const std::string& split, int k);

struct Batch {
  int64_t global_batch_size = 0;
  int64_t micro_batches = 0;
  int64_t micro_batch_size = 0;
  int64_t seq_length = 0;
  std::vector<int32_t> tokens;              // [micro_batches * micro_batch_size, seq_length+1] for this dp rank
  std::vector<int64_t> per_source_samples;  // samples of the WHOLE global batch per blend source
  int64_t consumed_samples = 0;             // where this batch starts
};

class Loader {
 public:
  Loader(std::shared_ptr<const SampleSource> src, int64_t micro_batch_size, int64_t dp_rank, int64_t dp_size);
  ~Loader();
  // The global batch [consumed, consumed+gbs): this rank's micro batches. gbs must be a
  // multiple of micro_batch_size*dp_size (RuntimeError otherwise: the recipe validation
  // should have caught it). Uses the prefetched batch when it matches.
  Batch get(int64_t consumed_samples, int64_t global_batch_size);
  // Starts building that batch on a background thread.
  void prefetch(int64_t consumed_samples, int64_t global_batch_size);

  // Builds a batch synchronously (what get() and the prefetch thread run).
  Batch build(int64_t consumed_samples, int64_t global_batch_size) const;

 private:
  std::shared_ptr<const SampleSource> src_;
  int64_t mbs_, dp_rank_, dp_size_;
  std::mutex mu_;
  std::future<Batch> pending_;
  int64_t pending_consumed_ = -1, pending_gbs_ = -1;
};

}  // namespace mtnlg::data
