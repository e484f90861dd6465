// Quality classifier: hashed n-gram logistic regression (see quality.hpp).
#include "data/curation/quality.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "core/rng.hpp"
#include "data/curation/text.hpp"
#include "data/preprocess.hpp"

namespace fs = std::filesystem;

namespace mtnlg::curation {

namespace {

constexpr char kMagic[8] = {'M', 'T', 'N', 'L', 'G', 'Q', 'L', 'M'};
constexpr size_t kHeaderBytes = 8 + 4 * 4 + 8 + 4;  // magic, 4 x u32, u64 seed, f32 bias

template <typename T>
void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86/ARM little-endian hosts; the format is little-endian
  s.append(b, sizeof(T));
}
template <typename T>
T get(const std::string& s, size_t& off) {
  T v;
  std::memcpy(&v, s.data() + off, sizeof(T));
  off += sizeof(T);
  return v;
}

double sigmoid(double z) { return z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z)); }

}  // namespace

QualityModel::QualityModel(int64_t bucket_bits, uint64_t hash_seed) : bucket_bits_(bucket_bits), hash_seed_(hash_seed) {
  if (bucket_bits < 8 || bucket_bits > 28) throw_input("--bucket-bits {} must be in [8, 28]", bucket_bits);
  weights_.assign(size_t{1} << bucket_bits, 0.0f);
}

void QualityModel::features(std::string_view text, std::vector<uint32_t>& out) const {
  thread_local std::vector<Word> words;
  normalize_words(text, words);
  out.clear();
  const uint64_t mask = (uint64_t{1} << bucket_bits_) - 1;
  for (size_t i = 0; i < words.size(); ++i) {
    out.push_back(static_cast<uint32_t>(mix_key(hash_seed_, 1, words[i].hash) & mask));
    if (i + 1 < words.size())
      out.push_back(static_cast<uint32_t>(mix_key(hash_seed_ ^ words[i].hash, 2, words[i + 1].hash) & mask));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

double QualityModel::score_features(const std::vector<uint32_t>& f) const {
  if (f.empty()) return sigmoid(bias_);
  double v = 1.0 / std::sqrt(static_cast<double>(f.size()));
  double z = bias_;
  for (uint32_t j : f) z += weights_[j] * v;
  return sigmoid(z);
}

double QualityModel::score(std::string_view text) const {
  thread_local std::vector<uint32_t> f;
  features(text, f);
  return score_features(f);
}

double QualityModel::sgd_step(const std::vector<uint32_t>& f, int label, double lr) {
  double p = score_features(f);
  double g = p - label;  // d(log loss)/dz
  double v = f.empty() ? 0.0 : 1.0 / std::sqrt(static_cast<double>(f.size()));
  for (uint32_t j : f) weights_[j] -= static_cast<float>(lr * g * v);
  bias_ -= static_cast<float>(lr * g);
  double pc = std::clamp(label ? p : 1.0 - p, 1e-12, 1.0);
  return -std::log(pc);
}

void QualityModel::save(const std::string& path) const {
  std::string s;
  s.reserve(kHeaderBytes + weights_.size() * 4 + 4);
  s.append(kMagic, 8);
  put<uint32_t>(s, kVersion);
  put<uint32_t>(s, static_cast<uint32_t>(bucket_bits_));
  put<uint32_t>(s, 2);  // max n-gram: unigrams + bigrams
  put<uint32_t>(s, 0);
  put<uint64_t>(s, hash_seed_);
  put<float>(s, bias_);
  s.append(reinterpret_cast<const char*>(weights_.data()), weights_.size() * sizeof(float));
  uint32_t crc =
      static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
  put<uint32_t>(s, crc);
  write_file_atomic(path, s);
}

QualityModel QualityModel::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw_input("--model {}: cannot open", path);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (s.size() < kHeaderBytes + 4 || std::memcmp(s.data(), kMagic, 8) != 0)
    throw_input("--model {}: not an mtnlg quality model (bad magic or too short)", path);
  size_t off = 8;
  auto version = get<uint32_t>(s, off);
  auto bits = get<uint32_t>(s, off);
  auto max_ngram = get<uint32_t>(s, off);
  get<uint32_t>(s, off);
  auto seed = get<uint64_t>(s, off);
  auto bias = get<float>(s, off);
  if (version != kVersion) throw_input("--model {}: version {} (this mtnlg reads version {})", path, version, kVersion);
  if (bits < 8 || bits > 28 || max_ngram != 2)
    throw_input("--model {}: corrupt header (bucket_bits {}, max_ngram {})", path, bits, max_ngram);
  size_t want = kHeaderBytes + (size_t{1} << bits) * 4 + 4;
  if (s.size() != want)
    throw_input("--model {}: size {} bytes, expected {} (truncated or corrupt)", path, s.size(), want);
  uint32_t stored;
  std::memcpy(&stored, s.data() + want - 4, 4);
  auto crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(want - 4)));
  if (crc != stored) throw_input("--model {}: checksum mismatch (corrupt file)", path);
  QualityModel m(bits, seed);
  m.bias_ = bias;
  std::memcpy(m.weights_.data(), s.data() + kHeaderBytes, m.weights_.size() * 4);
  for (float w : m.weights_)
    if (!std::isfinite(w)) throw_input("--model {}: non-finite weight (corrupt file)", path);
  return m;
}

double BinaryMetrics::accuracy() const {
  int64_t n = tp + fp + tn + fn;
  return n ? static_cast<double>(tp + tn) / static_cast<double>(n) : 0.0;
}
double BinaryMetrics::precision() const {
  return tp + fp ? static_cast<double>(tp) / static_cast<double>(tp + fp) : 0.0;
}
double BinaryMetrics::recall() const { return tp + fn ? static_cast<double>(tp) / static_cast<double>(tp + fn) : 0.0; }
nlohmann::json BinaryMetrics::to_json() const {
  return {{"documents", tp + fp + tn + fn},
          {"tp", tp},
          {"fp", fp},
          {"tn", tn},
          {"fn", fn},
          {"accuracy", accuracy()},
          {"precision", precision()},
          {"recall", recall()}};
}

namespace {

// Positions of the global training order per block of one exchange (see QualityTrain).
constexpr int64_t kTrainBlock = 4096;

}  // namespace

void QualityModel::assign(float bias, const float* weights) {
  bias_ = bias;
  std::memcpy(weights_.data(), weights, weights_.size() * sizeof(float));
}

namespace {

struct Example {
  std::vector<uint32_t> f;
  int label;
};

// One run of quality training on this rank (comm of size W; one process: W = 1, the
// same code). Rank r featurizes the r-th line-aligned byte range of --positive and of
// --negative and keeps those examples only. Example indices (the held-out split's key)
// and line numbers are the whole files', from the all-reduced line and document counts.
// The training set in one process is the examples in index order (positives, then
// negatives) less the held-out ones; across ranks that order is the ranks' segments:
// positives of rank 0, 1, ..., then negatives of rank 0, 1, .... Every rank computes the
// same shuffle per epoch; SGD runs on rank 0, which receives the examples it does not
// hold in the shuffled order, kTrainBlock positions per exchange, so the updates are
// the same sequence of the same float operations for any W: the model file is the same
// bytes. Rank 0 holds its own share plus one block; after training it sends the
// weights to every rank, each evaluates its own examples and the confusion counts are
// summed.
//
// train_quality calls the stages in order; every rank calls the same collectives in the
// same order. State that only one stage uses stays local to it.
struct QualityTrain {
  QualityTrain(const QualityTrainOptions& o, RankComm* comm_in);

  // The stages, in order.
  void check_options();
  void count_shares();
  void featurize();
  void place_segments();
  void train();
  void share_weights();
  void save();

  // Parts of the stages.
  void shuffle(int64_t ep);
  void train_block(int64_t lo, int64_t hi, double lr, double& loss);
  std::vector<char> exchange_block(int64_t lo, int64_t hi);
  void train_received(const std::vector<char>& got, int64_t lo, int64_t hi, double lr, double& loss);
  std::pair<int64_t, int64_t> locate(int64_t t) const;
  BinaryMetrics evaluate(const std::vector<Example>& set);
  int64_t& cnt(int64_t f, int64_t q, int64_t what) { return counts[static_cast<size_t>((f * W + q) * 2 + what)]; }

  // The run's parameters.
  const QualityTrainOptions& opt;
  SoloRankComm solo;
  RankComm& comm;
  const int64_t W, R;
  const std::string* paths[2];  // file 0 = label 1
  QualityModel model;           // made once the options are checked

  // Shares (count_shares): lines and documents of every rank's range of both files,
  // [file][rank][lines, docs], and this rank's ranges.
  int64_t range[2][2] = {{0, -1}, {0, -1}};
  std::vector<int64_t> counts;
  int64_t docs[2] = {0, 0};

  // Examples (featurize, place_segments): this rank's, positives then negatives, each in
  // file order; training examples per segment (file f, rank q) = segment f * W + q, in
  // global order.
  std::vector<Example> train_set, held;
  int64_t local_train[2] = {0, 0};
  std::vector<int64_t> seg, seg_start;
  int64_t n_train = 0, n_held = 0;

  // Training: the shuffled order of the training positions, the epochs' report lines.
  std::vector<size_t> order;
  nlohmann::json epochs = nlohmann::json::array();
  std::vector<uint32_t> remote_f;  // scratch: one received example's features
  nlohmann::json report;
};

QualityTrain::QualityTrain(const QualityTrainOptions& o, RankComm* comm_in)
    : opt(o),
      comm(comm_in ? *comm_in : solo),
      W(comm.size()),
      R(comm.rank()),
      paths{&opt.positive, &opt.negative},
      counts(static_cast<size_t>(4 * W), 0) {}

// --- options: checked on rank 0 only, so that a bad option is reported once --------
void QualityTrain::check_options() {
  agree(comm, "checking the options", [&] {
    if (R != 0) return;
    if (opt.epochs < 1) throw_input("--epochs {} must be at least 1", opt.epochs);
    if (!(opt.lr > 0)) throw_input("--lr {} must be positive", opt.lr);
    if (!(opt.holdout >= 0 && opt.holdout < 1)) throw_input("--holdout {} must be in [0, 1)", opt.holdout);
    if (opt.bucket_bits < 8 || opt.bucket_bits > 28)
      throw_input("--bucket-bits {} must be in [8, 28]", opt.bucket_bits);
    for (const std::string* p : paths)
      if (!fs::is_regular_file(*p)) throw_input("{}: no such file", *p);
  });
  model = QualityModel(opt.bucket_bits, mix_key(opt.seed, 0x5175616c));
}

// --- shares: rank q reads the q-th line-aligned byte range of both files ----------
void QualityTrain::count_shares() {
  agree(comm, "reading its share", [&] {
    for (int64_t f = 0; f < 2; ++f) {
      std::tie(range[f][0], range[f][1]) = data::line_aligned_range(*paths[f], W, R);
      const auto c = count_lines(*paths[f], range[f][0], range[f][1]);
      cnt(f, R, 0) = c.lines;
      cnt(f, R, 1) = c.documents;
    }
  });
  comm.all_reduce_sum(counts.data(), 4 * W);
  for (int64_t f = 0; f < 2; ++f)
    for (int64_t q = 0; q < W; ++q) docs[f] += cnt(f, q, 1);
}

// --- features: this rank's examples, training or held out -------------------------
void QualityTrain::featurize() {
  agree(comm, "reading its share", [&] {
    for (int64_t f = 0; f < 2; ++f) {
      int64_t lines_before = 0, idx = f == 0 ? 0 : docs[0];
      for (int64_t q = 0; q < R; ++q) {
        lines_before += cnt(f, q, 0);
        idx += cnt(f, q, 1);
      }
      LineReader r(*paths[f], range[f][0], range[f][1], lines_before);
      std::string line;
      int64_t line_no = 0;
      while (r.next(line, line_no)) {
        if (is_blank_line(line)) continue;
        Example e;
        model.features(extract_text(line, opt.json_key, *paths[f], line_no), e.f);
        e.label = f == 0 ? 1 : 0;
        // Held-out membership is a pure function of (seed, example index).
        const bool is_held =
            philox_uniform(mix_key(opt.seed, 0x686f6c64), 0, static_cast<uint64_t>(idx++)) < opt.holdout;
        if (!is_held) ++local_train[f];
        (is_held ? held : train_set).push_back(std::move(e));
      }
    }
  });
}

// --- segments: where each rank's training examples sit in the global order --------
void QualityTrain::place_segments() {
  seg.assign(static_cast<size_t>(2 * W), 0);
  seg[static_cast<size_t>(R)] = local_train[0];
  seg[static_cast<size_t>(W + R)] = local_train[1];
  comm.all_reduce_sum(seg.data(), 2 * W);
  seg_start.assign(static_cast<size_t>(2 * W + 1), 0);
  for (int64_t s = 0; s < 2 * W; ++s)
    seg_start[static_cast<size_t>(s + 1)] = seg_start[static_cast<size_t>(s)] + seg[static_cast<size_t>(s)];
  n_train = seg_start.back();
  n_held = static_cast<int64_t>(held.size());
  comm.all_reduce_sum(&n_held, 1);
  agree(comm, "checking the documents", [&] {
    if (R != 0) return;
    if (docs[0] == 0 || docs[1] == 0)
      throw_input("quality train: need documents in both --positive ({}) and --negative ({})", docs[0], docs[1]);
    if (n_train == 0) throw_input("quality train: no training documents left after the --holdout split");
  });
}

// Global training position -> (rank holding it, its index in that rank's `train_set`).
std::pair<int64_t, int64_t> QualityTrain::locate(int64_t t) const {
  const int64_t s = std::upper_bound(seg_start.begin(), seg_start.end(), t) - seg_start.begin() - 1;
  const int64_t q = s % W, f = s / W;
  const int64_t first = f == 0 ? 0 : seg[static_cast<size_t>(q)];  // q's positives come first
  return std::pair<int64_t, int64_t>(q, first + (t - seg_start[static_cast<size_t>(s)]));
}

// --- training: SGD on rank 0, the epochs in blocks of kTrainBlock positions --------
void QualityTrain::train() {
  order.resize(static_cast<size_t>(n_train));
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Progress prog(W > 1 ? fmt::format("quality: train ({} ranks)", W) : "quality: train", opt.epochs * n_train, "docs",
                opt.progress && R == 0);
  for (int64_t ep = 0; ep < opt.epochs; ++ep) {
    shuffle(ep);
    double lr = opt.lr / (1.0 + static_cast<double>(ep));  // decays per epoch
    double loss = 0;
    for (int64_t lo = 0; lo < n_train; lo += kTrainBlock)
      train_block(lo, std::min(n_train, lo + kTrainBlock), lr, loss);
    prog.add(n_train);
    epochs.push_back({{"epoch", ep + 1}, {"lr", lr}, {"train_loss", loss / static_cast<double>(n_train)}});
  }
  prog.finish();
}

// Fisher-Yates (every rank: the same order).
void QualityTrain::shuffle(int64_t ep) {
  const uint64_t shuffle_key = mix_key(opt.seed, 0x73687566);
  for (size_t i = order.size(); i > 1; --i) {
    auto j = static_cast<size_t>(philox_bits(shuffle_key, static_cast<uint64_t>(ep), i) % i);
    std::swap(order[i - 1], order[j]);
  }
}

// Positions [lo, hi) of the shuffled order; `loss` adds each step's loss in order (the
// epoch's sum is the same float operations for any W).
void QualityTrain::train_block(int64_t lo, int64_t hi, double lr, double& loss) {
  if (W == 1) {
    for (int64_t i = lo; i < hi; ++i) {
      const auto& e = train_set[order[static_cast<size_t>(i)]];
      loss += model.sgd_step(e.f, e.label, lr);
    }
    return;
  }
  const std::vector<char> got = exchange_block(lo, hi);
  if (R != 0) return;
  train_received(got, lo, hi, lr, loss);
}

// Ranks other than 0 send their examples of this block, in block order, as
// (label, n, n features) words; rank 0 receives them all.
std::vector<char> QualityTrain::exchange_block(int64_t lo, int64_t hi) {
  std::vector<std::vector<uint32_t>> out(static_cast<size_t>(W));
  if (R != 0)
    for (int64_t i = lo; i < hi; ++i) {
      const auto [q, at] = locate(static_cast<int64_t>(order[static_cast<size_t>(i)]));
      if (q != R) continue;
      const auto& e = train_set[static_cast<size_t>(at)];
      out[0].push_back(static_cast<uint32_t>(e.label));
      out[0].push_back(static_cast<uint32_t>(e.f.size()));
      out[0].insert(out[0].end(), e.f.begin(), e.f.end());
    }
  std::vector<std::span<const char>> send;
  for (auto& v : out) send.emplace_back(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  return comm.all_to_all(send);
}

// Rank 0: the block's SGD steps in order, on its own examples and on those received in
// `got`, where it reads each rank's stream in turn.
void QualityTrain::train_received(const std::vector<char>& got, int64_t lo, int64_t hi, double lr, double& loss) {
  auto word = [&](size_t w) {
    uint32_t v;
    std::memcpy(&v, got.data() + w * 4, 4);
    return v;
  };
  // Where each rank's stream starts in `got`: skip the records of the ranks before.
  std::vector<int64_t> records(static_cast<size_t>(W), 0);
  for (int64_t i = lo; i < hi; ++i)
    ++records[static_cast<size_t>(locate(static_cast<int64_t>(order[static_cast<size_t>(i)])).first)];
  std::vector<size_t> cursor(static_cast<size_t>(W), 0);
  size_t w = 0;
  for (int64_t q = 1; q < W; ++q) {
    cursor[static_cast<size_t>(q)] = w;
    for (int64_t k = 0; k < records[static_cast<size_t>(q)]; ++k) w += 2 + word(w + 1);
  }
  MTNLG_CHECK(w * 4 == got.size(), "quality train: {} bytes received for a block, {} expected", got.size(), w * 4);
  for (int64_t i = lo; i < hi; ++i) {
    const auto [q, at] = locate(static_cast<int64_t>(order[static_cast<size_t>(i)]));
    if (q == 0) {
      const auto& e = train_set[static_cast<size_t>(at)];
      loss += model.sgd_step(e.f, e.label, lr);
      continue;
    }
    size_t& c = cursor[static_cast<size_t>(q)];
    const int label = static_cast<int>(word(c));
    const size_t n = word(c + 1);
    remote_f.resize(n);
    if (n) std::memcpy(remote_f.data(), got.data() + (c + 2) * 4, n * 4);
    c += 2 + n;
    loss += model.sgd_step(remote_f, label, lr);
  }
}

// --- weights: rank 0's weights (and bias) to every rank ---------------------------
void QualityTrain::share_weights() {
  if (W == 1) return;
  std::vector<float> params;
  std::vector<std::span<const char>> send(static_cast<size_t>(W));
  if (R == 0) {
    params.push_back(model.bias());
    params.insert(params.end(), model.weights().begin(), model.weights().end());
    for (int64_t q = 1; q < W; ++q)
      send[static_cast<size_t>(q)] =
          std::span<const char>(reinterpret_cast<const char*>(params.data()), params.size() * 4);
  }
  const std::vector<char> got = comm.all_to_all(send);
  if (R != 0) {
    MTNLG_CHECK(got.size() == (model.weights().size() + 1) * 4, "quality train: {} bytes of weights received",
                got.size());
    std::vector<float> p(model.weights().size() + 1);
    std::memcpy(p.data(), got.data(), got.size());
    model.assign(p[0], p.data() + 1);
  }
}

// The confusion counts of a set of examples, summed over the ranks.
BinaryMetrics QualityTrain::evaluate(const std::vector<Example>& set) {
  int64_t m[4] = {0, 0, 0, 0};  // tp, fp, tn, fn
  for (auto& e : set) {
    bool pred = model.score_features(e.f) >= 0.5;
    if (pred && e.label)
      ++m[0];
    else if (pred)
      ++m[1];
    else if (e.label)
      ++m[3];
    else
      ++m[2];
  }
  comm.all_reduce_sum(m, 4);
  BinaryMetrics b;
  b.tp = m[0];
  b.fp = m[1];
  b.tn = m[2];
  b.fn = m[3];
  return b;
}

// --- model and report (rank 0) ------------------------------------------------------
void QualityTrain::save() {
  const BinaryMetrics train_m = evaluate(train_set), held_m = evaluate(held);
  agree(comm, "writing the model", [&] {
    if (R != 0) return;
    model.save(opt.model);
    report = {{"format", "mtnlg-quality-train-report"},
              {"version", 1},
              {"model", opt.model},
              {"positive", opt.positive},
              {"negative", opt.negative},
              {"params",
               {{"bucket_bits", opt.bucket_bits},
                {"epochs", opt.epochs},
                {"lr", opt.lr},
                {"holdout", opt.holdout},
                {"seed", opt.seed},
                {"json_key", opt.json_key}}},
              {"documents", {{"positive", docs[0]}, {"negative", docs[1]}, {"train", n_train}, {"held_out", n_held}}},
              {"epochs", epochs},
              {"train_metrics", train_m.to_json()},
              {"held_out_metrics", held_m.to_json()}};
    write_file_atomic(opt.report.empty() ? opt.model + ".report.json" : opt.report, report.dump(2) + "\n");
  });
}

}  // namespace

nlohmann::json train_quality(const QualityTrainOptions& opt, RankComm* comm_in) {
  QualityTrain run(opt, comm_in);
  run.check_options();
  run.count_shares();
  run.featurize();
  run.place_segments();
  run.train();
  run.share_weights();
  run.save();
  return std::move(run.report);
}

nlohmann::json score_quality(const std::string& input, const std::string& model_path, const std::string& output,
                             const std::string& json_key, int64_t range_begin, int64_t range_end, int64_t lines_before,
                             std::atomic<int64_t>* documents_done) {
  QualityModel model = QualityModel::load(model_path);
  if (!fs::is_regular_file(input)) throw_input("--input {}: no such file", input);
  LineReader r(input, range_begin, range_end, lines_before);
  AtomicWriter out(output);
  std::string line;
  int64_t line_no = 0, n = 0;
  double sum = 0;
  while (r.next(line, line_no)) {
    if (is_blank_line(line)) continue;
    double s = model.score(extract_text(line, json_key, input, line_no));
    out.write_line(nlohmann::json{{"line", line_no}, {"score", s}}.dump());
    ++n;
    sum += s;
    if (documents_done) documents_done->fetch_add(1, std::memory_order_relaxed);
  }
  out.close();
  return {{"documents", n}, {"mean_score", n ? sum / static_cast<double>(n) : 0.0}, {"score_sum", sum}};
}

double pareto_draw(uint64_t seed, uint64_t doc, double alpha) {
  uint32_t bits = philox_bits(mix_key(seed, 0x70617265746full), 0, doc);
  double u = (static_cast<double>(bits) + 1.0) / 4294967296.0;  // (0, 1]
  return std::pow(u, -1.0 / alpha) - 1.0;
}

nlohmann::json quality_filter_report(const QualityFilterOptions& opt, int64_t n, int64_t kept) {
  return {{"format", "mtnlg-quality-filter-report"},
          {"version", 1},
          {"input", opt.input},
          {"output", opt.output},
          {"model", opt.model},
          {"params", {{"mode", opt.mode}, {"threshold", opt.threshold}, {"alpha", opt.alpha}, {"seed", opt.seed}}},
          {"documents", n},
          {"kept", kept},
          {"removed", n - kept}};
}

nlohmann::json filter_quality(const QualityFilterOptions& opt) {
  if (opt.mode != "threshold" && opt.mode != "pareto") throw_input("--mode {}: expected threshold or pareto", opt.mode);
  if (!(opt.alpha > 0)) throw_input("--alpha {} must be positive", opt.alpha);
  QualityModel model = QualityModel::load(opt.model);
  if (!fs::is_regular_file(opt.input)) throw_input("--input {}: no such file", opt.input);
  if (fs::exists(opt.output) && fs::equivalent(opt.output, opt.input))
    throw_input("--output {}: would overwrite the input", opt.output);
  LineReader r(opt.input, opt.range_begin, opt.range_end, opt.lines_before);
  AtomicWriter out(opt.output);
  std::string line;
  int64_t line_no = 0, n = 0, kept = 0;
  while (r.next(line, line_no)) {
    if (is_blank_line(line)) continue;
    double s = model.score(extract_text(line, opt.json_key, opt.input, line_no));
    const uint64_t doc = static_cast<uint64_t>(opt.documents_before + n);
    bool keep = opt.mode == "threshold" ? s >= opt.threshold : pareto_draw(opt.seed, doc, opt.alpha) > 1.0 - s;
    ++n;
    if (opt.documents_done) opt.documents_done->fetch_add(1, std::memory_order_relaxed);
    if (keep) {
      out.write_line(line);
      ++kept;
    }
  }
  out.close();
  nlohmann::json report = quality_filter_report(opt, n, kept);
  if (!opt.write_report) return report;
  write_file_atomic(opt.output + ".report.json", report.dump(2) + "\n");
  return report;
}

}  // namespace mtnlg::curation
