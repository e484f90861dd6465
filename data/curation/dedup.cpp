// Fuzzy deduplication (see dedup.hpp for the pipeline, docs/CURATION.md for details).
#include "data/curation/dedup.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <type_traits>
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
#include "data/preprocess.hpp"

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
      if (allocated_ == kMaxChunks)
        throw_input("dedup: more than {} documents are not supported", kMaxChunks * kChunkDocs);
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

struct LshStats {
  int64_t pairs_checked = 0, pairs_verified = 0, large_buckets = 0;
};

// Buckets up to this size are verified pair by pair; larger ones (boilerplate pages,
// thousands of copies) compare each member against at most kMaxLeaders "leaders"
// (the first members that matched no earlier leader), which bounds the work at
// O(size * kMaxLeaders) instead of O(size^2).
constexpr int64_t kAllPairsBucket = 64;
constexpr int64_t kMaxLeaders = 32;

}  // namespace


namespace {

// The all-to-all of records of type T; the received bytes are read with read<T>() (no
// second copy of a round's data).
template <typename T>
std::vector<char> exchange_records(RankComm& c, const std::vector<std::vector<T>>& out) {
  static_assert(sizeof(T) % 4 == 0 && std::is_trivially_copyable_v<T>);
  std::vector<std::span<const char>> send;
  for (auto& v : out) send.emplace_back(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  return c.all_to_all(send);
}
template <typename T>
T read_at(const std::vector<char>& bytes, size_t i) {  // the i-th T
  T v;
  std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

struct BandKey {
  uint64_t hash;
  uint32_t doc;  // global document index
  uint32_t pad = 0;
  bool operator<(const BandKey& o) const { return hash != o.hash ? hash < o.hash : doc < o.doc; }
};

// One band's keys on their owner rank: held in memory up to `cap` keys, beyond that
// written to disk as sorted runs and merged when scanned (an external sort).
class KeyRuns {
 public:
  KeyRuns(int64_t cap, std::string dir) : cap_(std::max<int64_t>(cap, 64)), dir_(std::move(dir)) {}
  ~KeyRuns() { clear_files(); }
  void add(const std::vector<char>& bytes) {  // BandKey records
    const size_t n = bytes.size() / sizeof(BandKey);
    for (size_t i = 0; i < n; ++i) {
      buf_.push_back(read_at<BandKey>(bytes, i));
      if (static_cast<int64_t>(buf_.size()) >= cap_) spill();
    }
  }
  int64_t runs_spilled() const { return spilled_; }
  int64_t bytes_spilled() const { return spilled_bytes_; }
  // Calls fn(key) for every key in (hash, doc) order, then forgets them.
  template <typename F>
  void scan(F&& fn) {
    std::sort(buf_.begin(), buf_.end());
    if (files_.empty()) {
      for (const auto& k : buf_) fn(k);
    } else {
      if (!buf_.empty()) spill();
      merge(fn);
    }
    buf_.clear();
    clear_files();
  }

 private:
  void spill() {
    std::sort(buf_.begin(), buf_.end());
    std::error_code ec;
    fs::create_directories(dir_, ec);
    std::string path = (fs::path(dir_) / fmt::format("keys-{}.run", files_.size())).string();
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw_runtime("{}: cannot create a spill file ({})", path, std::strerror(errno));
    const bool ok = std::fwrite(buf_.data(), sizeof(BandKey), buf_.size(), f) == buf_.size();
    if (std::fclose(f) != 0 || !ok) throw_runtime("{}: write failed (disk full?)", path);
    files_.push_back(path);
    ++spilled_;
    spilled_bytes_ += static_cast<int64_t>(buf_.size() * sizeof(BandKey));
    buf_.clear();
  }
  template <typename F>
  void merge(F&& fn) {
    struct Run {
      std::FILE* f = nullptr;
      std::vector<BandKey> b;
      size_t pos = 0, len = 0;
      bool next() {
        if (++pos < len) return true;
        len = std::fread(b.data(), sizeof(BandKey), b.size(), f);
        pos = 0;
        return len > 0;
      }
    };
    const size_t per_run =
        static_cast<size_t>(std::clamp<int64_t>(cap_ / static_cast<int64_t>(files_.size()), 256, 1 << 16));
    std::vector<Run> runs(files_.size());
    auto close_all = [&] {
      for (auto& r : runs)
        if (r.f) std::fclose(r.f);
    };
    using Head = std::pair<BandKey, size_t>;
    auto later = [](const Head& x, const Head& y) { return y.first < x.first; };
    std::vector<Head> heap;
    for (size_t i = 0; i < files_.size(); ++i) {
      runs[i].f = std::fopen(files_[i].c_str(), "rb");
      if (!runs[i].f) {
        close_all();
        throw_runtime("{}: cannot reopen a spill file", files_[i]);
      }
      runs[i].b.resize(per_run);
      runs[i].pos = static_cast<size_t>(-1);  // next() reads the first block
      if (runs[i].next()) heap.emplace_back(runs[i].b[0], i);
    }
    std::make_heap(heap.begin(), heap.end(), later);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      auto [k, i] = heap.back();
      heap.pop_back();
      fn(k);
      if (runs[i].next()) {
        heap.emplace_back(runs[i].b[runs[i].pos], i);
        std::push_heap(heap.begin(), heap.end(), later);
      }
    }
    close_all();
  }
  void clear_files() {
    for (auto& f : files_) {
      std::error_code ec;
      fs::remove(f, ec);
    }
    files_.clear();
  }
  int64_t cap_;
  std::string dir_;
  std::vector<BandKey> buf_;
  std::vector<std::string> files_;
  int64_t spilled_ = 0, spilled_bytes_ = 0;
};

// Union-find over a sparse set of global document indices (the endpoints of edges).
struct SparseForest {
  std::vector<uint32_t> nodes;  // sorted, unique
  std::vector<uint32_t> parent;
  explicit SparseForest(const std::vector<uint64_t>& edges) {  // (a << 32 | b)
    for (uint64_t e : edges) {
      nodes.push_back(static_cast<uint32_t>(e >> 32));
      nodes.push_back(static_cast<uint32_t>(e));
    }
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
    parent.resize(nodes.size());
    for (size_t i = 0; i < parent.size(); ++i) parent[i] = static_cast<uint32_t>(i);
  }
  uint32_t index(uint32_t doc) const {
    return static_cast<uint32_t>(std::lower_bound(nodes.begin(), nodes.end(), doc) - nodes.begin());
  }
  uint32_t find(uint32_t x) {
    while (parent[x] != x) {
      parent[x] = parent[parent[x]];
      x = parent[x];
    }
    return x;
  }
  // The root is the component's lowest index, i.e. its lowest document.
  bool unite(uint32_t a, uint32_t b) {
    a = find(index(a));
    b = find(index(b));
    if (a == b) return false;
    if (a < b) std::swap(a, b);
    parent[a] = b;
    return true;
  }
};

}  // namespace

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    throw_input("{} {}: not a size (examples: 2G, 512M, 1073741824)", what, text);
  }
  std::string unit = text.substr(used);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (!unit.empty() && (unit.back() == 'i')) unit.pop_back();
  double mult = 1;
  if (unit == "K" || unit == "k")
    mult = 1024.0;
  else if (unit == "M" || unit == "m")
    mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "g")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "t")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty())
    throw_input("{} {}: unknown unit \"{}\" (use K, M, G or T)", what, text, unit);
  if (!(v >= 0) || v * mult > 9e18) throw_input("{} {}: out of range", what, text);
  return static_cast<int64_t>(v * mult);
}

namespace {

// The line-aligned byte range of one input that this rank reads, and its documents.
struct Piece {
  int64_t begin = 0, end = -1, lines_before = 0, first_doc = 0, docs = 0, local_first = 0;
};

// What pass 1's threads share: the reader thread hands batches of lines to the workers
// through `queue`; a worker that fails keeps the error of the lowest document.
struct HashPass {
  HashPass(int64_t k, uint64_t seed, size_t queue_cap, int64_t workers)
      : hasher(k, seed), queue(queue_cap), empty_per_worker(static_cast<size_t>(workers)) {}
  MinHasher hasher;
  BatchQueue queue;
  std::mutex err_m;
  std::exception_ptr err;
  std::atomic<int64_t> err_doc{std::numeric_limits<int64_t>::max()};
  std::atomic<bool> failed{false}, reader_done{false};
  std::atomic<int64_t> docs_read{0};
  std::exception_ptr reader_err;
  std::vector<std::vector<int64_t>> empty_per_worker;
};

// What pass 3's writer thread shares with the main thread.
struct WritePass {
  std::atomic<int64_t> docs_written{0};
  std::atomic<bool> done{false}, failed{false}, stop{false};
  std::exception_ptr write_err;
  std::string buf, line;
  size_t mj = 0;        // next of my_members
  int64_t unshown = 0;  // documents not yet added to docs_written
};

// A file descriptor closed when it goes out of scope (-1: none).
struct FdCloser {
  int fd = -1;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// Writes all of `buf` to `fd` at offset `at`, advancing `at` and `written`, and empties
// `buf`; `what` names the file in errors.
void pwrite_buffer(int fd, std::string& buf, int64_t& at, int64_t& written, const std::string& what) {
  const char* b = buf.data();
  size_t n = buf.size();
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, b, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw_runtime("{}: write failed ({})", what, w < 0 ? std::strerror(errno) : "no progress");
    b += w;
    n -= static_cast<size_t>(w);
    at += w;
    written += w;
  }
  buf.clear();
}

// One run of dedup on this rank: the state that crosses its stages. run_dedup calls the
// stages in order; every rank calls the same collectives in the same order. State that
// only one stage uses stays local to it.
struct DedupRun {
  DedupRun(const DedupOptions& o, RankComm* comm_in);

  // The stages, in order.
  void check_inputs();
  void count_shares();
  void budget_memory();
  void read_and_hash();
  void find_candidates();
  void verify_candidates();
  void join_forests();
  void choose_survivors();
  void write_kept_lines();
  void commit();

  // Parts of the stages.
  void place_pieces(const std::vector<int64_t>& counts);
  void hash_batches(HashPass& p, int64_t w);
  void read_share(HashPass& p);
  void await_hashing(HashPass& p, std::thread& reader, std::vector<std::thread>& pool);
  std::vector<std::vector<uint64_t>> bucket_pairs(KeyRuns& owned);
  void add_candidates(const std::vector<std::vector<uint64_t>>& pairs);
  void verify_remote(const std::vector<uint64_t>& remote);
  void receive_verdicts();
  void plan_slices();
  void create_outputs();
  void write_slices();
  void write_slice(int64_t f, WritePass& w);
  void gather_written();
  void rename_outputs();
  nlohmann::json where(uint32_t i) const;
  void write_clusters();
  nlohmann::json report_params() const;
  void write_report(double t_write_s, double t_total);

  int64_t holder(uint32_t doc) const;    // rank holding a global document
  int64_t file_of(uint32_t doc) const;   // its input file
  int64_t local_of(uint32_t doc) const;  // this rank's index of one of its documents

  // The run's parameters.
  Clock::time_point t_start = Clock::now();
  const DedupOptions& opt;
  SoloRankComm solo;
  RankComm& comm;
  const int64_t W, R;
  const bool show;
  const int64_t k;
  LshParams lsh;
  const int64_t workers;

  // Inputs (check_inputs, count_shares).
  std::vector<Source> sources;
  std::vector<int64_t> prio_rank;
  int64_t F = 0;
  std::vector<Piece> mine;           // this rank's piece of every input
  std::vector<int64_t> piece_first;  // global index of the first document of piece (f, q), f*W + q
  int64_t n_docs = 0, n_local = 0;
  int64_t key_cap = std::numeric_limits<int64_t>::max() / 64;  // keys held before spilling

  // Pass 1 and 2: signatures, line lengths, candidate pairs, edges.
  SignatureStore sigs;
  std::vector<uint32_t> line_len;  // bytes of each local document's line (without '\n'); reader thread
  std::vector<uint64_t> cand;      // (a << 32 | b), a < b, a held by this rank; sorted, unique
  std::vector<uint64_t> edges;     // (a << 32 | b)
  LshStats st;
  int64_t runs_spilled = 0, bytes_spilled = 0;
  int64_t stats[5] = {};  // st, runs and bytes spilled, summed over the ranks
  int64_t sig_allocated = 0;

  // Components and survivors (rank 0).
  std::vector<uint64_t> all_edges;
  std::vector<uint32_t> members, root, size, best;
  std::map<int64_t, int64_t> histogram;
  int64_t components = 0, docs_in_components = 0, n_edges = 0;
  std::vector<std::pair<uint32_t, uint32_t>> big;  // (size, root)
  std::vector<std::vector<uint32_t>> verdicts, sent_index;

  // Pass 3: what this rank writes where.
  std::vector<uint32_t> my_members;
  std::vector<uint8_t> keep;
  std::vector<int64_t> plan, offset, total;
  std::vector<std::string> temp;
  // Rank 0 removes the temporary files it created unless they were renamed into place
  // (a failure on any rank is agreed on before that, so no rank is still writing).
  struct TempFiles {
    std::vector<std::string> created;
    bool committed = false;
    ~TempFiles() {
      if (committed) return;
      for (auto& t : created) std::remove(t.c_str());
    }
  } temps;
  std::vector<int64_t> member_line;
  int64_t bytes_written = 0;
  std::vector<int64_t> written_per_rank;
  std::vector<int64_t> lines_of_members;  // rank 0: indexed like `members`

  double t_hash = 0, t_lsh_s = 0, t_cc_s = 0;
  Clock::time_point t_lsh, t_cc, t_write;
  DedupResult res;
};

DedupRun::DedupRun(const DedupOptions& o, RankComm* comm_in)
    : opt(o),
      comm(comm_in ? *comm_in : solo),
      W(comm.size()),
      R(comm.rank()),
      show(opt.progress && R == 0),
      k(opt.num_perm),
      lsh{opt.bands, opt.rows},
      workers(opt.workers > 0 ? opt.workers : std::max<int64_t>(1, std::thread::hardware_concurrency())),
      sigs(k) {}

int64_t DedupRun::holder(uint32_t doc) const {
  const int64_t i =
      std::upper_bound(piece_first.begin(), piece_first.end(), static_cast<int64_t>(doc)) - piece_first.begin() - 1;
  return i % W;
}
int64_t DedupRun::file_of(uint32_t doc) const {
  return (std::upper_bound(piece_first.begin(), piece_first.end(), static_cast<int64_t>(doc)) - piece_first.begin() -
          1) /
         W;
}
int64_t DedupRun::local_of(uint32_t doc) const {
  const auto& p = mine[static_cast<size_t>(file_of(doc))];
  return p.local_first + (static_cast<int64_t>(doc) - p.first_doc);
}

// --- sources, names, outputs, priority: all checked before any work -----------
void DedupRun::check_inputs() {
  agree(comm, "checking the inputs", [&] {
    if (opt.inputs.empty()) throw_input("dedup: no --input files");
    if (opt.ngram < 1) throw_input("--ngram {} must be at least 1", opt.ngram);
    if (!(opt.threshold > 0.0 && opt.threshold <= 1.0)) throw_input("--threshold {} must be in (0, 1]", opt.threshold);
    if (opt.memory_per_rank < 0) throw_input("--memory-per-rank must not be negative");
    if (lsh.bands == 0 && lsh.rows == 0) {
      lsh = choose_bands(std::min(opt.threshold, 0.999), k);
    } else if (lsh.bands < 1 || lsh.rows < 1 || lsh.bands * lsh.rows > k) {
      throw_input("--bands {} x --rows {} must be positive with bands*rows <= --num-perm {}", lsh.bands, lsh.rows, k);
    }
    std::map<std::string, int> by_name;
    std::error_code ec;
    if (R == 0) {
      fs::create_directories(opt.output_dir, ec);
      if (ec) throw_input("--output-dir {}: cannot create ({})", opt.output_dir, ec.message());
    }
    if (!opt.tmp_dir.empty()) {
      fs::create_directories(opt.tmp_dir, ec);
      if (ec || !fs::is_directory(opt.tmp_dir)) throw_input("--tmp-dir {}: cannot create the directory", opt.tmp_dir);
    }
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
    prio_rank.assign(sources.size(), static_cast<int64_t>(opt.priority.size()));
    for (size_t i = 0; i < opt.priority.size(); ++i) {
      auto it = by_name.find(opt.priority[i]);
      if (it == by_name.end()) {
        std::string valid;
        for (auto& s : sources) valid += (valid.empty() ? "" : ", ") + s.name;
        throw_input("--priority: unknown source \"{}\" (valid names, the input file stems: {})", opt.priority[i],
                    valid);
      }
      prio_rank[it->second] = std::min<int64_t>(prio_rank[it->second], static_cast<int64_t>(i));
    }
  });
  F = static_cast<int64_t>(sources.size());
}

// --- shares: rank q reads the q-th line-aligned byte range of every input --------
// counts[(f*W + q)*2 + {0,1}] = lines, documents of piece (f, q) (empty documents are
// counted by pass 1, which reads them).
void DedupRun::count_shares() {
  mine.resize(static_cast<size_t>(F));
  std::vector<int64_t> counts(static_cast<size_t>(2 * F * W), 0);
  agree(comm, "reading its share", [&] {
    for (int64_t f = 0; f < F; ++f) {
      auto& p = mine[f];
      if (W == 1) {
        p.begin = 0;
        p.end = -1;
      } else {
        std::tie(p.begin, p.end) = data::line_aligned_range(sources[f].path, W, R);
      }
      const auto c = count_lines(sources[f].path, p.begin, p.end);
      counts[static_cast<size_t>((f * W + R) * 2)] = c.lines;
      counts[static_cast<size_t>((f * W + R) * 2 + 1)] = c.documents;
    }
  });
  comm.all_reduce_sum(counts.data(), static_cast<int64_t>(counts.size()));
  // Global document index: file-major, then line order (= piece order within a file).
  piece_first.assign(static_cast<size_t>(F * W + 1), 0);
  for (int64_t i = 0; i < F * W; ++i) piece_first[i + 1] = piece_first[i] + counts[static_cast<size_t>(2 * i + 1)];
  n_docs = piece_first.back();
  if (n_docs >= std::numeric_limits<uint32_t>::max())
    throw_input("dedup: {} documents; at most {} per run are supported", n_docs,
                std::numeric_limits<uint32_t>::max() - 1);
  res.documents = n_docs;
  place_pieces(counts);
}

// This rank's pieces in the global document index, and each source's totals.
void DedupRun::place_pieces(const std::vector<int64_t>& counts) {
  for (int64_t f = 0; f < F; ++f) {
    auto& p = mine[f];
    for (int64_t q = 0; q < R; ++q) p.lines_before += counts[static_cast<size_t>((f * W + q) * 2)];
    p.first_doc = piece_first[f * W + R];
    p.docs = counts[static_cast<size_t>((f * W + R) * 2 + 1)];
    p.local_first = n_local;
    n_local += p.docs;
    sources[f].first_doc = piece_first[f * W];
    for (int64_t q = 0; q < W; ++q) {
      sources[f].docs += counts[static_cast<size_t>((f * W + q) * 2 + 1)];
      sources[f].blank_lines +=
          counts[static_cast<size_t>((f * W + q) * 2)] - counts[static_cast<size_t>((f * W + q) * 2 + 1)];
    }
    sources[f].bytes = static_cast<int64_t>(fs::file_size(sources[f].path));
  }
}

// Memory budget: the signatures stay in memory; what is left (less a working
// allowance for read buffers and queues) bounds the band keys held at once: a send
// round, a receive round and the owned keys, 16 bytes each, up to `key_cap` keys
// each; the owned keys beyond it are spilled. A budget below the signatures cannot be
// kept: the rank says so and runs with the smallest spill runs (64 keys).
// (Signatures are allocated in chunks of kChunkDocs documents: count what is allocated.)
void DedupRun::budget_memory() {
  const int64_t sig_bytes =
      (n_local + SignatureStore::kChunkDocs - 1) / SignatureStore::kChunkDocs * SignatureStore::kChunkDocs * k * 4;
  // Each document's line length (4 bytes) is kept too: the write pass needs the kept
  // bytes of every rank's share before it writes (its offsets in the output files).
  const int64_t len_bytes = n_local * 4;
  if (opt.memory_per_rank > 0) {
    const int64_t allowance = std::min<int64_t>(64ll << 20, opt.memory_per_rank / 8);
    const int64_t left = opt.memory_per_rank - allowance - sig_bytes - len_bytes;
    if (left < 0)
      log::warn(
          "--memory-per-rank {:.1f} MiB: the MinHash signatures and line lengths of this rank's {} documents alone "
          "need {:.1f} MiB; the budget will be exceeded (use more ranks or a larger budget)",
          static_cast<double>(opt.memory_per_rank) / 1048576.0, n_local,
          static_cast<double>(sig_bytes + len_bytes) / 1048576.0);
    key_cap = std::max<int64_t>(64, left / 3 / static_cast<int64_t>(sizeof(BandKey)));
  }
}

// --- pass 1: read this rank's share, hash ---------------------------------------
// A reader thread, `workers` hashing threads; this thread shows the progress.
void DedupRun::read_and_hash() {
  line_len.reserve(static_cast<size_t>(n_local));
  std::vector<int64_t> empty_per_file(static_cast<size_t>(F), 0);
  {
    HashPass p(k, opt.seed, static_cast<size_t>(2 * workers + 2), workers);
    std::vector<std::thread> pool;
    for (int64_t w = 0; w < workers; ++w) pool.emplace_back([this, &p, w] { hash_batches(p, w); });
    std::thread reader([this, &p] { read_share(p); });
    await_hashing(p, reader, pool);
    agree(comm, "reading its share", [&] {
      if (p.reader_err) std::rethrow_exception(p.reader_err);
      if (p.err) std::rethrow_exception(p.err);
    });
    for (auto& e : p.empty_per_worker)
      for (size_t i = 0; i < e.size(); ++i) empty_per_file[i] += e[i];
  }
  comm.all_reduce_sum(empty_per_file.data(), F);
  for (int64_t f = 0; f < F; ++f) sources[f].empty = empty_per_file[f];
  t_hash = seconds_since(t_start);
}

// A worker thread (w): parses, normalises, shingles and MinHashes the batches' lines
// into their signatures, and counts the empty documents of each source.
void DedupRun::hash_batches(HashPass& p, int64_t w) {
  std::vector<Word> words;
  std::vector<uint64_t> sh;
  std::vector<int64_t> empties(sources.size(), 0);
  while (auto b = p.queue.pop()) {
    if (p.failed.load() && b->first_doc > p.err_doc.load()) continue;  // err_doc only shrinks
    const std::string& path = sources[b->src].path;
    for (size_t i = 0; i < b->lines.size(); ++i) {
      int64_t doc = b->first_doc + static_cast<int64_t>(i);
      try {
        std::string text = extract_text(b->lines[i], opt.json_key, path, b->line_nos[i]);
        normalize_words(text, words);
        shingle_hashes(words, opt.ngram, sh);
        p.hasher.signature(sh.data(), static_cast<int64_t>(sh.size()), sigs.at(doc));
        if (sh.empty()) ++empties[b->src];
      } catch (...) {
        std::lock_guard lk(p.err_m);
        if (doc < p.err_doc.load()) {
          p.err_doc.store(doc);
          p.err = std::current_exception();
        }
        p.failed = true;
        break;
      }
    }
  }
  p.empty_per_worker[w] = std::move(empties);
}

// The reader thread: this rank's piece of every input, in batches, to the workers; it
// keeps each document's line length and allocates the signatures ahead of the workers.
void DedupRun::read_share(HashPass& p) {
  try {
    int64_t doc = 0;  // local index
    constexpr size_t kBatch = 512;
    for (size_t si = 0; si < sources.size() && !p.failed.load(); ++si) {
      const Piece& pc = mine[si];
      if (pc.docs == 0) continue;
      LineReader reader(sources[si].path, pc.begin, pc.end, pc.lines_before);
      Batch b;
      b.src = static_cast<int>(si);
      b.first_doc = doc;
      std::string line;
      int64_t line_no = 0;
      auto flush = [&] {
        if (b.lines.empty()) return;
        sigs.ensure(doc);
        const int64_t n = static_cast<int64_t>(b.lines.size());
        p.queue.push(std::move(b));
        b = Batch{};
        b.src = static_cast<int>(si);
        b.first_doc = doc;
        p.docs_read += n;
      };
      while (reader.next(line, line_no)) {
        if (is_blank_line(line)) continue;
        if (line.size() > std::numeric_limits<uint32_t>::max())
          throw_input("{}:{}: a line of {} bytes; dedup supports lines up to 4 GiB", sources[si].path, line_no,
                      line.size());
        line_len.push_back(static_cast<uint32_t>(line.size()));
        b.lines.push_back(std::move(line));
        b.line_nos.push_back(line_no);
        ++doc;
        if (b.lines.size() == kBatch) {
          flush();
          if (p.failed.load()) break;
        }
      }
      flush();
      if (!p.failed.load() && doc != pc.local_first + pc.docs)
        throw_runtime("{}: changed while dedup was running", sources[si].path);
    }
  } catch (...) {
    p.reader_err = std::current_exception();
  }
  p.queue.close();
  p.reader_done = true;
}

// The reader runs on its own thread; this (the main) thread sums the ranks'
// document counts about once a second for rank 0's progress line (MPI calls stay
// on the main thread). Returns when every rank's reader is done, the threads joined.
void DedupRun::await_hashing(HashPass& p, std::thread& reader, std::vector<std::thread>& pool) {
  Progress prog(W > 1 ? fmt::format("dedup: minhash ({} ranks)", W) : std::string("dedup: minhash"), n_docs, "docs",
                show);
  int64_t shown = 0;
  for (;;) {
    for (int i = 0; i < 20 && !p.reader_done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    int64_t v[2] = {p.docs_read.load(), p.reader_done.load() ? 1 : 0};
    if (W > 1) comm.all_reduce_sum(v, 2);
    if (v[0] > shown) prog.add(v[0] - shown);
    shown = v[0];
    if (v[1] == W) break;
  }
  reader.join();
  for (auto& t : pool) t.join();
  if (!p.reader_err && !p.failed.load()) prog.finish();
}

// --- pass 2: band keys to their owners, candidate pairs -------------------------
void DedupRun::find_candidates() {
  t_lsh = Clock::now();
  std::vector<uint8_t> empty(static_cast<size_t>(n_local));
  for (int64_t d = 0; d < n_local; ++d) empty[d] = is_empty_signature(sigs.at(d), k);
  std::vector<uint32_t> local_doc(static_cast<size_t>(n_local));  // local -> global index
  for (int64_t f = 0; f < F; ++f)
    for (int64_t i = 0; i < mine[f].docs; ++i)
      local_doc[mine[f].local_first + i] = static_cast<uint32_t>(mine[f].first_doc + i);
  // Keys are sent in rounds of at most key_cap documents per rank (but at least 65,536,
  // 1 MiB of keys, so a starved budget does not turn into thousands of tiny rounds), so
  // a rank holds one round's keys besides those it owns.
  const int64_t send_cap = std::max<int64_t>(key_cap, 1 << 16);
  int64_t rounds = std::max<int64_t>(1, (n_local + send_cap - 1) / send_cap);
  comm.all_reduce_max(&rounds, 1);
  const int64_t per_round = (n_local + rounds - 1) / rounds;
  std::string spill_dir = (fs::path(opt.tmp_dir.empty() ? opt.output_dir : opt.tmp_dir) /
                           fmt::format(".dedup-spill-rank{}-{}", R, static_cast<long>(::getpid())))
                              .string();
  struct SpillDir {
    std::string path;
    ~SpillDir() {
      std::error_code ec;
      if (!path.empty()) fs::remove_all(path, ec);
    }
  } spill_guard{spill_dir};
  Progress prog("dedup: lsh bands", lsh.bands, "bands", show);
  for (int64_t band = 0; band < lsh.bands; ++band) {
    KeyRuns owned(key_cap, spill_dir);
    for (int64_t round = 0; round < rounds; ++round) {
      std::vector<std::vector<BandKey>> out(static_cast<size_t>(W));
      const int64_t lo = std::min(n_local, round * per_round), hi = std::min(n_local, lo + per_round);
      for (int64_t d = lo; d < hi; ++d) {
        if (empty[d]) continue;
        const uint64_t h = band_hash(sigs.at(d), band, lsh.rows);
        out[static_cast<size_t>(h % static_cast<uint64_t>(W))].push_back(BandKey{h, local_doc[d]});
      }
      owned.add(exchange_records(comm, out));
    }
    const auto pairs = bucket_pairs(owned);
    runs_spilled += owned.runs_spilled();
    bytes_spilled += owned.bytes_spilled();
    add_candidates(pairs);
    prog.add(1);
  }
  prog.finish();
}

// Buckets -> candidate pairs, routed to the rank holding the pair's first doc.
std::vector<std::vector<uint64_t>> DedupRun::bucket_pairs(KeyRuns& owned) {
  std::vector<std::vector<uint64_t>> pairs(static_cast<size_t>(W));
  std::vector<uint32_t> in_bucket;
  auto emit = [&](uint32_t a, uint32_t b) {
    if (a > b) std::swap(a, b);
    pairs[static_cast<size_t>(holder(a))].push_back(static_cast<uint64_t>(a) << 32 | b);
  };
  auto bucket = [&] {
    const size_t m = in_bucket.size();
    if (m >= 2 && m <= static_cast<size_t>(kAllPairsBucket)) {
      for (size_t x = 0; x < m; ++x)
        for (size_t y = x + 1; y < m; ++y) emit(in_bucket[x], in_bucket[y]);
    } else if (m > static_cast<size_t>(kAllPairsBucket)) {
      // A huge bucket (boilerplate): every member against the first kMaxLeaders.
      ++st.large_buckets;
      for (size_t x = 0; x < static_cast<size_t>(kMaxLeaders); ++x)
        for (size_t y = x + 1; y < m; ++y) emit(in_bucket[x], in_bucket[y]);
    }
    in_bucket.clear();
  };
  uint64_t cur = 0;
  owned.scan([&](const BandKey& key) {
    if (!in_bucket.empty() && key.hash != cur) bucket();
    cur = key.hash;
    in_bucket.push_back(key.doc);
  });
  bucket();
  return pairs;
}

// One band's pairs to the ranks holding their first documents, merged into `cand`.
void DedupRun::add_candidates(const std::vector<std::vector<uint64_t>>& pairs) {
  std::vector<uint64_t> got;
  {
    const auto bytes = exchange_records(comm, pairs);
    got.resize(bytes.size() / 8);
    if (!got.empty()) std::memcpy(got.data(), bytes.data(), bytes.size());
  }
  std::sort(got.begin(), got.end());
  got.erase(std::unique(got.begin(), got.end()), got.end());
  std::vector<uint64_t> merged;
  merged.reserve(cand.size() + got.size());
  std::set_union(cand.begin(), cand.end(), got.begin(), got.end(), std::back_inserter(merged));
  cand.swap(merged);
}

// --- verification: a pair is checked on the rank holding its second document ----
// (when that is another rank, the first document's signature travels there, in
// rounds of at most 32 MiB, or a third of the keys' budget, per rank).
void DedupRun::verify_candidates() {
  st.pairs_checked = static_cast<int64_t>(cand.size());
  std::vector<uint64_t> remote;
  for (uint64_t c : cand) {
    const uint32_t a = static_cast<uint32_t>(c >> 32), b = static_cast<uint32_t>(c);
    if (holder(b) != R)
      remote.push_back(c);
    else if (estimate_jaccard(sigs.at(local_of(a)), sigs.at(local_of(b)), k) >= opt.threshold)
      edges.push_back(c);
  }
  std::vector<uint64_t>().swap(cand);
  verify_remote(remote);
  st.pairs_verified = static_cast<int64_t>(edges.size());
  sig_allocated = sigs.bytes();
  sigs = SignatureStore(k);  // the signatures are no longer needed
  int64_t v[5] = {st.pairs_checked, st.pairs_verified, st.large_buckets, runs_spilled, bytes_spilled};
  comm.all_reduce_sum(v, 5);
  std::copy(v, v + 5, stats);
  t_lsh_s = seconds_since(t_lsh);
}

// The pairs whose second document another rank holds: (a, b, signature of a) records
// there, in rounds; the verified ones become that rank's edges.
void DedupRun::verify_remote(const std::vector<uint64_t>& remote) {
  const int64_t rec_words = 2 + k;  // a, b, signature of a (uint32 each)
  const int64_t round_bytes = opt.memory_per_rank > 0 ? std::min<int64_t>(key_cap * 16, 32ll << 20) : (32ll << 20);
  const int64_t max_rec = std::max<int64_t>(64, round_bytes / (rec_words * 4));
  int64_t vrounds = std::max<int64_t>(1, (static_cast<int64_t>(remote.size()) + max_rec - 1) / max_rec);
  comm.all_reduce_max(&vrounds, 1);
  const size_t per = (remote.size() + static_cast<size_t>(vrounds) - 1) / static_cast<size_t>(vrounds);
  std::vector<uint32_t> sig_a(static_cast<size_t>(k));
  for (int64_t round = 0; round < vrounds; ++round) {
    std::vector<std::vector<uint32_t>> out(static_cast<size_t>(W));
    const size_t lo = std::min(remote.size(), static_cast<size_t>(round) * per), hi = std::min(remote.size(), lo + per);
    for (size_t i = lo; i < hi; ++i) {
      const uint32_t a = static_cast<uint32_t>(remote[i] >> 32), b = static_cast<uint32_t>(remote[i]);
      auto& o = out[static_cast<size_t>(holder(b))];
      o.push_back(a);
      o.push_back(b);
      const uint32_t* sa = sigs.at(local_of(a));
      o.insert(o.end(), sa, sa + k);
    }
    const auto got = exchange_records(comm, out);
    out.clear();
    const size_t words = got.size() / 4;
    for (size_t i = 0; i + static_cast<size_t>(rec_words) <= words; i += static_cast<size_t>(rec_words)) {
      const uint32_t a = read_at<uint32_t>(got, i), b = read_at<uint32_t>(got, i + 1);
      std::memcpy(sig_a.data(), got.data() + (i + 2) * 4, static_cast<size_t>(k) * 4);
      if (estimate_jaccard(sig_a.data(), sigs.at(local_of(b)), k) >= opt.threshold)
        edges.push_back(static_cast<uint64_t>(a) << 32 | b);
    }
  }
}

// --- components: each rank's edges reduced to a spanning forest, joined on rank 0 --
void DedupRun::join_forests() {
  t_cc = Clock::now();
  std::vector<std::vector<uint64_t>> forest(static_cast<size_t>(W));
  {
    SparseForest uf(edges);
    for (uint64_t e : edges)
      if (uf.unite(static_cast<uint32_t>(e >> 32), static_cast<uint32_t>(e))) forest[0].push_back(e);
    std::vector<uint64_t>().swap(edges);
  }
  const auto bytes = exchange_records(comm, forest);
  all_edges.resize(bytes.size() / 8);
  if (!all_edges.empty()) std::memcpy(all_edges.data(), bytes.data(), bytes.size());
}

// --- survivors (rank 0): one union-find over every rank's forest ------------------
// Members of groups of 2+ (sorted by document), their root, each root's survivor:
// key (priority rank of the source, document index) == (rank, input order, line).
// Rank 0 tells the rank holding each member whether it is kept: (doc, kept) records in
// verdicts[q]; sent_index[q] lists the member index of each record sent to rank q.
void DedupRun::choose_survivors() {
  verdicts.resize(static_cast<size_t>(W));
  sent_index.resize(static_cast<size_t>(W));
  if (R == 0) {
    SparseForest uf(all_edges);
    for (uint64_t e : all_edges) n_edges += uf.unite(static_cast<uint32_t>(e >> 32), static_cast<uint32_t>(e));
    std::vector<uint64_t>().swap(all_edges);
    const size_t M = uf.nodes.size();
    root.resize(M);
    size.assign(M, 0);
    best.resize(M);
    for (size_t i = 0; i < M; ++i) {
      const uint32_t r = uf.find(static_cast<uint32_t>(i));
      root[i] = r;
      if (size[r]++ == 0) {
        best[r] = static_cast<uint32_t>(i);
      } else if (prio_rank[file_of(uf.nodes[i])] < prio_rank[file_of(uf.nodes[best[r]])]) {
        best[r] = static_cast<uint32_t>(i);  // members come in document order: ties keep the earlier
      }
    }
    for (size_t i = 0; i < M; ++i)
      if (root[i] == i) {
        ++components;
        docs_in_components += size[i];
        ++histogram[size[i]];
        big.emplace_back(size[i], static_cast<uint32_t>(i));
      }
    std::sort(big.begin(), big.end(),
              [](auto& x, auto& y) { return x.first != y.first ? x.first > y.first : x.second < y.second; });
    if (big.size() > 10) big.resize(10);
    members = std::move(uf.nodes);
    for (size_t i = 0; i < M; ++i) {
      const auto q = static_cast<size_t>(holder(members[i]));
      verdicts[q].push_back(members[i]);
      verdicts[q].push_back(best[root[i]] == i ? 1u : 0u);
      sent_index[q].push_back(static_cast<uint32_t>(i));
    }
  }
  t_cc_s = seconds_since(t_cc);
}

// --- pass 3 (every rank): its kept lines into its slice of each output ------------
void DedupRun::write_kept_lines() {
  t_write = Clock::now();
  receive_verdicts();
  plan_slices();
  create_outputs();
  write_slices();
  gather_written();
}

// This rank's documents in groups (ascending, as its local documents are) and which
// of them are removed.
void DedupRun::receive_verdicts() {
  keep.assign(static_cast<size_t>(n_local), 1);
  const auto bytes = exchange_records(comm, verdicts);
  verdicts.clear();
  const size_t n = bytes.size() / 8;
  my_members.resize(n);
  for (size_t j = 0; j < n; ++j) {
    my_members[j] = read_at<uint32_t>(bytes, 2 * j);
    if (read_at<uint32_t>(bytes, 2 * j + 1) == 0) keep[static_cast<size_t>(local_of(my_members[j]))] = 0;
  }
}

// plan[f*W + q]: bytes rank q writes to output f; plan[F*W + f*W + q]: its kept lines.
// This rank's offset in each output is the bytes of the ranks before it.
void DedupRun::plan_slices() {
  plan.assign(static_cast<size_t>(2 * F * W), 0);
  for (int64_t f = 0; f < F; ++f) {
    const auto& p = mine[static_cast<size_t>(f)];
    for (int64_t d = p.local_first; d < p.local_first + p.docs; ++d)
      if (keep[static_cast<size_t>(d)]) {
        plan[static_cast<size_t>(f * W + R)] += static_cast<int64_t>(line_len[static_cast<size_t>(d)]) + 1;
        ++plan[static_cast<size_t>(F * W + f * W + R)];
      }
  }
  comm.all_reduce_sum(plan.data(), static_cast<int64_t>(plan.size()));
  offset.assign(static_cast<size_t>(F), 0);
  total.assign(static_cast<size_t>(F), 0);
  for (int64_t f = 0; f < F; ++f) {
    for (int64_t q = 0; q < W; ++q) {
      if (q < R) offset[static_cast<size_t>(f)] += plan[static_cast<size_t>(f * W + q)];
      total[static_cast<size_t>(f)] += plan[static_cast<size_t>(f * W + q)];
      sources[static_cast<size_t>(f)].kept += plan[static_cast<size_t>(F * W + f * W + q)];
    }
  }
}

// Temporary names every rank knows (rank 0's pid): OUT/<name>.tmp.<pid>.dedup. Rank 0
// creates each one at its final size. (Not core's AtomicFile: its temporary name is
// known only to the process that made it, and it writes one stream through its own
// FILE*; here every rank pwrite()s its slice of a file that rank 0 created and sized.)
void DedupRun::create_outputs() {
  int64_t pid0 = R == 0 ? static_cast<int64_t>(::getpid()) : 0;
  comm.all_reduce_max(&pid0, 1);
  temp.resize(static_cast<size_t>(F));
  for (int64_t f = 0; f < F; ++f)
    temp[static_cast<size_t>(f)] = fmt::format("{}.tmp.{}.dedup", sources[f].out_path, pid0);
  agree(comm, "creating the outputs", [&] {
    if (R != 0) return;
    for (int64_t f = 0; f < F; ++f) {
      const std::string& t = temp[static_cast<size_t>(f)];
      const int fd = ::open(t.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
      if (fd < 0) throw_runtime("{}: cannot create {} ({})", sources[f].out_path, t, std::strerror(errno));
      temps.created.push_back(t);
      const int rc = ::ftruncate(fd, static_cast<off_t>(total[static_cast<size_t>(f)]));
      const int err = errno;
      ::close(fd);
      if (rc != 0)
        throw_runtime("{}: cannot size {} to {} bytes ({})", sources[f].out_path, t, total[static_cast<size_t>(f)],
                      std::strerror(err));
    }
  });
}

// The write runs on a helper thread; this thread all-reduces the ranks' counts about
// once a second for rank 0's progress line, and tells the helper to stop when another
// rank has failed (MPI calls stay on the main thread).
void DedupRun::write_slices() {
  member_line.assign(my_members.size(), 0);
  WritePass w;
  std::thread writer([&] {
    try {
      for (int64_t f = 0; f < F; ++f) write_slice(f, w);
    } catch (const PeerFailed&) {
    } catch (...) {
      w.write_err = std::current_exception();
      w.failed = true;
    }
    w.done = true;
  });
  {
    Progress prog(W > 1 ? fmt::format("dedup: write ({} ranks)", W) : std::string("dedup: write"), n_docs, "docs",
                  show);
    int64_t shown = 0;
    for (;;) {
      for (int i = 0; i < 20 && !w.done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      int64_t v[3] = {w.docs_written.load(), w.done.load() ? 1 : 0, w.failed.load() ? 1 : 0};
      if (W > 1) comm.all_reduce_sum(v, 3);
      if (v[0] > shown) prog.add(v[0] - shown);
      shown = v[0];
      if (v[2] > 0) w.stop = true;
      if (v[1] == W) break;
    }
    writer.join();
    if (!w.failed.load() && shown == n_docs) prog.finish();
  }
  agree(comm, "writing the outputs", [&] {
    if (w.write_err) std::rethrow_exception(w.write_err);
  });
}

// The writer thread, input f: reads this rank's piece again and pwrite()s its kept lines
// at its offset in the temporary output, noting the line of each group member; checks
// that the input did not change and fsyncs the slice.
void DedupRun::write_slice(int64_t f, WritePass& w) {
  constexpr size_t kFlush = 4 << 20;
  const Piece& p = mine[static_cast<size_t>(f)];
  if (p.docs == 0) return;
  const std::string& path = sources[f].path;
  const std::string& t = temp[static_cast<size_t>(f)];
  const int64_t mine_bytes = plan[static_cast<size_t>(f * W + R)];
  FdCloser out;
  if (mine_bytes > 0) {
    out.fd = ::open(t.c_str(), O_WRONLY | O_CLOEXEC);
    if (out.fd < 0) throw_runtime("{}: cannot open {} ({})", sources[f].out_path, t, std::strerror(errno));
  }
  int64_t at = offset[static_cast<size_t>(f)];
  LineReader reader(path, p.begin, p.end, p.lines_before);
  int64_t line_no = 0, d = p.local_first;
  while (reader.next(w.line, line_no)) {
    if (is_blank_line(w.line)) continue;
    if (d == p.local_first + p.docs || w.line.size() != line_len[static_cast<size_t>(d)])
      throw_runtime("{}: changed while dedup was running (line {})", path, line_no);
    if (w.mj < my_members.size() && my_members[w.mj] == static_cast<uint32_t>(p.first_doc + (d - p.local_first)))
      member_line[w.mj++] = line_no;
    if (keep[static_cast<size_t>(d)]) {
      w.buf += w.line;
      w.buf += '\n';
      if (w.buf.size() >= kFlush) pwrite_buffer(out.fd, w.buf, at, bytes_written, t);
    }
    ++d;
    if (++w.unshown == 1024) {
      w.docs_written += w.unshown;
      w.unshown = 0;
      if (w.stop.load()) throw PeerFailed{};
    }
  }
  pwrite_buffer(out.fd, w.buf, at, bytes_written, t);
  w.docs_written += w.unshown;
  w.unshown = 0;
  if (d != p.local_first + p.docs) throw_runtime("{}: changed while dedup was running (fewer lines)", path);
  MTNLG_CHECK(at == offset[static_cast<size_t>(f)] + mine_bytes, "{}: wrote {} bytes, planned {}", t,
              at - offset[static_cast<size_t>(f)], mine_bytes);
  if (opt.fail_write_rank == R && bytes_written > 0)
    throw_runtime("{}: write failed (injected by MTNLG_TEST_DEDUP_FAIL_WRITE_RANK={})", t, R);
  if (out.fd >= 0 && ::fsync(out.fd) != 0) throw_runtime("{}: write failed ({})", t, std::strerror(errno));
}

// What each rank wrote (the "run" object of the report), and the lines of the group
// members, which rank 0 needs for the clusters file and the report.
void DedupRun::gather_written() {
  written_per_rank.assign(static_cast<size_t>(W), 0);
  written_per_rank[static_cast<size_t>(R)] = bytes_written;
  comm.all_reduce_sum(written_per_rank.data(), W);
  std::vector<std::vector<int64_t>> back(static_cast<size_t>(W));
  back[0] = std::move(member_line);
  const auto bytes = exchange_records(comm, back);
  if (R == 0) {
    lines_of_members.assign(members.size(), 0);
    size_t at = 0;
    for (int64_t q = 0; q < W; ++q)
      for (uint32_t i : sent_index[static_cast<size_t>(q)]) lines_of_members[i] = read_at<int64_t>(bytes, at++);
  }
}

// --- commit (rank 0): rename the outputs into place, clusters, report --------------
void DedupRun::commit() {
  agree(comm, "writing the outputs", [&] {
    if (R != 0) return;
    rename_outputs();
    if (opt.write_clusters) write_clusters();
    double t_write_s = seconds_since(t_write);
    double t_total = seconds_since(t_start);
    write_report(t_write_s, t_total);
  });
}

// The other ranks synced their slices; this syncs the sizes, renames every output into
// place and syncs the directory.
void DedupRun::rename_outputs() {
  for (int64_t f = 0; f < F; ++f) {
    const std::string& t = temp[static_cast<size_t>(f)];
    const int fd = ::open(t.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) throw_runtime("{}: cannot reopen {} ({})", sources[f].out_path, t, std::strerror(errno));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) throw_runtime("{}: write failed ({})", t, std::strerror(err));
  }
  for (int64_t f = 0; f < F; ++f)
    if (std::rename(temp[static_cast<size_t>(f)].c_str(), sources[f].out_path.c_str()) != 0)
      throw_runtime("{}: cannot rename {} into place ({})", sources[f].out_path, temp[static_cast<size_t>(f)],
                    std::strerror(errno));
  temps.committed = true;
  fsync_directory(opt.output_dir);
}

// Where member i is: its source and line.
nlohmann::json DedupRun::where(uint32_t i) const {
  return nlohmann::json{{"source", sources[file_of(members[i])].name}, {"line", lines_of_members[i]}};
}

// OUT/dedup_clusters.jsonl: one line per group, groups ordered by their first document.
void DedupRun::write_clusters() {
  std::vector<std::pair<uint32_t, uint32_t>> by_root;  // (root, member)
  for (size_t i = 0; i < members.size(); ++i) by_root.emplace_back(root[i], static_cast<uint32_t>(i));
  std::sort(by_root.begin(), by_root.end());
  AtomicWriter out((fs::path(opt.output_dir) / "dedup_clusters.jsonl").string());
  for (size_t i = 0; i < by_root.size();) {
    const uint32_t r = by_root[i].first;
    nlohmann::json c{{"size", size[r]}, {"kept", where(best[r])}};
    auto removed = nlohmann::json::array();
    size_t j = i;
    for (; j < by_root.size() && by_root[j].first == r; ++j)
      if (by_root[j].second != best[r]) removed.push_back(where(by_root[j].second));
    c["removed"] = std::move(removed);
    out.write_line(c.dump());
    i = j;
  }
  out.close();
}

// The "params" object of the report.
nlohmann::json DedupRun::report_params() const {
  nlohmann::json curve = nlohmann::json::array();
  for (double s : {0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95})
    curve.push_back({{"jaccard", s}, {"p_candidate", lsh_candidate_probability(s, lsh.bands, lsh.rows)}});
  std::vector<std::string> prio = opt.priority;
  return {{"threshold", opt.threshold},
          {"ngram", opt.ngram},
          {"num_perm", k},
          {"bands", lsh.bands},
          {"rows", lsh.rows},
          {"seed", opt.seed},
          {"json_key", opt.json_key},
          {"workers", workers},
          {"priority", prio},
          {"s_curve", curve}};
}

// --- report ---------------------------------------------------------------------
// The counts of `res` and OUT/dedup_report.json.
void DedupRun::write_report(double t_write_s, double t_total) {
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
  res.report = {
      {"format", "mtnlg-dedup-report"},
      {"version", 1},
      {"params", report_params()},
      {"sources", jsources},
      {"totals", {{"documents", n_docs}, {"kept", res.kept}, {"removed", res.removed}, {"empty", res.empty}}},
      {"removed_per_source", removed_per},
      {"candidates",
       {{"pairs_checked", stats[0]}, {"pairs_verified", stats[1]}, {"edges", n_edges}, {"large_buckets", stats[2]}}},
      {"components",
       {{"count", components}, {"documents", docs_in_components}, {"size_histogram", hist}, {"largest", largest}}},
      {"signature_bytes", n_docs * k * 4},
      // How this run was laid out (differs with the number of ranks, unlike the rest).
      {"run",
       {{"ranks", W},
        {"memory_per_rank", opt.memory_per_rank},
        {"rank0_signature_bytes_allocated", sig_allocated},
        {"key_runs_spilled", stats[3]},
        {"key_bytes_spilled", stats[4]},
        // Bytes of the outputs each rank wrote (its kept lines; every rank writes its
        // own share of every output file).
        {"output_bytes_written_per_rank", written_per_rank}}},
      {"timing_s",
       {{"read_and_minhash", t_hash},
        {"lsh_and_verify", t_lsh_s},
        {"components", t_cc_s},
        {"write", t_write_s},
        {"total", t_total}}},
      {"docs_per_s", t_total > 0 ? static_cast<double>(n_docs) / t_total : 0.0}};
  write_file_atomic((fs::path(opt.output_dir) / "dedup_report.json").string(), res.report.dump(2) + "\n");
}

}  // namespace

DedupResult run_dedup(const DedupOptions& opt, RankComm* comm_in) {
  DedupRun run(opt, comm_in);
  run.check_inputs();
  run.count_shares();
  run.budget_memory();
  run.read_and_hash();
  run.find_candidates();
  run.verify_candidates();
  run.join_forests();
  run.choose_survivors();
  run.write_kept_lines();
  run.commit();
  return std::move(run.res);
}

}  // namespace mtnlg::curation
