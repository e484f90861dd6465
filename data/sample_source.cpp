// Sample sources and the per-rank loader (see sample_source.hpp).
#include "data/sample_source.hpp"

#include <filesystem>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "data/blended_dataset.hpp"
#include "data/gpt_dataset.hpp"
#include "data/indexed_dataset.hpp"
#include "schedules/batch_schedule.hpp"

namespace mtnlg::data {

namespace {

constexpr uint64_t kMockPurpose = 0x6D6F636B64617461ull;  // "mockdata"

class MockSource : public SampleSource {
 public:
  MockSource(int64_t vocab, int64_t seq, uint64_t seed) : vocab_(vocab), seq_(seq), key_(mix_key(seed, kMockPurpose)) {}
  int64_t size() const override { return int64_t{1} << 62; }
  int64_t seq_length() const override { return seq_; }
  void sample(int64_t index, int32_t* out) const override {
    const uint64_t i = static_cast<uint64_t>(index) % static_cast<uint64_t>(size());
    for (int64_t k = 0; k <= seq_; ++k) {
      const uint64_t bits = philox_bits(key_, i, static_cast<uint64_t>(k));
      out[k] = static_cast<int32_t>((bits * static_cast<uint64_t>(vocab_)) >> 32);  // uniform in [0, vocab)
    }
  }

 private:
  int64_t vocab_, seq_;
  uint64_t key_;
};

class BlendSource : public SampleSource {
 public:
  BlendSource(std::unique_ptr<BlendedDataset> b, std::vector<std::string> names, int64_t seq, int64_t vocab)
      : blend_(std::move(b)), names_(std::move(names)), seq_(seq), vocab_(vocab) {}
  int64_t size() const override { return blend_->size(); }
  int64_t seq_length() const override { return seq_; }
  void sample(int64_t index, int32_t* out) const override {
    if (index < 0 || index >= size())
      throw_runtime("sample {} requested from a blend built for {} samples", index, size());
    blend_->sample(index, out);
    // Token ids index the embedding: one outside [0, vocab) is bad data, not a crash or
    // a silent read of another row. Checked per sample (seq_length+1 compares).
    for (int64_t k = 0; k <= seq_; ++k)
      if (out[k] < 0 || out[k] >= vocab_) {
        const int src = blend_->source_of(index);
        const std::string file =
            src >= 0 && src < static_cast<int>(names_.size()) ? bin_path(names_[static_cast<size_t>(src)]) : "the data";
        throw_input(
            "{}: token id {} in sample {} is outside the vocabulary (model.vocab_size {}): the data was "
            "tokenized for another vocabulary",
            file, out[k], index, vocab_);
      }
  }
  int source_of(int64_t index) const override { return blend_->source_of(index); }
  std::vector<std::string> source_names() const override { return names_; }
  std::vector<int64_t> documents_of(int64_t index) const override {
    if (index < 0 || index >= size())
      throw_runtime("sample {} requested from a blend built for {} samples", index, size());
    const auto& bi = blend_->index();
    return blend_->sources()[static_cast<size_t>(bi.dataset_index[static_cast<size_t>(index)])]->documents(
        bi.dataset_sample_index[static_cast<size_t>(index)]);
  }

 private:
  std::unique_ptr<BlendedDataset> blend_;
  std::vector<std::string> names_;
  int64_t seq_, vocab_;
};

// Megatron's unweighted single `--data-path PREFIX`: the GPT dataset itself, no blend.
class SingleSource : public SampleSource {
 public:
  SingleSource(std::shared_ptr<const GptDataset> d, std::string name) : ds_(std::move(d)), name_(std::move(name)) {}
  int64_t size() const override { return ds_->size(); }
  int64_t seq_length() const override { return ds_->seq_length(); }
  void sample(int64_t index, int32_t* out) const override {
    check(index);
    ds_->sample(index, out);
  }
  std::vector<std::string> source_names() const override { return {name_}; }
  std::vector<int64_t> documents_of(int64_t index) const override {
    check(index);
    return ds_->documents(index);
  }

 private:
  void check(int64_t index) const {
    if (index < 0 || index >= size())
      throw_runtime("sample {} requested from {}, which holds {} samples", index, name_, size());
  }
  std::shared_ptr<const GptDataset> ds_;
  std::string name_;
};

}  // namespace

std::unique_ptr<SampleSource> make_mock_source(int64_t vocab_size, int64_t seq_length, uint64_t seed) {
  MTNLG_CHECK(vocab_size > 0 && seq_length > 0, "mock source vocab {} seq {}", vocab_size, seq_length);
  return std::make_unique<MockSource>(vocab_size, seq_length, seed);
}

std::unique_ptr<SampleSource> make_blend_source(const BlendSpec& spec, int split_index, int64_t num_samples,
                                                const std::string& cache_dir) {
  MTNLG_CHECK(split_index >= 0 && split_index < 3, "split index {}", split_index);
  MTNLG_CHECK(num_samples >= 0, "num_samples {}", num_samples);
  const auto& blend = spec.blend;
  std::vector<double> raw;
  for (const auto& s : blend) raw.push_back(s.weight);
  const auto w = normalize_weights(raw);
  for (size_t i = 0; i < blend.size(); ++i)
    if (!blend[i].weighted && blend.size() > 1)
      throw_input("data.blend[{}] ({}) has no weight: a blend of several sources needs a weight on every entry", i,
                  blend[i].prefix);
  for (size_t i = 0; i < blend.size(); ++i)
    if (!indexed_dataset_exists(blend[i].prefix))
      throw_input("data.blend[{}].prefix: '{}' not found (needs {} and {}; run `mtnlg data preprocess`)", i,
                  blend[i].prefix, idx_path(blend[i].prefix), bin_path(blend[i].prefix));
  if (spec.seed < 0 || spec.seed > 0xffffffffll)
    throw_input("training.seed: {} is not valid for data shuffling (numpy's RandomState takes 0..4294967295)",
                spec.seed);
  auto config = [&](int64_t n) {
    GptDatasetConfig cfg;
    cfg.seq_length = spec.seq_length;
    cfg.num_samples = n;
    cfg.seed = static_cast<uint32_t>(spec.seed);
    cfg.split = spec.split;
    cfg.split_index = split_index;
    cfg.cache_dir = cache_dir;
    return cfg;
  };
  if (blend.size() == 1 && !blend[0].weighted) {
    auto ds = std::make_shared<const IndexedDataset>(blend[0].prefix);
    return std::make_unique<SingleSource>(std::make_shared<const GptDataset>(ds, config(num_samples)), blend[0].prefix);
  }
  const auto per_source = blend_source_samples(w, num_samples);
  std::vector<std::shared_ptr<const GptDataset>> sources;
  std::vector<std::string> names;
  for (size_t i = 0; i < blend.size(); ++i) {
    auto ds = std::make_shared<const IndexedDataset>(blend[i].prefix);
    sources.push_back(std::make_shared<const GptDataset>(ds, config(per_source[i])));
    names.push_back(blend[i].prefix);
  }
  auto b = std::make_unique<BlendedDataset>(std::move(sources), w, num_samples);
  return std::make_unique<BlendSource>(std::move(b), std::move(names), spec.seq_length, spec.vocab_size);
}

std::array<int64_t, 3> split_num_samples(const TrainingConfig& t, int64_t seq_length) {
  const auto run = schedules::run_length(t, seq_length);
  const int64_t evals = t.eval_interval > 0 ? run.iterations / t.eval_interval + 1 : 1;
  return {run.samples, evals * t.eval_iters * t.global_batch_size, t.eval_iters * t.global_batch_size};
}

bool split_part_present(const std::string& split, int k) {
  MTNLG_CHECK(k >= 0 && k < 3, "split part {}", k);
  return parse_split(split)[static_cast<size_t>(k)] > 0.0;
}

// ----- loader --------------------------------------------------------------------------
Loader::Loader(std::shared_ptr<const SampleSource> src, int64_t micro_batch_size, int64_t dp_rank, int64_t dp_size)
    : src_(std::move(src)), mbs_(micro_batch_size), dp_rank_(dp_rank), dp_size_(dp_size) {
  MTNLG_CHECK(src_ && mbs_ > 0 && dp_size_ > 0 && dp_rank_ >= 0 && dp_rank_ < dp_size_, "loader mbs {} dp {}/{}", mbs_,
              dp_rank_, dp_size_);
}

Loader::~Loader() {
  std::lock_guard<std::mutex> lk(mu_);
  if (pending_.valid()) pending_.wait();
}

Batch Loader::build(int64_t consumed, int64_t gbs) const {
  const int64_t step = mbs_ * dp_size_;
  if (gbs <= 0 || gbs % step != 0)
    throw_runtime("global batch {} is not a multiple of micro_batch_size*dp = {}", gbs, step);
  Batch b;
  b.global_batch_size = gbs;
  b.micro_batches = gbs / step;
  b.micro_batch_size = mbs_;
  b.seq_length = src_->seq_length();
  b.consumed_samples = consumed;
  const int64_t row = b.seq_length + 1;
  b.tokens.resize(static_cast<size_t>(b.micro_batches * mbs_ * row));
  int32_t* out = b.tokens.data();
  for (int64_t k = 0; k < b.micro_batches; ++k)
    for (int64_t s = 0; s < mbs_; ++s) {
      src_->sample(consumed + k * step + dp_rank_ * mbs_ + s, out);
      out += row;
    }
  b.per_source_samples.assign(src_->source_names().size(), 0);
  for (int64_t i = 0; i < gbs; ++i) {
    const int d = src_->source_of(consumed + i);
    if (d >= 0 && d < static_cast<int>(b.per_source_samples.size())) ++b.per_source_samples[static_cast<size_t>(d)];
  }
  return b;
}

void Loader::prefetch(int64_t consumed, int64_t gbs) {
  std::lock_guard<std::mutex> lk(mu_);
  if (pending_.valid()) {
    if (pending_consumed_ == consumed && pending_gbs_ == gbs) return;
    pending_.wait();  // an unwanted batch: let it finish, then replace it
  }
  pending_consumed_ = consumed;
  pending_gbs_ = gbs;
  pending_ = std::async(std::launch::async, [this, consumed, gbs] { return build(consumed, gbs); });
}

Batch Loader::get(int64_t consumed, int64_t gbs) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (pending_.valid()) {
      const bool match = pending_consumed_ == consumed && pending_gbs_ == gbs;
      pending_consumed_ = pending_gbs_ = -1;
      if (match) return pending_.get();  // rethrows a failure from the background build
      try {
        pending_.get();  // not the batch asked for: its outcome does not matter
      } catch (const std::exception&) {}
    }
  }
  return build(consumed, gbs);
}

}  // namespace mtnlg::data
