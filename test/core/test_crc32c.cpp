// CRC32C (core/crc32c.cpp): published vectors, and the SSE4.2 instruction path equal to
// the portable slicing-by-8 tables at every length and alignment.
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "core/crc32c.hpp"

using namespace mtnlg;

TEST_CASE("crc32c matches the published Castagnoli vectors", "[crc32c]") {
  CHECK(crc32c("", 0) == 0u);
  CHECK(crc32c(std::string_view("123456789")) == 0xE3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, '\0'), down(32, '\0');
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  // RFC 3720, appendix B.4.
  CHECK(crc32c(zeros) == 0x8A9136AAu);
  CHECK(crc32c(ones) == 0x62A8AB43u);
  CHECK(crc32c(up) == 0x46DD794Eu);
  CHECK(crc32c(down) == 0x113FDB5Cu);
  // Continuing a CRC over a split buffer gives the CRC of the whole.
  CHECK(crc32c(std::string_view("6789"), crc32c(std::string_view("12345"))) == 0xE3069283u);
}

TEST_CASE("crc32c: the dispatched and the portable implementation agree", "[crc32c]") {
  std::mt19937 g(7);
  std::string buf(4096 + 16, '\0');
  for (auto& c : buf) c = static_cast<char>(g());
  for (size_t off = 0; off < 9; ++off)
    for (size_t n : {0u, 1u, 7u, 8u, 9u, 15u, 63u, 64u, 65u, 1000u, 4096u}) {
      INFO("offset " << off << " length " << n);
      CHECK(crc32c(buf.data() + off, n) == crc32c_portable(buf.data() + off, n));
      CHECK(crc32c(buf.data() + off, n, 0x12345678u) == crc32c_portable(buf.data() + off, n, 0x12345678u));
    }
  CHECK(crc32c_portable("123456789", 9) == 0xE3069283u);
}
