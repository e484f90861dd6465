// CPython-compatible Mersenne Twister and the random.Random methods the harness uses.
// The algorithms are MT19937 (Matsumoto & Nishimura) and the documented behaviour of
// CPython's random module; see py_random.hpp.
#include "data/eval/py_random.hpp"

#include <cmath>
#include <unordered_set>

#include "core/error.hpp"

namespace mtnlg::data::eval {

void PyRandom::init_genrand(uint32_t s) {
  mt_[0] = s;
  for (int i = 1; i < 624; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  mti_ = 624;
}

void PyRandom::init_by_array(const std::vector<uint32_t>& key) {
  init_genrand(19650218u);
  int i = 1;
  size_t j = 0;
  const size_t n = key.size();
  for (size_t k = std::max<size_t>(624, n); k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
    if (j >= n) j = 0;
  }
  for (int k = 623; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;
}

void PyRandom::seed_int(int64_t seed) {
  uint64_t a = seed < 0 ? static_cast<uint64_t>(-(seed + 1)) + 1 : static_cast<uint64_t>(seed);
  std::vector<uint32_t> key;
  while (a) {
    key.push_back(static_cast<uint32_t>(a & 0xffffffffu));
    a >>= 32;
  }
  if (key.empty()) key.push_back(0);
  init_by_array(key);
}

uint32_t PyRandom::genrand_uint32() {
  static const uint32_t mag01[2] = {0u, 0x9908b0dfu};
  constexpr uint32_t upper = 0x80000000u, lower = 0x7fffffffu;
  if (mti_ >= 624) {
    int kk = 0;
    for (; kk < 624 - 397; ++kk) {
      uint32_t y = (mt_[kk] & upper) | (mt_[kk + 1] & lower);
      mt_[kk] = mt_[kk + 397] ^ (y >> 1) ^ mag01[y & 1u];
    }
    for (; kk < 623; ++kk) {
      uint32_t y = (mt_[kk] & upper) | (mt_[kk + 1] & lower);
      mt_[kk] = mt_[kk + (397 - 624)] ^ (y >> 1) ^ mag01[y & 1u];
    }
    uint32_t y = (mt_[623] & upper) | (mt_[0] & lower);
    mt_[623] = mt_[396] ^ (y >> 1) ^ mag01[y & 1u];
    mti_ = 0;
  }
  uint32_t y = mt_[mti_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= (y >> 18);
  return y;
}

double PyRandom::random() {
  uint32_t a = genrand_uint32() >> 5, b = genrand_uint32() >> 6;
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

uint64_t PyRandom::getrandbits(int k) {
  MTNLG_CHECK(k >= 0 && k <= 64, "getrandbits({})", k);
  if (k == 0) return 0;
  if (k <= 32) return genrand_uint32() >> (32 - k);
  // CPython fills 32-bit words from the least significant one up; the last (partial)
  // word keeps its top bits.
  uint64_t lo = genrand_uint32();
  uint64_t hi = genrand_uint32() >> (64 - k);
  return lo | (hi << 32);
}

uint64_t PyRandom::randbelow(uint64_t n) {
  if (n == 0) return 0;
  int k = 0;
  for (uint64_t t = n; t; t >>= 1) ++k;  // n.bit_length()
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

std::vector<int64_t> PyRandom::sample_indices(int64_t n, int64_t k) {
  if (k < 0 || k > n) throw_input("cannot sample {} of {} documents (sample larger than population)", k, n);
  std::vector<int64_t> result(static_cast<size_t>(k));
  int64_t setsize = 21;
  if (k > 5)
    setsize += static_cast<int64_t>(std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pool[i] = i;
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = static_cast<int64_t>(randbelow(static_cast<uint64_t>(n - i)));
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::unordered_set<int64_t> selected;
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = static_cast<int64_t>(randbelow(static_cast<uint64_t>(n)));
      while (selected.count(j)) j = static_cast<int64_t>(randbelow(static_cast<uint64_t>(n)));
      selected.insert(j);
      result[i] = j;
    }
  }
  return result;
}

std::vector<int64_t> PyRandom::choices_indices(int64_t n, int64_t k) {
  std::vector<int64_t> out(static_cast<size_t>(k));
  const double dn = static_cast<double>(n);
  for (int64_t i = 0; i < k; ++i) out[i] = static_cast<int64_t>(std::floor(random() * dn));
  return out;
}

}  // namespace mtnlg::data::eval
