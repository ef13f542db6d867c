#include "transports/udp/crc32c_fold.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace ucxb::udp {
namespace {

// Carry-less multiplication folds a long input much faster than the CRC32 instruction can
// (one 8-byte step per cycle at best): four 512-bit accumulators each take 64 bytes per step,
// and each step multiplies an accumulator's 128-bit lanes by x^(8*256) mod P (split into its
// two 64-bit halves) and adds the next 256 bytes' lane, which keeps it congruent to the input
// so far modulo the polynomial. The accumulators then fold into one, its four lanes into one,
// and the CRC32 instruction reduces the last 128 bits: CRC(0, R) = R(x) * x^32 mod P, which is
// what the folded input's CRC is. The constants are bit-reflected x^(8D+31) and x^(8D-33) mod
// P for a fold over D bytes (the low and the high half of a lane); tests compare every length
// with the table version (the derivation: Intel, "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ Instruction", 2009).
struct FoldConstants {
  uint64_t low, high;
};
constexpr FoldConstants kFold16{0xf20c0dfe, 0x493c7d27};
constexpr FoldConstants kFold32{0x3da6d0cb, 0xba4fc28e};
constexpr FoldConstants kFold48{0x1c291d04, 0xddc0152b};
constexpr FoldConstants kFold64{0x740eef02, 0x9e4addf8};
constexpr FoldConstants kFold256{0xdcb17aa4, 0xb9e02b86};
// Below this many bytes the fold's setup and final reduction cost more than they save.
constexpr size_t kFoldMinBytes = 256;

#define UCXB_FOLD_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

UCXB_FOLD_TARGET inline __m512i broadcastFold(FoldConstants k) {
  return _mm512_set_epi64(static_cast<int64_t>(k.high), static_cast<int64_t>(k.low),
                          static_cast<int64_t>(k.high), static_cast<int64_t>(k.low),
                          static_cast<int64_t>(k.high), static_cast<int64_t>(k.low),
                          static_cast<int64_t>(k.high), static_cast<int64_t>(k.low));
}

// Each 128-bit lane of `x` moved forward by the constants' distance, plus `next`.
UCXB_FOLD_TARGET inline __m512i fold512(__m512i x, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                   _mm512_clmulepi64_epi128(x, k, 0x11), next, 0x96);
}

UCXB_FOLD_TARGET inline __m128i fold128(__m128i x, FoldConstants k) {
  const __m128i kk = _mm_set_epi64x(static_cast<int64_t>(k.high), static_cast<int64_t>(k.low));
  return _mm_xor_si128(_mm_clmulepi64_si128(x, kk, 0x00), _mm_clmulepi64_si128(x, kk, 0x11));
}

template <bool kCopy>
UCXB_FOLD_TARGET inline __m512i load64(const uint8_t* p, uint8_t* d) {
  const __m512i v = _mm512_loadu_si512(p);
  if constexpr (kCopy) _mm512_storeu_si512(d, v);
  return v;
}

template <bool kCopy>
UCXB_FOLD_TARGET uint64_t fold(uint64_t c, const uint8_t*& p, uint8_t*& d, size_t& length) {
  if (length < kFoldMinBytes) return c;
  auto to = [&d](size_t offset) { return kCopy ? d + offset : nullptr; };
  __m512i x0 = _mm512_xor_si512(load64<kCopy>(p, to(0)),
                                _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, static_cast<int64_t>(c)));
  __m512i x1 = load64<kCopy>(p + 64, to(64));
  __m512i x2 = load64<kCopy>(p + 128, to(128));
  __m512i x3 = load64<kCopy>(p + 192, to(192));
  size_t at = 256;
  const __m512i k256 = broadcastFold(kFold256);
  for (; length - at >= 256; at += 256) {
    x0 = fold512(x0, k256, load64<kCopy>(p + at, to(at)));
    x1 = fold512(x1, k256, load64<kCopy>(p + at + 64, to(at + 64)));
    x2 = fold512(x2, k256, load64<kCopy>(p + at + 128, to(at + 128)));
    x3 = fold512(x3, k256, load64<kCopy>(p + at + 192, to(at + 192)));
  }
  const __m512i k64 = broadcastFold(kFold64);
  __m512i x = fold512(fold512(fold512(x0, k64, x1), k64, x2), k64, x3);
  for (; length - at >= 64; at += 64) x = fold512(x, k64, load64<kCopy>(p + at, to(at)));
  // The masked extract: GCC 12's unmasked one warns of an uninitialised operand.
  const __m128i r = _mm_xor_si128(
      _mm_xor_si128(fold128(_mm512_maskz_extracti32x4_epi32(0xF, x, 0), kFold48),
                    fold128(_mm512_maskz_extracti32x4_epi32(0xF, x, 1), kFold32)),
      _mm_xor_si128(fold128(_mm512_maskz_extracti32x4_epi32(0xF, x, 2), kFold16),
                    _mm512_maskz_extracti32x4_epi32(0xF, x, 3)));
  c = __builtin_ia32_crc32di(0, static_cast<uint64_t>(_mm_cvtsi128_si64(r)));
  c = __builtin_ia32_crc32di(c, static_cast<uint64_t>(_mm_extract_epi64(r, 1)));
  p += at;
  if constexpr (kCopy) d += at;
  length -= at;
  return c;
}

}  // namespace

bool crc32cFoldAvailable() {
  __builtin_cpu_init();  // may run during static initialisation
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
         __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2");
}

UCXB_FOLD_TARGET uint64_t crc32cFoldSum(uint64_t state, const uint8_t*& src, size_t& length) {
  uint8_t* none = nullptr;
  return fold<false>(state, src, none, length);
}

UCXB_FOLD_TARGET uint64_t crc32cFoldCopy(uint64_t state, uint8_t*& dst, const uint8_t*& src,
                                         size_t& length) {
  return fold<true>(state, src, dst, length);
}

#undef UCXB_FOLD_TARGET

}  // namespace ucxb::udp
#endif
