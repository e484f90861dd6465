// Quality classifier for web text, in the spirit of the GPT-3 paper (appendix A):
// logistic regression over hashed word n-gram features, positives = curated text,
// negatives = raw crawl; documents are then kept by a score threshold or by GPT-3's
// Pareto sampling (keep if pareto(alpha) > 1 - score).
//
// Features: the normalised words (text.hpp) give unigrams and bigrams; each is hashed
// into 2^bucket_bits buckets (default 2^20). A document's feature vector is the set of
// distinct buckets, each with value 1/sqrt(#buckets) (L2-normalised, so long and short
// documents train at the same scale). The model is P(curated) = sigmoid(b + w.x),
// trained by plain SGD (shuffled every epoch with the seeded counter RNG).
//
// Model file (little-endian, version 1): "MTNLGQLM" magic, u32 version, u32
// bucket_bits, u32 max_ngram, u32 reserved, u64 hash_seed, f32 bias,
// f32 weights[2^bucket_bits], u32 CRC-32 of all preceding bytes. Loading checks the
// magic, version, sizes and CRC and reports a corrupt file as InputError (exit 2).
#pragma once
#include <nlohmann/json.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/curation/ranks.hpp"

namespace mtnlg::curation {

class QualityModel {
 public:
  static constexpr uint32_t kVersion = 1;
  QualityModel() = default;
  QualityModel(int64_t bucket_bits, uint64_t hash_seed);

  // Sorted distinct bucket indices of a text's unigrams and bigrams.
  void features(std::string_view text, std::vector<uint32_t>& out) const;
  double score_features(const std::vector<uint32_t>& f) const;  // P(curated)
  double score(std::string_view text) const;
  // One SGD step on (features, label in {0,1}); returns the loss before the step.
  double sgd_step(const std::vector<uint32_t>& f, int label, double lr);

  void save(const std::string& path) const;
  static QualityModel load(const std::string& path);

  int64_t bucket_bits() const { return bucket_bits_; }
  float bias() const { return bias_; }
  const std::vector<float>& weights() const { return weights_; }
  // Replaces the bias and the 2^bucket_bits weights (a model trained on another rank).
  void assign(float bias, const float* weights);

 private:
  int64_t bucket_bits_ = 20;
  uint64_t hash_seed_ = 0;
  float bias_ = 0.0f;
  std::vector<float> weights_;
};

struct QualityTrainOptions {
  std::string positive, negative, model;
  std::string report;  // default: model + ".report.json"
  std::string json_key = "text";
  int64_t bucket_bits = 20;
  int64_t epochs = 5;
  double lr = 0.5;
  double holdout = 0.1;  // fraction held out for the precision/recall report
  uint64_t seed = 1;
  bool progress = true;
};

struct BinaryMetrics {
  int64_t tp = 0, fp = 0, tn = 0, fn = 0;
  double accuracy() const;
  double precision() const;
  double recall() const;
  nlohmann::json to_json() const;
};

// Trains, saves the model and its report; returns the report (held-out metrics).
// On every rank of `comm` (nullptr: one process): each rank featurizes a share of the
// inputs, SGD runs on rank 0 over all of them in the one-process order, so the model
// file and report are the same bytes for any number of ranks; rank 0 writes them and
// returns the report, the other ranks return null. A failing rank makes every rank
// throw (agree() in ranks.hpp), before anything is written.
nlohmann::json train_quality(const QualityTrainOptions& opt, RankComm* comm = nullptr);

// Writes one JSON line per document: {"line": N, "score": P}.
// Only bytes [range_begin, range_end) of the input with `lines_before` lines before them
// (one rank's share; line numbers stay the file's); `documents_done` counts as it goes.
// Returns documents, mean_score and score_sum.
nlohmann::json score_quality(const std::string& input, const std::string& model, const std::string& output,
                             const std::string& json_key, int64_t range_begin = 0, int64_t range_end = -1,
                             int64_t lines_before = 0, std::atomic<int64_t>* documents_done = nullptr);

struct QualityFilterOptions {
  std::string input, model, output;
  std::string json_key = "text";
  std::string mode = "threshold";  // threshold | pareto
  double threshold = 0.5;          // threshold mode: keep if score >= threshold
  double alpha = 9.0;              // pareto mode: keep if pareto(alpha) > 1 - score
  uint64_t seed = 1;
  // One rank's share of a multi-rank run: bytes [range_begin, range_end) of the input
  // (line-aligned, -1 = the end), with the lines and documents before it, so that line
  // numbers and the Pareto draws' document indices are the whole file's. write_report
  // false: only the kept lines are written (the caller writes the merged report).
  int64_t range_begin = 0, range_end = -1, lines_before = 0, documents_before = 0;
  bool write_report = true;
  // Counts the documents done as they go (a multi-rank run's progress line reads it
  // from another thread); nullptr = not counted.
  std::atomic<int64_t>* documents_done = nullptr;
};
// Copies the kept lines byte-identical; writes output + ".report.json".
nlohmann::json filter_quality(const QualityFilterOptions& opt);
// The report filter_quality writes, for given totals (multi-rank runs sum the ranks').
nlohmann::json quality_filter_report(const QualityFilterOptions& opt, int64_t documents, int64_t kept);

// A draw of numpy.random.pareto(alpha) (the Lomax distribution: U^(-1/alpha) - 1 with U
// uniform in (0, 1]) for document `doc`, from the counter RNG: the same (seed, doc)
// always gives the same draw, whatever the order documents are visited in.
// P(keep) = P(draw > 1 - s) = (2 - s)^(-alpha).
double pareto_draw(uint64_t seed, uint64_t doc, double alpha);

}  // namespace mtnlg::curation
