// The CRC32C kernel for long inputs on x86-64 CPUs with AVX-512 and VPCLMULQDQ: carry-less
// multiplication folds 256-byte blocks (crc32c.cpp picks it, and falls back without it).
// Internal to crc32c.cpp; kept apart because it is compiled for an instruction set the rest
// of the transport must not assume.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ucxb::udp {

#if defined(__x86_64__)
// Whether this CPU and OS run the kernel (libgcc's checks include XGETBV for AVX-512 state).
bool crc32cFoldAvailable();

// Each consumes the whole 64-byte blocks of its input when there are at least 256 bytes
// (otherwise nothing), advancing `src` (and `dst`) and decreasing `length` by what it took.
// `state` and the result are raw CRC32C states (no inversion), as the CRC32 instruction
// keeps them. Only when crc32cFoldAvailable().
uint64_t crc32cFoldSum(uint64_t state, const uint8_t*& src, size_t& length);
// The same, also copying the consumed bytes to `dst` (which must not overlap `src`).
uint64_t crc32cFoldCopy(uint64_t state, uint8_t*& dst, const uint8_t*& src, size_t& length);
#endif

}  // namespace ucxb::udp
