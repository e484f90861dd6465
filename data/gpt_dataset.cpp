// GPT sample indices (see gpt_dataset.hpp).
#include "data/gpt_dataset.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace mtnlg::data {

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffull) {
    while ((value = (static_cast<uint64_t>(mt_()) & mask)) > max) {}
  } else {
    // numpy's next_uint64 for MT19937: two draws, the first is the high word.
    while (true) {
      const uint64_t hi = mt_(), lo = mt_();
      value = ((hi << 32) | lo) & mask;
      if (value <= max) break;
    }
  }
  return value;
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<double> parse_split(const std::string& split) {
  std::vector<double> v;
  size_t pos = 0;
  while (pos <= split.size()) {
    size_t e = split.find_first_of(",/", pos);
    if (e == std::string::npos) e = split.size();
    std::string part = split.substr(pos, e - pos);
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    char* end = nullptr;
    const double x = part.empty() ? -1 : std::strtod(part.c_str(), &end);
    if (part.empty() || end != part.c_str() + part.size() || !(x >= 0) || !std::isfinite(x))
      throw_input("data.split: '{}' is not valid (expected up to 3 non-negative numbers like \"969,30,1\")", split);
    v.push_back(x);
    pos = e + 1;
  }
  if (v.size() > 3) throw_input("data.split: '{}' has {} parts (at most 3: train, valid, test)", split, v.size());
  while (v.size() < 3) v.push_back(0.0);
  const double sum = v[0] + v[1] + v[2];
  if (!(sum > 0)) throw_input("data.split: '{}' sums to 0", split);
  for (auto& x : v) x /= sum;
  return v;
}

std::vector<int64_t> split_bounds(const std::string& split, int64_t n) {
  const auto f = parse_split(split);
  std::vector<int64_t> b;
  double bookend = 0.0;
  // std::nearbyint in the default rounding mode rounds half to even, like Python's round.
  b.push_back(static_cast<int64_t>(std::nearbyint(bookend * static_cast<double>(n))));
  for (double x : f) {
    bookend += x;
    b.push_back(static_cast<int64_t>(std::nearbyint(bookend * static_cast<double>(n))));
  }
  return b;
}

namespace {

// Megatron's _build_document_index for one run of epochs: ids tiled `epochs` times, shuffled.
void tile_and_shuffle(std::vector<int32_t>& out, int64_t begin, int64_t end, int64_t epochs, NumpyRandomState& rng) {
  const size_t start = out.size();
  for (int64_t e = 0; e < epochs; ++e)
    for (int64_t d = begin; d < end; ++d) out.push_back(static_cast<int32_t>(d));
  rng.shuffle(std::span<int32_t>(out.data() + start, out.size() - start));
}

// add_extra_token_to_sequence: a sample's labels need seq_length + 1 tokens.
constexpr int64_t kExtra = 1;

// sample_idx: for samples 0..total, the (position in doc_idx, offset in that document)
// where each starts; a sample takes seq_length + 1 tokens and overlaps the next by one.
std::vector<int64_t> walk_samples(std::span<const int32_t> sizes, const std::vector<int32_t>& doc_idx,
                                  int64_t seq_length, int64_t total) {
  std::vector<int64_t> sample_idx(static_cast<size_t>(2 * (total + 1)));
  int64_t si = 1, doc_pos = 0, offset = 0;  // sample 0 starts at (0, 0)
  const int64_t ndoc = static_cast<int64_t>(doc_idx.size());
  while (si <= total) {
    int64_t remaining = seq_length + kExtra;
    while (remaining != 0) {
      const int64_t doc_len = sizes[static_cast<size_t>(doc_idx[static_cast<size_t>(doc_pos)])] - offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        offset += remaining + doc_len - kExtra;
        remaining = 0;
      } else {
        if (doc_pos == ndoc - 1) {
          MTNLG_CHECK(si == total, "ran out of documents at sample {} of {}", si, total);
          offset = sizes[static_cast<size_t>(doc_idx[static_cast<size_t>(doc_pos)])] - kExtra;
          break;
        }
        ++doc_pos;
        offset = 0;
      }
    }
    sample_idx[static_cast<size_t>(2 * si)] = doc_pos;
    sample_idx[static_cast<size_t>(2 * si + 1)] = offset;
    ++si;
  }
  return sample_idx;
}

}  // namespace

GptIndices build_gpt_indices(std::span<const int32_t> sizes, int64_t doc_begin, int64_t doc_end, int64_t seq_length,
                             int64_t num_samples, uint32_t seed, const std::string& what) {
  MTNLG_CHECK(seq_length > 0 && num_samples >= 0 && doc_begin >= 0 && doc_end <= static_cast<int64_t>(sizes.size()),
              "bad index build arguments");
  GptIndices r;
  if (doc_end <= doc_begin) throw_input("{}: the split leaves this part empty (0 documents)", what);
  int64_t T = 0;
  for (int64_t d = doc_begin; d < doc_end; ++d) T += sizes[static_cast<size_t>(d)];
  r.tokens_per_epoch = T;
  if (T == 0)
    throw_input("{}: the part has 0 tokens, one sample needs seq_length+1 = {} tokens", what, seq_length + kExtra);

  // 1. Epochs: the smallest E with E*T >= n*S + 1 (one epoch when n is None). A part
  // shorter than one sample simply takes more epochs: samples run across epochs.
  int64_t E = 1;
  if (num_samples >= 0) {
    const int64_t need = num_samples * seq_length + kExtra;
    E = std::max<int64_t>(1, (need + T - 1) / T);
  }
  constexpr int64_t kMaxDocEntries = (int64_t{1} << 31) - 1;
  if (E > kMaxDocEntries / (doc_end - doc_begin))
    throw_input(
        "{}: the part has {} tokens and one sample needs seq_length+1 = {}; {} samples would repeat its {} "
        "documents {} times, more than mtnlg's limit of 2^31 document entries (use more data, a larger split "
        "part or fewer samples)",
        what, T, seq_length + kExtra, num_samples, doc_end - doc_begin, E);
  r.num_epochs = E;

  // 2. Is the final epoch kept apart?
  bool separate = false;
  if (E > 1) {
    const int64_t sans_final = ((E - 1) * T - kExtra) / seq_length;
    const int64_t from_final = num_samples - sans_final;  // E > 1 only when num_samples >= 0
    const int64_t per_epoch = (T - kExtra) / seq_length;
    MTNLG_CHECK(from_final >= 0 && from_final <= per_epoch + 1, "final epoch samples {}", from_final);
    separate = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  r.separate_final_epoch = separate;

  // 3. doc_idx (shuffled before shuffle_idx, from the same RNG).
  NumpyRandomState rng(seed);
  r.doc_idx.reserve(static_cast<size_t>(E * (doc_end - doc_begin)));
  if (!separate) {
    tile_and_shuffle(r.doc_idx, doc_begin, doc_end, E, rng);
  } else {
    tile_and_shuffle(r.doc_idx, doc_begin, doc_end, E - 1, rng);
    tile_and_shuffle(r.doc_idx, doc_begin, doc_end, 1, rng);
  }

  // 4. sample_idx: walk the documents taking S+1 tokens per sample, overlapping by one.
  const int64_t total = (E * T - kExtra) / seq_length;
  r.sample_idx = walk_samples(sizes, r.doc_idx, seq_length, total);

  // 5. shuffle_idx.
  const int64_t first = separate ? ((E - 1) * T - kExtra) / seq_length : total;
  r.shuffle_idx.resize(static_cast<size_t>(total));
  std::iota(r.shuffle_idx.begin(), r.shuffle_idx.end(), int64_t{0});
  // Megatron's dtype is uint32 below 2^32-2 samples; the permutation is the same either way.
  rng.shuffle(std::span<int64_t>(r.shuffle_idx.data(), static_cast<size_t>(first)));
  if (first < total) rng.shuffle(std::span<int64_t>(r.shuffle_idx.data() + first, static_cast<size_t>(total - first)));
  return r;
}

// ----- cache ------------------------------------------------------------------------------
namespace {

// Version 2 adds a checksum of everything after the key; version 1 files are rebuilt.
constexpr char kCacheMagic[8] = {'M', 'T', 'G', 'P', 'T', 'I', 'X', '2'};

// FNV-1a over raw bytes, continued from h.
uint64_t fnv1a64_bytes(const void* p, size_t n, uint64_t h) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= c[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t payload_checksum(const int64_t meta[3], const GptIndices& r) {
  uint64_t h = fnv1a64_bytes(meta, 24, 0xcbf29ce484222325ull);
  h = fnv1a64_bytes(r.doc_idx.data(), r.doc_idx.size() * sizeof(int32_t), h);
  h = fnv1a64_bytes(r.sample_idx.data(), r.sample_idx.size() * sizeof(int64_t), h);
  return fnv1a64_bytes(r.shuffle_idx.data(), r.shuffle_idx.size() * sizeof(int64_t), h);
}

template <typename T>
bool read_vec(std::FILE* f, std::vector<T>& v) {
  uint64_t n = 0;
  if (std::fread(&n, 8, 1, f) != 1 || n > (uint64_t{1} << 40)) return false;
  v.resize(static_cast<size_t>(n));
  return n == 0 || std::fread(v.data(), sizeof(T), static_cast<size_t>(n), f) == n;
}

template <typename T>
void write_vec(AtomicFile& f, const std::vector<T>& v) {
  const uint64_t n = v.size();
  f.write(&n, 8);
  f.write(v.data(), sizeof(T) * v.size());
}

}  // namespace

// Everything sample() relies on, checked once in O(size): doc_idx names sequences of the
// split, sample_idx rows walk forward through doc_idx with in-range offsets and each
// sample spans exactly seq_length+1 tokens, shuffle_idx is a permutation.
std::string check_gpt_indices(const GptIndices& r, std::span<const int32_t> sizes, int64_t doc_begin, int64_t doc_end,
                              int64_t seq_length, int64_t min_samples) {
  if (r.sample_idx.size() < 2 || r.sample_idx.size() % 2 != 0) return "sample index has a bad shape";
  const int64_t n = r.num_samples();
  if (n < min_samples) return fmt::format("{} samples, fewer than the {} needed", n, min_samples);
  if (static_cast<int64_t>(r.shuffle_idx.size()) != n) return "shuffle index and sample index disagree in length";
  for (int32_t d : r.doc_idx)
    if (d < doc_begin || d >= doc_end) return fmt::format("document index {} outside [{}, {})", d, doc_begin, doc_end);
  const int64_t ndoc = static_cast<int64_t>(r.doc_idx.size());
  auto len = [&](int64_t pos) {
    return static_cast<int64_t>(sizes[static_cast<size_t>(r.doc_idx[static_cast<size_t>(pos)])]);
  };
  for (int64_t j = 0; j <= n; ++j) {
    const int64_t pos = r.sample_idx[static_cast<size_t>(2 * j)], off = r.sample_idx[static_cast<size_t>(2 * j + 1)];
    if (pos < 0 || pos >= ndoc || off < 0 || off >= std::max<int64_t>(len(pos), 1))
      return fmt::format("sample index row {} ({}, {}) out of range", j, pos, off);
    if (j == 0) continue;
    const int64_t pf = r.sample_idx[static_cast<size_t>(2 * j - 2)], of = r.sample_idx[static_cast<size_t>(2 * j - 1)];
    if (pos < pf || (pos == pf && off < of)) return fmt::format("sample index row {} goes backwards", j);
    int64_t tokens = 0;
    if (pos == pf) {
      tokens = off - of + 1;
    } else {
      tokens = len(pf) - of + off + 1;
      for (int64_t p = pf + 1; p < pos; ++p) tokens += len(p);
    }
    if (tokens != seq_length + 1)
      return fmt::format("sample {} spans {} tokens, not {}", j - 1, tokens, seq_length + 1);
  }
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (int64_t v : r.shuffle_idx) {
    if (v < 0 || v >= n || seen[static_cast<size_t>(v)])
      return fmt::format("shuffle index entry {} is not a permutation", v);
    seen[static_cast<size_t>(v)] = true;
  }
  return "";
}

namespace {

// Reads a cache file; "" when it is absent or stale (another key), else the reason it
// cannot be used. `r` is filled only when the file is intact and valid.
std::string load_cache(const std::string& path, const std::string& key, GptIndices& r, bool& found) {
  found = false;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return "";
  found = true;
  char magic[8];
  std::string stored;
  uint64_t klen = 0, sum = 0;
  int64_t meta[3];
  bool ok = std::fread(magic, 1, 8, f) == 8 && std::memcmp(magic, kCacheMagic, 8) == 0 &&
            std::fread(&klen, 8, 1, f) == 1 && klen < (1u << 20);
  if (!ok) {
    std::fclose(f);
    return "not an index cache of this version";
  }
  stored.resize(static_cast<size_t>(klen));
  ok = std::fread(stored.data(), 1, stored.size(), f) == stored.size();
  if (ok && stored != key) {
    std::fclose(f);
    found = false;  // another configuration's cache under a colliding name: rebuild quietly
    return "";
  }
  ok = ok && std::fread(meta, 8, 3, f) == 3 && read_vec(f, r.doc_idx) && read_vec(f, r.sample_idx) &&
       read_vec(f, r.shuffle_idx) && std::fread(&sum, 8, 1, f) == 1;
  char extra;
  ok = ok && std::fread(&extra, 1, 1, f) == 0;
  std::fclose(f);
  if (!ok) return "truncated or with trailing bytes";
  if (sum != payload_checksum(meta, r)) return "checksum mismatch";
  if (meta[0] < 1 || meta[1] < 1 || (meta[2] != 0 && meta[2] != 1)) return "impossible epoch metadata";
  r.num_epochs = meta[0];
  r.tokens_per_epoch = meta[1];
  r.separate_final_epoch = meta[2] != 0;
  return "";
}

void save_cache(const std::string& path, const std::string& key, const GptIndices& r) {
  try {
    write_file_atomic(path, [&](AtomicFile& f) {
      const uint64_t klen = key.size();
      const int64_t meta[3] = {r.num_epochs, r.tokens_per_epoch, r.separate_final_epoch ? 1 : 0};
      f.write(kCacheMagic, 8);
      f.write(&klen, 8);
      f.write(key);
      f.write(meta, sizeof(meta));
      write_vec(f, r.doc_idx);
      write_vec(f, r.sample_idx);
      write_vec(f, r.shuffle_idx);
      const uint64_t sum = payload_checksum(meta, r);
      f.write(&sum, 8);
    });
  } catch (const RuntimeError& e) {
    log::warn("index cache: {}; continuing without a cache", e.what());
  }
}

}  // namespace

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> ds, const GptDatasetConfig& cfg)
    : ds_(std::move(ds)), cfg_(cfg) {
  if (cfg_.seq_length <= 0) throw_input("model.seq_length: {} is not valid (expected > 0)", cfg_.seq_length);
  MTNLG_CHECK(cfg_.split_index >= 0 && cfg_.split_index < 3, "split index {}", cfg_.split_index);
  static const char* kPart[] = {"train", "valid", "test"};
  const auto bounds = split_bounds(cfg_.split, ds_->num_sequences());
  const int64_t b = bounds[static_cast<size_t>(cfg_.split_index)],
                e = bounds[static_cast<size_t>(cfg_.split_index) + 1];
  const std::string what = fmt::format("data prefix {} ({} part of split \"{}\": sequences [{}, {}) of {})",
                                       ds_->prefix(), kPart[cfg_.split_index], cfg_.split, b, e, ds_->num_sequences());
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(ds_->prefix(), ec).string();
  const std::string key =
      fmt::format("gpt-index v2|{}|{}|split={}|part={}|docs={}:{}|seed={}|seq={}|n={}", abs, ds_->fingerprint(),
                  cfg_.split, cfg_.split_index, b, e, cfg_.seed, cfg_.seq_length, cfg_.num_samples);
  range_ = {b, e};
  if (!cfg_.cache_dir.empty()) {
    cache_file_ = (std::filesystem::path(cfg_.cache_dir) /
                   fmt::format("{}-{}-{:016x}.gptidx", std::filesystem::path(ds_->prefix()).filename().string(),
                               kPart[cfg_.split_index], fnv1a64(key)))
                      .string();
    bool found = false;
    std::string why = load_cache(cache_file_, key, idx_, found);
    if (found && why.empty()) {
      const auto sizes = ds_->sequence_lengths();
      why = check_gpt_indices(idx_, sizes, b, e, cfg_.seq_length, cfg_.num_samples);
    }
    from_cache_ = found && why.empty();
    if (found && !why.empty()) log::warn("index cache {} is damaged ({}); rebuilding it", cache_file_, why);
  }
  if (!from_cache_) {
    idx_ = GptIndices{};
    const auto sizes = ds_->sequence_lengths();
    idx_ = build_gpt_indices(sizes, b, e, cfg_.seq_length, cfg_.num_samples, cfg_.seed, what);
    if (!cache_file_.empty()) {
      std::filesystem::create_directories(cfg_.cache_dir, ec);
      save_cache(cache_file_, key, idx_);
    }
  }
}

std::vector<int64_t> GptDataset::documents(int64_t i) const {
  MTNLG_CHECK(i >= 0 && i < size(), "sample {} of {}", i, size());
  const int64_t j = idx_.shuffle_idx[static_cast<size_t>(i)];
  const int64_t doc_f = idx_.sample_idx[static_cast<size_t>(2 * j)];
  const int64_t doc_l = idx_.sample_idx[static_cast<size_t>(2 * j + 2)];
  std::vector<int64_t> out;
  for (int64_t p = doc_f; p <= doc_l; ++p) out.push_back(idx_.doc_idx[static_cast<size_t>(p)]);
  return out;
}

void GptDataset::sample(int64_t i, int32_t* out) const {
  MTNLG_CHECK(i >= 0 && i < size(), "sample {} of {}", i, size());
  const int64_t j = idx_.shuffle_idx[static_cast<size_t>(i)];
  const int64_t doc_f = idx_.sample_idx[static_cast<size_t>(2 * j)],
                off_f = idx_.sample_idx[static_cast<size_t>(2 * j + 1)];
  const int64_t doc_l = idx_.sample_idx[static_cast<size_t>(2 * j + 2)],
                off_l = idx_.sample_idx[static_cast<size_t>(2 * j + 3)];
  const auto seq = [&](int64_t pos) { return static_cast<int64_t>(idx_.doc_idx[static_cast<size_t>(pos)]); };
  // Count first, copy second: a wrong index (e.g. a stale cache) must not overrun `out`.
  int64_t n = 0;
  if (doc_f == doc_l) {
    n = off_l - off_f + 1;
  } else {
    n = ds_->sequence_length(seq(doc_f)) - off_f + off_l + 1;
    for (int64_t p = doc_f + 1; p < doc_l; ++p) n += ds_->sequence_length(seq(p));
  }
  MTNLG_CHECK(n == cfg_.seq_length + 1, "sample {} has {} tokens, expected {}", i, n, cfg_.seq_length + 1);
  if (doc_f == doc_l) {
    ds_->read(seq(doc_f), off_f, n, out);
    return;
  }
  const int64_t first_len = ds_->sequence_length(seq(doc_f)) - off_f;
  ds_->read(seq(doc_f), off_f, first_len, out);
  int64_t k = first_len;
  for (int64_t p = doc_f + 1; p < doc_l; ++p) {
    const int64_t len = ds_->sequence_length(seq(p));
    ds_->read(seq(p), 0, len, out + k);
    k += len;
  }
  ds_->read(seq(doc_l), 0, off_l + 1, out + k);
}

}  // namespace mtnlg::data
