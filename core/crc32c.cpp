#include "core/crc32c.hpp"

#include <array>
#include <bit>
#include <cstring>

namespace mtnlg {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

// kTables[0] is the byte-at-a-time table; kTables[k][b] advances byte b through k more
// zero bytes, so eight bytes are folded per step (slicing-by-8).
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : (c >> 1);
    t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k)
    for (uint32_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  return t;
}
constexpr auto kTables = make_tables();

uint32_t portable(const unsigned char* p, size_t n, uint32_t c) {
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
    const uint32_t lo = static_cast<uint32_t>(w) ^ c, hi = static_cast<uint32_t>(w >> 32);
    c = kTables[7][lo & 0xff] ^ kTables[6][(lo >> 8) & 0xff] ^ kTables[5][(lo >> 16) & 0xff] ^ kTables[4][lo >> 24] ^
        kTables[3][hi & 0xff] ^ kTables[2][(hi >> 8) & 0xff] ^ kTables[1][(hi >> 16) & 0xff] ^ kTables[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = kTables[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t hardware(const unsigned char* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = __builtin_ia32_crc32di(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = __builtin_ia32_crc32qi(c, *p++);
  return c;
}
const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc) {
  return ~portable(static_cast<const unsigned char*>(data), n, ~crc);
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (kHaveSse42) return ~hardware(p, n, ~crc);
#endif
  return ~portable(p, n, ~crc);
}

}  // namespace mtnlg
