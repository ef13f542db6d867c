// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of iSCSI, SCTP and ext4:
// every datagram carries one, so that corruption on the wire becomes loss instead of wrong data.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ucxb::udp {

// CRC32C of `length` bytes.
uint32_t crc32c(const void* data, size_t length);

// Continues a CRC32C: crc32cExtend(crc32c(a), b) == crc32c(a followed by b). Lets a datagram's
// checksum skip its own checksum field and cover a payload that lives in another buffer.
// Uses the CPU's CRC32C instruction where there is one (x86-64 SSE4.2).
uint32_t crc32cExtend(uint32_t crc, const void* data, size_t length);

// Copies `length` bytes from `src` to `dst` (which must not overlap) and returns
// crc32cExtend(crc, src, length), reading the bytes once. A datagram's payload is summed as it
// is copied in: summing it after a plain copy reloaded bytes the copy had just stored, and
// those loads waited on the stores (2.6 bytes per cycle, against 8 for data already cached).
uint32_t crc32cCopy(uint32_t crc, void* dst, const void* src, size_t length);

// The portable table-driven version crc32cExtend falls back on (tests compare the two).
uint32_t crc32cPortableExtend(uint32_t crc, const void* data, size_t length);

}  // namespace ucxb::udp
