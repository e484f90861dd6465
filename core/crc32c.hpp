// CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum of checkpoint
// shards (model/checkpoint.cpp) and of TensorBoard records (core/tensorboard.cpp).
// Continues from `crc` (the value a previous call returned; 0 to start), so a buffer
// may be checksummed in pieces. crc32c("123456789") == 0xE3069283.
//
// x86-64 processors with SSE4.2 compute it with the crc32 instruction (about 20x the
// table's speed, which matters for checkpoints of many GB); elsewhere slicing-by-8
// tables. Both give the same bits.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace mtnlg {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view s, uint32_t crc = 0) { return crc32c(s.data(), s.size(), crc); }
// The table implementation alone (tests compare it with the instruction).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);

}  // namespace mtnlg
