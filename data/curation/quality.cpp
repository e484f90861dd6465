// Quality classifier: hashed n-gram logistic regression (see quality.hpp).
#include "data/curation/quality.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "core/rng.hpp"
#include "data/curation/text.hpp"

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

// Reads a JSONL file's texts (blank lines skipped).
std::vector<std::string> read_texts(const std::string& path, const std::string& key) {
  if (!fs::is_regular_file(path)) throw_input("{}: no such file", path);
  std::vector<std::string> texts;
  LineReader r(path);
  std::string line;
  int64_t line_no = 0;
  while (r.next(line, line_no)) {
    if (is_blank_line(line)) continue;
    texts.push_back(extract_text(line, key, path, line_no));
  }
  return texts;
}

}  // namespace

QualityModel::QualityModel(int64_t bucket_bits, uint64_t hash_seed)
    : bucket_bits_(bucket_bits), hash_seed_(hash_seed) {
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
  uint32_t crc = static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(s.data()), static_cast<uInt>(s.size())));
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
  if (bits < 8 || bits > 28 || max_ngram != 2) throw_input("--model {}: corrupt header (bucket_bits {}, max_ngram {})", path, bits, max_ngram);
  size_t want = kHeaderBytes + (size_t{1} << bits) * 4 + 4;
  if (s.size() != want) throw_input("--model {}: size {} bytes, expected {} (truncated or corrupt)", path, s.size(), want);
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
double BinaryMetrics::precision() const { return tp + fp ? static_cast<double>(tp) / static_cast<double>(tp + fp) : 0.0; }
double BinaryMetrics::recall() const { return tp + fn ? static_cast<double>(tp) / static_cast<double>(tp + fn) : 0.0; }
nlohmann::json BinaryMetrics::to_json() const {
  return {{"documents", tp + fp + tn + fn}, {"tp", tp}, {"fp", fp}, {"tn", tn}, {"fn", fn},
          {"accuracy", accuracy()}, {"precision", precision()}, {"recall", recall()}};
}

nlohmann::json train_quality(const QualityTrainOptions& opt) {
  if (opt.epochs < 1) throw_input("--epochs {} must be at least 1", opt.epochs);
  if (!(opt.lr > 0)) throw_input("--lr {} must be positive", opt.lr);
  if (!(opt.holdout >= 0 && opt.holdout < 1)) throw_input("--holdout {} must be in [0, 1)", opt.holdout);
  QualityModel model(opt.bucket_bits, mix_key(opt.seed, 0x5175616c));
  struct Example {
    std::vector<uint32_t> f;
    int label;
  };
  std::vector<Example> train, held;
  int64_t idx = 0;
  int64_t n_pos = 0, n_neg = 0;
  for (int label : {1, 0}) {
    const std::string& path = label ? opt.positive : opt.negative;
    for (auto& t : read_texts(path, opt.json_key)) {
      Example e;
      model.features(t, e.f);
      e.label = label;
      (label ? n_pos : n_neg)++;
      // Held-out membership is a pure function of (seed, example index).
      bool is_held = philox_uniform(mix_key(opt.seed, 0x686f6c64), 0, static_cast<uint64_t>(idx++)) < opt.holdout;
      (is_held ? held : train).push_back(std::move(e));
    }
  }
  if (n_pos == 0 || n_neg == 0) throw_input("quality train: need documents in both --positive ({}) and --negative ({})", n_pos, n_neg);
  if (train.empty()) throw_input("quality train: no training documents left after the --holdout split");

  std::vector<size_t> order(train.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const uint64_t shuffle_key = mix_key(opt.seed, 0x73687566);
  nlohmann::json epochs = nlohmann::json::array();
  Progress prog("quality: train", opt.epochs * static_cast<int64_t>(train.size()), "docs", opt.progress);
  for (int64_t ep = 0; ep < opt.epochs; ++ep) {
    for (size_t i = order.size(); i > 1; --i) {  // Fisher-Yates
      auto j = static_cast<size_t>(philox_bits(shuffle_key, static_cast<uint64_t>(ep), i) % i);
      std::swap(order[i - 1], order[j]);
    }
    double lr = opt.lr / (1.0 + static_cast<double>(ep));  // decays per epoch
    double loss = 0;
    for (size_t i : order) loss += model.sgd_step(train[i].f, train[i].label, lr);
    prog.add(static_cast<int64_t>(train.size()));
    epochs.push_back({{"epoch", ep + 1}, {"lr", lr}, {"train_loss", loss / static_cast<double>(train.size())}});
  }
  prog.finish();
  auto evaluate = [&](const std::vector<Example>& set) {
    BinaryMetrics m;
    for (auto& e : set) {
      bool pred = model.score_features(e.f) >= 0.5;
      if (pred && e.label) ++m.tp;
      else if (pred) ++m.fp;
      else if (e.label) ++m.fn;
      else ++m.tn;
    }
    return m;
  };
  model.save(opt.model);
  nlohmann::json report = {{"format", "mtnlg-quality-train-report"},
                           {"version", 1},
                           {"model", opt.model},
                           {"positive", opt.positive},
                           {"negative", opt.negative},
                           {"params",
                            {{"bucket_bits", opt.bucket_bits}, {"epochs", opt.epochs}, {"lr", opt.lr},
                             {"holdout", opt.holdout}, {"seed", opt.seed}, {"json_key", opt.json_key}}},
                           {"documents", {{"positive", n_pos}, {"negative", n_neg}, {"train", train.size()}, {"held_out", held.size()}}},
                           {"epochs", epochs},
                           {"train_metrics", evaluate(train).to_json()},
                           {"held_out_metrics", evaluate(held).to_json()}};
  write_file_atomic(opt.report.empty() ? opt.model + ".report.json" : opt.report, report.dump(2) + "\n");
  return report;
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
  if (fs::exists(opt.output) && fs::equivalent(opt.output, opt.input)) throw_input("--output {}: would overwrite the input", opt.output);
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
