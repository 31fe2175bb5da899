// CRC-32C (Castagnoli), the checksum every SSD extent carries. Hardware (SSE4.2 crc32) when the CPU
// has it, else a slicing table; both give identical results (tested against the RFC 3720 vector).
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvd {

// Continues `crc` (start with 0) over n bytes. Pure function, thread-safe.
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);
// The portable implementation, exposed for tests of the hardware path.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);

}  // namespace kvd
