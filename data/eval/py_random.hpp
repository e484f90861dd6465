// A C++ twin of CPython's `random.Random` (3.11 random.py / _randommodule.c), for the
// parts lm-evaluation-harness uses: seeding from an int, random(), getrandbits(),
// randbelow(), shuffle(), sample() and choices(). Few-shot examples, the v0.3 eval-doc
// shuffle and the perplexity bootstrap all draw from it, so the same seed gives the
// same documents and the same stderr as the Python harness, draw for draw.
//
// Test vectors (eval-harness.md §3.3) are checked in test/data/eval/test_py_random.cpp.
#pragma once
#include <cstdint>
#include <cstddef>
#include <utility>
#include <vector>

namespace mtnlg::data::eval {

class PyRandom {
 public:
  explicit PyRandom(int64_t seed) { seed_int(seed); }
  // random.seed(n) for an int n: init_by_array over the 32-bit words of |n|.
  void seed_int(int64_t seed);

  uint32_t genrand_uint32();
  double random();                 // [0, 1), 53 bits
  uint64_t getrandbits(int k);     // 0 <= k <= 64
  uint64_t randbelow(uint64_t n);  // uniform in [0, n); 0 when n == 0

  // In-place Fisher-Yates exactly as random.shuffle.
  template <typename T>
  void shuffle(std::vector<T>& x) {
    for (std::size_t i = x.size(); i-- > 1;) {
      std::size_t j = static_cast<std::size_t>(randbelow(i + 1));
      std::swap(x[i], x[j]);
    }
  }
  // Indices random.sample(range(n), k) returns, in draw order. Requires k <= n.
  std::vector<int64_t> sample_indices(int64_t n, int64_t k);
  // Indices random.choices(range(n), k=k) returns.
  std::vector<int64_t> choices_indices(int64_t n, int64_t k);

 private:
  void init_genrand(uint32_t s);
  void init_by_array(const std::vector<uint32_t>& key);
  uint32_t mt_[624];
  int mti_ = 625;
};

}  // namespace mtnlg::data::eval
