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
// Uses the fastest kernel the CPU has (see Crc32cKernel).
uint32_t crc32cExtend(uint32_t crc, const void* data, size_t length);

// Copies `length` bytes from `src` to `dst` (which must not overlap) and returns
// crc32cExtend(crc, src, length), reading the bytes once. A datagram's payload is summed as it
// is copied in: summing it after a plain copy reloaded bytes the copy had just stored, and
// those loads waited on the stores (2.6 bytes per cycle, against 8 for data already cached).
uint32_t crc32cCopy(uint32_t crc, void* dst, const void* src, size_t length);

// The portable table-driven version crc32cExtend falls back on (tests compare the two).
uint32_t crc32cPortableExtend(uint32_t crc, const void* data, size_t length);

// The ways crc32cExtend / crc32cCopy can compute a sum; they pick the fastest this CPU has.
enum class Crc32cKernel {
  kTables,          // slicing-by-8 tables, any CPU
  kCrcInstruction,  // SSE4.2's CRC32 instruction on three interleaved chains
  kCarrylessFold,   // AVX-512 VPCLMULQDQ folding of 256-byte blocks, then the instruction
};
const char* crc32cKernelName(Crc32cKernel kernel);
// Whether this CPU (and OS) can run `kernel`.
bool crc32cKernelAvailable(Crc32cKernel kernel);
// The kernel crc32cExtend and crc32cCopy use for long inputs.
Crc32cKernel crc32cActiveKernel();
// crc32cExtend / crc32cCopy with a given kernel, for tests and benchmarks. Throw
// std::invalid_argument for a kernel this CPU lacks.
uint32_t crc32cExtendWith(Crc32cKernel kernel, uint32_t crc, const void* data, size_t length);
uint32_t crc32cCopyWith(Crc32cKernel kernel, uint32_t crc, void* dst, const void* src,
                        size_t length);

}  // namespace ucxb::udp
