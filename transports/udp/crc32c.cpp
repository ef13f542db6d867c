#include "transports/udp/crc32c.h"

#include <array>
#include <cstring>
#include <stdexcept>
#include <string>

#include "transports/udp/crc32c_fold.h"

namespace ucxb::udp {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

// Slicing-by-8 tables, built at compile time: kTables[0] is the classic byte-at-a-time table;
// kTables[k][b] is the CRC of byte b followed by k zero bytes, so eight table look-ups
// consume eight input bytes at once (about 4x faster than one byte per step).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables makeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) {
      c = (c & 1u) ? (c >> 1) ^ kPolynomial : c >> 1;
    }
    t[0][b] = c;
  }
  for (size_t k = 1; k < t.size(); ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
    }
  }
  return t;
}

constexpr Tables kTables = makeTables();

// Reads four bytes as a little-endian integer (whatever the host's byte order).
inline uint32_t loadLe32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

uint32_t crc32cTables(uint32_t crc, const uint8_t* p, size_t length) {
  uint32_t c = ~crc;
  while (length >= 8) {
    const uint32_t lo = c ^ loadLe32(p);
    const uint32_t hi = loadLe32(p + 4);
    c = kTables[7][lo & 0xffu] ^ kTables[6][(lo >> 8) & 0xffu] ^ kTables[5][(lo >> 16) & 0xffu] ^
        kTables[4][lo >> 24] ^ kTables[3][hi & 0xffu] ^ kTables[2][(hi >> 8) & 0xffu] ^
        kTables[1][(hi >> 16) & 0xffu] ^ kTables[0][hi >> 24];
    p += 8;
    length -= 8;
  }
  while (length-- > 0) {
    c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xffu];
  }
  return ~c;
}

#if defined(__x86_64__)
// SSE4.2 has a CRC32C instruction (8 bytes each). It matters: every datagram is summed once on
// each side, so a table CRC would cap the transport near its own speed (about 1.5 GB/s).
// One chain of those instructions waits 3 cycles per step; three independent chains over
// three adjacent blocks keep the unit busy, and the three partial CRCs are then combined
// (CRC is linear: crc(A|B) = shift(crc(A), |B|) ^ crc(B) for a zero start state). Large
// blocks make the combining cheap; small ones let a 1472-byte datagram use three chains too
// (one chain over it took 40% of a 16 MB all_reduce at that MTU).
// One 8-byte CRC step; stores the word to `d` as well when kCopy (see crc32cCopy).
template <bool kCopy>
__attribute__((target("sse4.2"))) inline uint64_t stepWord(uint64_t c, const uint8_t* p,
                                                          uint8_t* d) {
  uint64_t word;
  std::memcpy(&word, p, 8);
  if constexpr (kCopy) std::memcpy(d, &word, 8);
  return __builtin_ia32_crc32di(c, word);
}

// Consumes whole 8-byte words on one chain, advancing `p` (and `d` when kCopy).
template <bool kCopy>
__attribute__((target("sse4.2"))) uint64_t crcWords(uint64_t c, const uint8_t*& p, uint8_t*& d,
                                                    size_t& length) {
  for (; length >= 8; length -= 8, p += 8) {
    c = stepWord<kCopy>(c, p, d);
    if constexpr (kCopy) d += 8;
  }
  return c;
}

// shift(x) = the CRC state x followed by `Block` zero bytes, as four byte-indexed tables.
template <size_t Block>
struct ShiftTables {
  uint32_t t[4][256];
};

template <size_t Block>
__attribute__((target("sse4.2"))) ShiftTables<Block> makeShiftTables() {
  ShiftTables<Block> s{};
  static const uint8_t zeros[Block] = {};
  for (int j = 0; j < 4; ++j) {
    for (uint32_t v = 0; v < 256; ++v) {
      const uint8_t* p = zeros;
      uint8_t* none = nullptr;
      size_t length = Block;
      s.t[j][v] = static_cast<uint32_t>(crcWords<false>(uint64_t{v} << (8 * j), p, none, length));
    }
  }
  return s;
}

template <size_t Block>
inline uint32_t shiftBlock(const ShiftTables<Block>& s, uint32_t x) {
  return s.t[0][x & 0xffu] ^ s.t[1][(x >> 8) & 0xffu] ^ s.t[2][(x >> 16) & 0xffu] ^
         s.t[3][x >> 24];
}

// Consumes rounds of three Block-byte chains while at least 3 * Block bytes are left, copying
// them to `d` on the way when kCopy.
template <size_t Block, bool kCopy>
__attribute__((target("sse4.2"))) uint64_t crcThreeChains(uint64_t c, const uint8_t*& p,
                                                          uint8_t*& d, size_t& length) {
  static const ShiftTables<Block> shift = makeShiftTables<Block>();
  while (length >= 3 * Block) {
    uint64_t a = c, b = 0, e = 0;
    // Without a copy `d` is null: never offset it.
    auto to = [d](size_t offset) { return kCopy ? d + offset : nullptr; };
    for (size_t i = 0; i < Block; i += 8) {
      a = stepWord<kCopy>(a, p + i, to(i));
      b = stepWord<kCopy>(b, p + Block + i, to(Block + i));
      e = stepWord<kCopy>(e, p + 2 * Block + i, to(2 * Block + i));
    }
    c = shiftBlock(shift, shiftBlock(shift, static_cast<uint32_t>(a)) ^
                              static_cast<uint32_t>(b)) ^
        static_cast<uint32_t>(e);
    p += 3 * Block;
    if constexpr (kCopy) d += 3 * Block;
    length -= 3 * Block;
  }
  return c;
}

template <bool kCopy, bool kFold>
__attribute__((target("sse4.2"))) uint32_t crc32cHardware(uint32_t crc, const uint8_t* p,
                                                           uint8_t* d, size_t length) {
  uint64_t c = ~crc;
  if constexpr (kFold && kCopy) c = crc32cFoldCopy(c, d, p, length);
  if constexpr (kFold && !kCopy) c = crc32cFoldSum(c, p, length);
  c = crcThreeChains<512, kCopy>(c, p, d, length);
  c = crcThreeChains<128, kCopy>(c, p, d, length);
  c = crcThreeChains<32, kCopy>(c, p, d, length);
  c = crcWords<kCopy>(c, p, d, length);
  auto c32 = static_cast<uint32_t>(c);
  for (; length > 0; --length) {
    if constexpr (kCopy) *d++ = *p;
    c32 = __builtin_ia32_crc32qi(c32, *p++);
  }
  return ~c32;
}

#endif

bool available(Crc32cKernel kernel) {
  switch (kernel) {
    case Crc32cKernel::kTables: return true;
#if defined(__x86_64__)
    case Crc32cKernel::kCrcInstruction:
      __builtin_cpu_init();  // kActive is computed during static initialization
      return __builtin_cpu_supports("sse4.2");
    case Crc32cKernel::kCarrylessFold: return crc32cFoldAvailable();  // SSE4.2 included
#else
    case Crc32cKernel::kCrcInstruction:
    case Crc32cKernel::kCarrylessFold: return false;
#endif
  }
  return false;
}

Crc32cKernel fastest() {
  for (const Crc32cKernel k : {Crc32cKernel::kCarrylessFold, Crc32cKernel::kCrcInstruction}) {
    if (available(k)) return k;
  }
  return Crc32cKernel::kTables;
}

// Until this is initialised (during static initialisation) it reads as zero, kTables: safe
// for anything that sums earlier.
static_assert(Crc32cKernel{} == Crc32cKernel::kTables);
const Crc32cKernel kActive = fastest();

uint32_t extendWith(Crc32cKernel kernel, uint32_t crc, const uint8_t* p, size_t length) {
  switch (kernel) {
#if defined(__x86_64__)
    case Crc32cKernel::kCarrylessFold: return crc32cHardware<false, true>(crc, p, nullptr, length);
    case Crc32cKernel::kCrcInstruction: return crc32cHardware<false, false>(crc, p, nullptr, length);
#endif
    default: return crc32cTables(crc, p, length);
  }
}

uint32_t copyWith(Crc32cKernel kernel, uint32_t crc, uint8_t* d, const uint8_t* p, size_t length) {
  switch (kernel) {
#if defined(__x86_64__)
    case Crc32cKernel::kCarrylessFold: return crc32cHardware<true, true>(crc, p, d, length);
    case Crc32cKernel::kCrcInstruction: return crc32cHardware<true, false>(crc, p, d, length);
#endif
    default:
      if (length > 0) std::memcpy(d, p, length);
      return crc32cTables(crc, d, length);
  }
}

}  // namespace

uint32_t crc32cExtend(uint32_t crc, const void* data, size_t length) {
  return extendWith(kActive, crc, static_cast<const uint8_t*>(data), length);
}

uint32_t crc32cCopy(uint32_t crc, void* dst, const void* src, size_t length) {
  return copyWith(kActive, crc, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src),
                  length);
}

uint32_t crc32cPortableExtend(uint32_t crc, const void* data, size_t length) {
  return crc32cTables(crc, static_cast<const uint8_t*>(data), length);
}

const char* crc32cKernelName(Crc32cKernel kernel) {
  switch (kernel) {
    case Crc32cKernel::kTables: return "tables";
    case Crc32cKernel::kCrcInstruction: return "sse4.2";
    case Crc32cKernel::kCarrylessFold: return "vpclmulqdq";
  }
  return "?";
}

bool crc32cKernelAvailable(Crc32cKernel kernel) { return available(kernel); }

Crc32cKernel crc32cActiveKernel() { return kActive; }

namespace {
void requireAvailable(Crc32cKernel kernel) {
  if (!available(kernel)) {
    throw std::invalid_argument(std::string("crc32c kernel ") + crc32cKernelName(kernel) +
                                " is not available on this CPU");
  }
}
}  // namespace

uint32_t crc32cExtendWith(Crc32cKernel kernel, uint32_t crc, const void* data, size_t length) {
  requireAvailable(kernel);
  return extendWith(kernel, crc, static_cast<const uint8_t*>(data), length);
}

uint32_t crc32cCopyWith(Crc32cKernel kernel, uint32_t crc, void* dst, const void* src,
                        size_t length) {
  requireAvailable(kernel);
  return copyWith(kernel, crc, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src),
                  length);
}

uint32_t crc32c(const void* data, size_t length) { return crc32cExtend(0, data, length); }

}  // namespace ucxb::udp
