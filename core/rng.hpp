// Counter-based RNG (Philox4x32-10, Salmon et al. 2011). A random number is a pure
// function of (key, counter), so the CPU and the CUDA kernels produce the same bits,
// any element can be drawn independently (no sequential state to split across
// threads or ranks), and a resumed run needs only the seed and the step.
// This header is usable from host and device code.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MTNLG_HD __host__ __device__ __forceinline__
#else
#define MTNLG_HD inline
#endif

namespace mtnlg {

struct Philox4x32 {
  uint32_t c[4];
};

MTNLG_HD void philox_round(uint32_t (&ctr)[4], const uint32_t (&key)[2]) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  uint64_t p0 = static_cast<uint64_t>(M0) * ctr[0];
  uint64_t p1 = static_cast<uint64_t>(M1) * ctr[2];
  uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  uint32_t n0 = hi1 ^ ctr[1] ^ key[0];
  uint32_t n1 = lo1;
  uint32_t n2 = hi0 ^ ctr[3] ^ key[1];
  uint32_t n3 = lo0;
  ctr[0] = n0;
  ctr[1] = n1;
  ctr[2] = n2;
  ctr[3] = n3;
}

// 4 x 32 random bits for (key, counter).
MTNLG_HD Philox4x32 philox4x32(uint64_t key64, uint64_t counter_hi, uint64_t counter_lo) {
  uint32_t ctr[4] = {static_cast<uint32_t>(counter_lo), static_cast<uint32_t>(counter_lo >> 32),
                     static_cast<uint32_t>(counter_hi), static_cast<uint32_t>(counter_hi >> 32)};
  uint32_t key[2] = {static_cast<uint32_t>(key64), static_cast<uint32_t>(key64 >> 32)};
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    philox_round(ctr, key);
    key[0] += W0;
    key[1] += W1;
  }
  return Philox4x32{{ctr[0], ctr[1], ctr[2], ctr[3]}};
}

// Uniform float in [0, 1) from 24 random bits.
MTNLG_HD float uniform_from_bits(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

// Element i of a stream: one 32-bit draw per element, 4 elements per Philox call.
MTNLG_HD uint32_t philox_bits(uint64_t key, uint64_t stream, uint64_t i) {
  Philox4x32 r = philox4x32(key, stream, i >> 2);
  return r.c[i & 3];
}

MTNLG_HD float philox_uniform(uint64_t key, uint64_t stream, uint64_t i) {
  return uniform_from_bits(philox_bits(key, stream, i));
}

// Mixes several integers into one 64-bit key (splitmix64 finaliser), e.g.
// (seed, purpose, layer) -> key.
MTNLG_HD uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
MTNLG_HD uint64_t mix_key(uint64_t a, uint64_t b, uint64_t c = 0) { return mix64(mix64(mix64(a) ^ b) ^ c); }

// A dropout site's key and mask offset from the step's key and the micro batch's first
// sample: key = mix_key(step, a, b), offset = sample * per_sample + add. The caller derives
// the values its ops take with derive_*; a kernel may instead derive them where it runs
// from `dev` (device memory holding step and sample): a CUDA graph replays kernel
// arguments as captured, so per-micro-batch keys reach a replay this way. With `dev` null
// the caller's values stand (and the CPU always uses them).
struct DeviceKey {
  const uint64_t* dev = nullptr;
  uint64_t a = 0, b = 0, per_sample = 0, add = 0;
  MTNLG_HD uint64_t derive_key(uint64_t step) const { return mix_key(step, a, b); }
  MTNLG_HD uint64_t derive_offset(uint64_t sample) const { return sample * per_sample + add; }
  MTNLG_HD uint64_t key(uint64_t given) const { return dev ? derive_key(dev[0]) : given; }
  MTNLG_HD uint64_t offset(uint64_t given) const { return dev ? derive_offset(dev[1]) : given; }
};

}  // namespace mtnlg
