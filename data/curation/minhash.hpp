// MinHash signatures and LSH banding for near-duplicate detection.
//
// Hash family: K functions h_i(x) = ((a_i * x + b_i) mod 2^64) >> 32 over the 64-bit
// shingle hash x, with a_i odd and b_i drawn from Philox(seed) (multiply-shift
// hashing, Dietzfelbinger et al.). The signature of a document is
// sig_i = min over its shingles of h_i(x); two documents agree in one position with
// probability ~ Jaccard(shingle sets), so matches/K estimates the Jaccard similarity
// (standard error sqrt(J(1-J)/K), 0.035 at J = 0.8, K = 128).
//
// LSH banding: the K values are cut into b bands of r rows (b*r <= K); two documents
// become a candidate pair when all r values of at least one band agree, which
// happens with probability P(s) = 1 - (1 - s^r)^b (the "S-curve"). choose_bands()
// takes the largest r (fewest false candidates) whose curve still gives
// P(threshold) >= 0.98, so pairs at the threshold are almost never lost to banding;
// candidates are then verified with the estimated Jaccard, which removes the extra
// false positives that the permissive curve lets through.
#pragma once
#include <cstdint>
#include <vector>

namespace mtnlg::curation {

struct LshParams {
  int64_t bands = 0;
  int64_t rows = 0;
};

// P(candidate | Jaccard s) for b bands of r rows.
double lsh_candidate_probability(double s, int64_t bands, int64_t rows);

// The banding for `threshold` and `num_perm` described above (min_recall = 0.98).
LshParams choose_bands(double threshold, int64_t num_perm, double min_recall = 0.98);

class MinHasher {
 public:
  MinHasher(int64_t num_perm, uint64_t seed);
  int64_t num_perm() const { return static_cast<int64_t>(a_.size()); }
  // Writes num_perm() values to `out`. With no shingles every value is UINT32_MAX
  // (callers treat such documents as empty and never band them).
  void signature(const uint64_t* shingles, int64_t n, uint32_t* out) const;

 private:
  std::vector<uint64_t> a_, b_;
};

// Fraction of equal positions: the MinHash estimate of the Jaccard similarity.
double estimate_jaccard(const uint32_t* x, const uint32_t* y, int64_t num_perm);

// Hash of band `band` (rows values starting at band*rows) of a signature.
uint64_t band_hash(const uint32_t* sig, int64_t band, int64_t rows);

// Exact Jaccard similarity of two shingle-hash sets (inputs need not be unique/sorted).
double exact_jaccard(std::vector<uint64_t> a, std::vector<uint64_t> b);

}  // namespace mtnlg::curation
