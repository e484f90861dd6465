// MinHash signatures and LSH banding (see minhash.hpp for the scheme).
#include "data/curation/minhash.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace mtnlg::curation {

double lsh_candidate_probability(double s, int64_t bands, int64_t rows) {
  return 1.0 - std::pow(1.0 - std::pow(s, static_cast<double>(rows)), static_cast<double>(bands));
}

LshParams choose_bands(double threshold, int64_t num_perm, double min_recall) {
  if (!(threshold > 0.0 && threshold < 1.0)) throw_input("--threshold {} must be in (0, 1)", threshold);
  if (num_perm < 2) throw_input("--num-perm {} must be at least 2", num_perm);
  LshParams best{num_perm, 1};  // r = 1 always reaches the recall target
  for (int64_t r = 1; r <= num_perm; ++r) {
    int64_t b = num_perm / r;
    if (lsh_candidate_probability(threshold, b, r) >= min_recall) best = LshParams{b, r};
  }
  return best;
}

MinHasher::MinHasher(int64_t num_perm, uint64_t seed) {
  if (num_perm < 1) throw_input("--num-perm {} must be positive", num_perm);
  a_.resize(static_cast<size_t>(num_perm));
  b_.resize(static_cast<size_t>(num_perm));
  uint64_t key = mix_key(seed, 0x4d696e48617368ull);  // "MinHash"
  for (int64_t i = 0; i < num_perm; ++i) {
    Philox4x32 r = philox4x32(key, 0, static_cast<uint64_t>(i));
    a_[i] = ((static_cast<uint64_t>(r.c[0]) << 32) | r.c[1]) | 1ull;
    b_[i] = (static_cast<uint64_t>(r.c[2]) << 32) | r.c[3];
  }
}

// On x86-64 the compiler builds an AVX2 and a baseline version and picks one at load
// time (the 64-bit multiplies vectorise ~2x better with AVX2 and again with AVX-512DQ,
// which multiplies 64-bit lanes natively).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
void MinHasher::signature(const uint64_t* shingles, int64_t n, uint32_t* out) const {
  const int64_t k = num_perm();
  const uint64_t* a = a_.data();
  const uint64_t* b = b_.data();
  // 32-bit running minima; the inner loop over permutations is the hot loop of dedup
  // (shingles x K multiply-adds), written so the compiler can vectorise it.
  std::fill(out, out + k, std::numeric_limits<uint32_t>::max());
  for (int64_t s = 0; s < n; ++s) {
    const uint64_t x = shingles[s];
#pragma omp simd
    for (int64_t i = 0; i < k; ++i) {
      uint32_t h = static_cast<uint32_t>((a[i] * x + b[i]) >> 32);
      out[i] = h < out[i] ? h : out[i];
    }
  }
}

double estimate_jaccard(const uint32_t* x, const uint32_t* y, int64_t num_perm) {
  int64_t eq = 0;
  for (int64_t i = 0; i < num_perm; ++i) eq += x[i] == y[i];
  return static_cast<double>(eq) / static_cast<double>(num_perm);
}

uint64_t band_hash(const uint32_t* sig, int64_t band, int64_t rows) {
  uint64_t h = mix64(static_cast<uint64_t>(band) + 0x9e3779b97f4a7c15ull);
  const uint32_t* p = sig + band * rows;
  for (int64_t i = 0; i < rows; ++i) h = mix64(h ^ p[i]);
  return h;
}

double exact_jaccard(std::vector<uint64_t> a, std::vector<uint64_t> b) {
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  std::sort(b.begin(), b.end());
  b.erase(std::unique(b.begin(), b.end()), b.end());
  if (a.empty() && b.empty()) return 1.0;
  std::vector<uint64_t> inter;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(inter));
  double u = static_cast<double>(a.size() + b.size() - inter.size());
  return static_cast<double>(inter.size()) / u;
}

}  // namespace mtnlg::curation
