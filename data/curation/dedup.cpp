// Fuzzy deduplication (see dedup.hpp for the pipeline, docs/CURATION.md for details).
#include "data/curation/dedup.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/progress.hpp"
#include "data/curation/minhash.hpp"
#include "data/curation/text.hpp"

namespace fs = std::filesystem;

namespace mtnlg::curation {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Source {
  std::string path, name, out_path;
  int64_t first_doc = 0, docs = 0, blank_lines = 0, empty = 0, bytes = 0, kept = 0;
};

// Signatures in fixed-size chunks: growing never moves existing signatures, so
// workers can write doc d while the reader allocates the chunk for doc d + 70000.
// The chunk table is allocated once (no reallocation while workers read it).
class SignatureStore {
 public:
  static constexpr int64_t kChunkDocs = 1 << 16;
  static constexpr int64_t kMaxChunks = 1 << 16;  // 2^32 documents
  explicit SignatureStore(int64_t k) : k_(k), chunks_(new std::unique_ptr<uint32_t[]>[kMaxChunks]) {}
  // Reader thread only, before the documents below `docs` are handed to workers.
  void ensure(int64_t docs) {
    while (allocated_ * kChunkDocs < docs) {
      if (allocated_ == kMaxChunks) throw_input("dedup: more than {} documents are not supported", kMaxChunks * kChunkDocs);
      chunks_[allocated_++].reset(new uint32_t[static_cast<size_t>(kChunkDocs * k_)]);
    }
  }
  uint32_t* at(int64_t doc) const { return chunks_[doc / kChunkDocs].get() + (doc % kChunkDocs) * k_; }
  int64_t bytes() const { return allocated_ * kChunkDocs * k_ * 4; }

 private:
  int64_t k_;
  std::unique_ptr<std::unique_ptr<uint32_t[]>[]> chunks_;
  int64_t allocated_ = 0;
};

bool is_empty_signature(const uint32_t* sig, int64_t k) {
  for (int64_t i = 0; i < k; ++i)
    if (sig[i] != std::numeric_limits<uint32_t>::max()) return false;
  return true;
}

struct Batch {
  int64_t first_doc = 0;
  int src = 0;
  std::vector<std::string> lines;
  std::vector<int64_t> line_nos;
};

// Bounded multi-consumer queue of batches (the reader blocks when workers fall behind,
// which bounds the memory held in flight).
class BatchQueue {
 public:
  explicit BatchQueue(size_t cap) : cap_(cap) {}
  void push(Batch b) {
    std::unique_lock lk(m_);
    not_full_.wait(lk, [&] { return q_.size() < cap_; });
    q_.push_back(std::move(b));
    not_empty_.notify_one();
  }
  std::optional<Batch> pop() {
    std::unique_lock lk(m_);
    not_empty_.wait(lk, [&] { return !q_.empty() || closed_; });
    if (q_.empty()) return std::nullopt;
    Batch b = std::move(q_.front());
    q_.pop_front();
    not_full_.notify_one();
    return b;
  }
  void close() {
    std::lock_guard lk(m_);
    closed_ = true;
    not_empty_.notify_all();
  }

 private:
  size_t cap_;
  std::mutex m_;
  std::condition_variable not_full_, not_empty_;
  std::deque<Batch> q_;
  bool closed_ = false;
};

class UnionFind {
 public:
  explicit UnionFind(int64_t n) : parent_(static_cast<size_t>(n)) {
    for (int64_t i = 0; i < n; ++i) parent_[i] = static_cast<uint32_t>(i);
  }
  uint32_t find(uint32_t x) {
    while (parent_[x] != x) {
      parent_[x] = parent_[parent_[x]];  // path halving
      x = parent_[x];
    }
    return x;
  }
  // Links the larger root under the smaller, so a root is its component's lowest doc.
  bool unite(uint32_t a, uint32_t b) {
    a = find(a);
    b = find(b);
    if (a == b) return false;
    if (a < b) std::swap(a, b);
    parent_[a] = b;
    return true;
  }

 private:
  std::vector<uint32_t> parent_;
};

struct LshStats {
  int64_t pairs_checked = 0, pairs_verified = 0, large_buckets = 0;
};

// Buckets up to this size are verified pair by pair; larger ones (boilerplate pages,
// thousands of copies) compare each member against at most kMaxLeaders "leaders"
// (the first members that matched no earlier leader), which bounds the work at
// O(size * kMaxLeaders) instead of O(size^2).
constexpr int64_t kAllPairsBucket = 64;
constexpr int64_t kMaxLeaders = 32;

void verify_pair(uint32_t a, uint32_t b, const SignatureStore& sigs, int64_t k, double thr, UnionFind& uf,
                 std::vector<std::pair<uint32_t, uint32_t>>& edges, LshStats& st) {
  if (uf.find(a) == uf.find(b)) return;  // already connected through verified edges
  ++st.pairs_checked;
  if (estimate_jaccard(sigs.at(a), sigs.at(b), k) >= thr) {
    ++st.pairs_verified;
    uf.unite(a, b);
    edges.emplace_back(a, b);
  }
}

}  // namespace

DedupResult run_dedup(const DedupOptions& opt) {
  auto t_start = Clock::now();
  if (opt.inputs.empty()) throw_input("dedup: no --input files");
  if (opt.ngram < 1) throw_input("--ngram {} must be at least 1", opt.ngram);
  if (!(opt.threshold > 0.0 && opt.threshold <= 1.0)) throw_input("--threshold {} must be in (0, 1]", opt.threshold);
  const int64_t k = opt.num_perm;
  LshParams lsh{opt.bands, opt.rows};
  if (lsh.bands == 0 && lsh.rows == 0) {
    lsh = choose_bands(std::min(opt.threshold, 0.999), k);
  } else if (lsh.bands < 1 || lsh.rows < 1 || lsh.bands * lsh.rows > k) {
    throw_input("--bands {} x --rows {} must be positive with bands*rows <= --num-perm {}", lsh.bands, lsh.rows, k);
  }
  int64_t workers = opt.workers > 0 ? opt.workers : std::max<int64_t>(1, std::thread::hardware_concurrency());

  // --- sources, names, outputs, priority: all checked before any work -----------
  std::vector<Source> sources;
  std::map<std::string, int> by_name;
  std::error_code ec;
  fs::create_directories(opt.output_dir, ec);
  if (ec) throw_input("--output-dir {}: cannot create ({})", opt.output_dir, ec.message());
  for (const auto& in : opt.inputs) {
    if (!fs::is_regular_file(in)) throw_input("--input {}: no such file", in);
    Source s;
    s.path = in;
    s.name = file_stem(in);
    s.out_path = (fs::path(opt.output_dir) / fs::path(in).filename()).string();
    if (by_name.count(s.name))
      throw_input("--input {}: source name \"{}\" (the file stem) is also used by {}; rename one", in, s.name,
                  sources[by_name[s.name]].path);
    if (fs::exists(s.out_path) && fs::equivalent(s.out_path, in))
      throw_input("--output-dir {}: would overwrite the input {}", opt.output_dir, in);
    by_name[s.name] = static_cast<int>(sources.size());
    sources.push_back(std::move(s));
  }
  if (sources.size() > 65535) throw_input("dedup: at most 65535 input files, got {}", sources.size());
  std::vector<int64_t> rank(sources.size(), static_cast<int64_t>(opt.priority.size()));
  for (size_t i = 0; i < opt.priority.size(); ++i) {
    auto it = by_name.find(opt.priority[i]);
    if (it == by_name.end()) {
      std::string valid;
      for (auto& s : sources) valid += (valid.empty() ? "" : ", ") + s.name;
      throw_input("--priority: unknown source \"{}\" (valid names, the input file stems: {})", opt.priority[i], valid);
    }
    rank[it->second] = std::min<int64_t>(rank[it->second], static_cast<int64_t>(i));
  }

  // --- pass 1: read, hash ---------------------------------------------------------
  MinHasher hasher(k, opt.seed);
  SignatureStore sigs(k);
  std::vector<int64_t> line_of;   // doc -> 1-based line in its source
  std::vector<uint16_t> src_of;   // doc -> source index
  int64_t total_bytes = 0;
  for (auto& s : sources) total_bytes += static_cast<int64_t>(fs::file_size(s.path));

  std::mutex err_m;
  std::exception_ptr err;
  std::atomic<int64_t> err_doc{std::numeric_limits<int64_t>::max()};
  std::atomic<bool> failed{false};
  std::atomic<int64_t> empty_docs{0};
  BatchQueue queue(static_cast<size_t>(2 * workers + 2));
  std::vector<std::vector<int64_t>> empty_per_worker(workers);
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      std::vector<Word> words;
      std::vector<uint64_t> sh;
      std::vector<int64_t> empties(sources.size(), 0);
      while (auto b = queue.pop()) {
        if (failed.load() && b->first_doc > err_doc.load()) continue;  // err_doc only shrinks
        const std::string& path = sources[b->src].path;
        for (size_t i = 0; i < b->lines.size(); ++i) {
          int64_t doc = b->first_doc + static_cast<int64_t>(i);
          try {
            std::string text = extract_text(b->lines[i], opt.json_key, path, b->line_nos[i]);
            normalize_words(text, words);
            shingle_hashes(words, opt.ngram, sh);
            hasher.signature(sh.data(), static_cast<int64_t>(sh.size()), sigs.at(doc));
            if (sh.empty()) ++empties[b->src];
          } catch (...) {
            std::lock_guard lk(err_m);
            if (doc < err_doc.load()) {
              err_doc.store(doc);
              err = std::current_exception();
            }
            failed = true;
            break;
          }
        }
      }
      empty_per_worker[w] = std::move(empties);
    });
  }
  {
    Progress prog("dedup: minhash", total_bytes, "B", opt.progress);
    prog.set_secondary_unit("docs");
    int64_t doc = 0;
    constexpr size_t kBatch = 512;
    try {
      for (size_t si = 0; si < sources.size() && !failed.load(); ++si) {
        Source& s = sources[si];
        s.first_doc = doc;
        LineReader reader(s.path);
        Batch b;
        b.src = static_cast<int>(si);
        b.first_doc = doc;
        std::string line;
        int64_t line_no = 0, last_bytes = 0;
        auto flush = [&] {
          if (b.lines.empty()) return;
          sigs.ensure(doc);
          int64_t n = static_cast<int64_t>(b.lines.size());
          queue.push(std::move(b));
          b = Batch{};
          b.src = static_cast<int>(si);
          b.first_doc = doc;
          prog.add(reader.bytes_read() - last_bytes, n);
          last_bytes = reader.bytes_read();
        };
        while (reader.next(line, line_no)) {
          if (is_blank_line(line)) {
            ++s.blank_lines;
            continue;
          }
          b.lines.push_back(std::move(line));
          b.line_nos.push_back(line_no);
          line_of.push_back(line_no);
          src_of.push_back(static_cast<uint16_t>(si));
          ++doc;
          ++s.docs;
          if (b.lines.size() == kBatch) {
            flush();
            if (failed.load()) break;
          }
        }
        flush();
        s.bytes = reader.bytes_read();
      }
    } catch (...) {
      queue.close();
      for (auto& t : pool) t.join();
      throw;
    }
    queue.close();
    for (auto& t : pool) t.join();
    if (err) std::rethrow_exception(err);
    prog.finish();
  }
  for (auto& e : empty_per_worker)
    for (size_t i = 0; i < e.size(); ++i) sources[i].empty += e[i];
  const int64_t n_docs = static_cast<int64_t>(line_of.size());
  double t_hash = seconds_since(t_start);

  // --- pass 2: LSH buckets, verification ------------------------------------------
  auto t_lsh = Clock::now();
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> edges(workers);
  std::vector<LshStats> stats(workers);
  {
    std::vector<uint8_t> empty(static_cast<size_t>(n_docs));
    for (int64_t d = 0; d < n_docs; ++d) empty[d] = is_empty_signature(sigs.at(d), k);
    std::atomic<int64_t> next_band{0};
    Progress prog("dedup: lsh bands", lsh.bands, "bands", opt.progress);
    std::mutex prog_m;
    std::vector<std::thread> band_pool;
    int64_t band_workers = std::min(workers, lsh.bands);
    for (int64_t w = 0; w < band_workers; ++w) {
      band_pool.emplace_back([&, w] {
        UnionFind uf(n_docs);  // per thread: lets it skip pairs it already connected
        std::vector<std::pair<uint64_t, uint32_t>> keys;
        keys.reserve(static_cast<size_t>(n_docs));
        std::vector<uint32_t> leaders;
        for (int64_t band; (band = next_band.fetch_add(1)) < lsh.bands;) {
          keys.clear();
          for (int64_t d = 0; d < n_docs; ++d)
            if (!empty[d]) keys.emplace_back(band_hash(sigs.at(d), band, lsh.rows), static_cast<uint32_t>(d));
          std::sort(keys.begin(), keys.end());
          for (size_t i = 0; i < keys.size();) {
            size_t j = i + 1;
            while (j < keys.size() && keys[j].first == keys[i].first) ++j;
            const size_t m = j - i;
            if (m >= 2 && m <= static_cast<size_t>(kAllPairsBucket)) {
              for (size_t x = i; x < j; ++x)
                for (size_t y = x + 1; y < j; ++y)
                  verify_pair(keys[x].second, keys[y].second, sigs, k, opt.threshold, uf, edges[w], stats[w]);
            } else if (m > static_cast<size_t>(kAllPairsBucket)) {
              ++stats[w].large_buckets;
              leaders.clear();
              for (size_t x = i; x < j; ++x) {
                uint32_t d = keys[x].second;
                bool matched = false;
                for (uint32_t l : leaders) {
                  if (uf.find(l) == uf.find(d)) {
                    matched = true;
                    break;
                  }
                  ++stats[w].pairs_checked;
                  if (estimate_jaccard(sigs.at(l), sigs.at(d), k) >= opt.threshold) {
                    ++stats[w].pairs_verified;
                    uf.unite(l, d);
                    edges[w].emplace_back(l, d);
                    matched = true;
                    break;
                  }
                }
                if (!matched && leaders.size() < static_cast<size_t>(kMaxLeaders)) leaders.push_back(d);
              }
            }
            i = j;
          }
          std::lock_guard lk(prog_m);
          prog.add(1);
        }
      });
    }
    for (auto& t : band_pool) t.join();
    prog.finish();
  }
  double t_lsh_s = seconds_since(t_lsh);

  // --- components and survivors ---------------------------------------------------
  auto t_cc = Clock::now();
  UnionFind uf(n_docs);
  LshStats total_stats;
  int64_t n_edges = 0;
  for (int64_t w = 0; w < workers; ++w) {
    for (auto& [a, b] : edges[w]) n_edges += uf.unite(a, b);
    total_stats.pairs_checked += stats[w].pairs_checked;
    total_stats.pairs_verified += stats[w].pairs_verified;
    total_stats.large_buckets += stats[w].large_buckets;
    edges[w].clear();
    edges[w].shrink_to_fit();
  }
  // best[root]: the survivor; key (priority rank, doc index) == (rank, input order, line).
  std::vector<uint32_t> root(static_cast<size_t>(n_docs)), best(static_cast<size_t>(n_docs)), size(static_cast<size_t>(n_docs), 0);
  for (int64_t d = 0; d < n_docs; ++d) {
    uint32_t r = uf.find(static_cast<uint32_t>(d));
    root[d] = r;
    if (size[r]++ == 0) {
      best[r] = static_cast<uint32_t>(d);
    } else if (rank[src_of[d]] < rank[src_of[best[r]]]) {
      best[r] = static_cast<uint32_t>(d);  // docs come in (input, line) order: ties keep the earlier
    }
  }
  std::vector<uint8_t> kept(static_cast<size_t>(n_docs));
  std::map<int64_t, int64_t> histogram;
  int64_t components = 0, docs_in_components = 0;
  for (int64_t d = 0; d < n_docs; ++d) {
    kept[d] = best[root[d]] == static_cast<uint32_t>(d);
    if (root[d] == static_cast<uint32_t>(d) && size[d] >= 2) {
      ++components;
      docs_in_components += size[d];
      ++histogram[size[d]];
    }
  }
  // The largest components, for the report.
  std::vector<std::pair<uint32_t, uint32_t>> big;  // (size, root)
  for (int64_t d = 0; d < n_docs; ++d)
    if (root[d] == static_cast<uint32_t>(d) && size[d] >= 2) big.emplace_back(size[d], static_cast<uint32_t>(d));
  std::sort(big.begin(), big.end(), [](auto& x, auto& y) { return x.first != y.first ? x.first > y.first : x.second < y.second; });
  if (big.size() > 10) big.resize(10);
  double t_cc_s = seconds_since(t_cc);

  // --- pass 3: write kept lines ---------------------------------------------------
  auto t_write = Clock::now();
  {
    Progress prog("dedup: write", n_docs, "docs", opt.progress);
    for (auto& s : sources) {
      LineReader reader(s.path);
      AtomicWriter out(s.out_path);
      std::string line;
      int64_t line_no = 0, doc = s.first_doc;
      while (reader.next(line, line_no)) {
        if (is_blank_line(line)) continue;
        if (doc >= s.first_doc + s.docs || line_of[doc] != line_no)
          throw_runtime("{}: changed while dedup was running (line {})", s.path, line_no);
        if (kept[doc]) {
          out.write_line(line);
          ++s.kept;
        }
        ++doc;
        prog.add(1);
      }
      if (doc != s.first_doc + s.docs) throw_runtime("{}: changed while dedup was running (fewer lines)", s.path);
      out.close();
    }
    prog.finish();
  }
  auto where = [&](uint32_t d) {
    return nlohmann::json{{"source", sources[src_of[d]].name}, {"line", line_of[d]}};
  };
  if (opt.write_clusters) {
    // One line per component of 2+ documents, components ordered by their first doc.
    std::vector<std::pair<uint32_t, uint32_t>> members;  // (root, doc)
    for (int64_t d = 0; d < n_docs; ++d)
      if (size[root[d]] >= 2) members.emplace_back(root[d], static_cast<uint32_t>(d));
    std::sort(members.begin(), members.end());
    AtomicWriter out((fs::path(opt.output_dir) / "dedup_clusters.jsonl").string());
    for (size_t i = 0; i < members.size();) {
      size_t j = i;
      nlohmann::json c{{"size", size[members[i].first]}, {"kept", where(best[members[i].first])}};
      auto removed = nlohmann::json::array();
      for (; j < members.size() && members[j].first == members[i].first; ++j)
        if (members[j].second != best[members[i].first]) removed.push_back(where(members[j].second));
      c["removed"] = std::move(removed);
      out.write_line(c.dump());
      i = j;
    }
    out.close();
  }
  double t_write_s = seconds_since(t_write);
  double t_total = seconds_since(t_start);

  // --- report -----------------------------------------------------------------------
  DedupResult res;
  res.documents = n_docs;
  res.components = components;
  nlohmann::json jsources = nlohmann::json::array(), removed_per = nlohmann::json::object();
  for (auto& s : sources) {
    res.kept += s.kept;
    res.empty += s.empty;
    jsources.push_back({{"name", s.name},
                        {"input", s.path},
                        {"output", s.out_path},
                        {"documents", s.docs},
                        {"kept", s.kept},
                        {"removed", s.docs - s.kept},
                        {"empty", s.empty},
                        {"blank_lines", s.blank_lines},
                        {"bytes", s.bytes}});
    removed_per[s.name] = s.docs - s.kept;
  }
  res.removed = n_docs - res.kept;
  nlohmann::json hist = nlohmann::json::object();
  for (auto& [sz, c] : histogram) hist[std::to_string(sz)] = c;
  nlohmann::json largest = nlohmann::json::array();
  for (auto& [sz, r] : big) largest.push_back({{"size", sz}, {"kept", where(best[r])}});
  nlohmann::json curve = nlohmann::json::array();
  for (double s : {0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95})
    curve.push_back({{"jaccard", s}, {"p_candidate", lsh_candidate_probability(s, lsh.bands, lsh.rows)}});
  std::vector<std::string> prio = opt.priority;
  res.report = {
      {"format", "mtnlg-dedup-report"},
      {"version", 1},
      {"params",
       {{"threshold", opt.threshold},
        {"ngram", opt.ngram},
        {"num_perm", k},
        {"bands", lsh.bands},
        {"rows", lsh.rows},
        {"seed", opt.seed},
        {"json_key", opt.json_key},
        {"workers", workers},
        {"priority", prio},
        {"s_curve", curve}}},
      {"sources", jsources},
      {"totals", {{"documents", n_docs}, {"kept", res.kept}, {"removed", res.removed}, {"empty", res.empty}}},
      {"removed_per_source", removed_per},
      {"candidates",
       {{"pairs_checked", total_stats.pairs_checked},
        {"pairs_verified", total_stats.pairs_verified},
        {"edges", n_edges},
        {"large_buckets", total_stats.large_buckets}}},
      {"components",
       {{"count", components}, {"documents", docs_in_components}, {"size_histogram", hist}, {"largest", largest}}},
      {"timing_s",
       {{"read_and_minhash", t_hash}, {"lsh_and_verify", t_lsh_s}, {"components", t_cc_s}, {"write", t_write_s}, {"total", t_total}}},
      {"docs_per_s", t_total > 0 ? static_cast<double>(n_docs) / t_total : 0.0},
      {"signature_bytes", sigs.bytes()}};
  write_file_atomic((fs::path(opt.output_dir) / "dedup_report.json").string(), res.report.dump(2) + "\n");
  return res;
}

}  // namespace mtnlg::curation
