// FoldTarget (transports/fold_target.h) with the shipped reduction kernels, fed the way UCX
// may feed a folding receive: pieces cut at any byte, in any order, each from wherever UCX's
// receive buffer holds it, which need not be aligned to the element's size. Every dtype and
// reduce op the kernels have, checked bit for bit against the same kernel run once over the
// whole message from aligned memory. Built under UndefinedBehaviorSanitizer
// (tests/test_fold_receive.py): a kernel handed a misaligned element stops the program there.
// Uses tests/cpp/check.h.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "csrc/collectives/reduce_kernels.h"
#include "tests/cpp/check.h"
#include "transports/fold_target.h"

namespace {

using ucxb::DType;
using ucxb::FoldTarget;
using ucxb::ReduceKind;

constexpr DType kDtypes[] = {
    DType::kFloat16, DType::kBFloat16, DType::kFloat32,   DType::kFloat64,
    DType::kInt8,    DType::kUInt8,    DType::kInt16,     DType::kInt32,
    DType::kInt64,   DType::kBool,     DType::kComplex64, DType::kComplex128,
};
constexpr ReduceKind kKinds[] = {ReduceKind::kSum, ReduceKind::kProduct, ReduceKind::kMin,
                                 ReduceKind::kMax, ReduceKind::kBand,    ReduceKind::kBor,
                                 ReduceKind::kBxor};

// Memory aligned to 64 bytes, `bytes` long plus room to start a copy up to 63 bytes in.
class Aligned {
 public:
  explicit Aligned(size_t bytes) : words_((bytes + 64) / 64 + 1) {}
  uint8_t* at(size_t offset) { return reinterpret_cast<uint8_t*>(words_.data()) + offset; }

 private:
  struct alignas(64) Line {
    uint8_t bytes[64];
  };
  std::vector<Line> words_;
};

// Bytes that are a valid value of `dtype` and never a NaN or an infinity (whose payloads the
// vector and scalar loops of a kernel may pick differently), nor a bool other than 0 or 1.
void fill(uint8_t* out, size_t bytes, DType dtype, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<uint8_t>(x >> 24);
  }
  // Clearing the highest exponent bit keeps every float below 2 and finite.
  size_t lane = 0;
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16: lane = 2; break;
    case DType::kFloat32:
    case DType::kComplex64: lane = 4; break;
    case DType::kFloat64:
    case DType::kComplex128: lane = 8; break;
    case DType::kBool:
      for (size_t i = 0; i < bytes; ++i) out[i] &= 1;
      return;
    default: return;
  }
  for (size_t i = lane - 1; i < bytes; i += lane) out[i] &= 0xbf;  // little-endian: top byte
}

// Folds `in` into `acc` through a FoldTarget: cut into pieces of `piece` bytes, handed over
// last first, piece k copied to an address `shift + 5 k` bytes past a 64-byte boundary.
bool foldInPieces(ucxb::ReduceFn fn, size_t esz, uint8_t* acc, const uint8_t* in, size_t bytes,
                  size_t piece, size_t shift) {
  FoldTarget target(acc, bytes, esz, fn);
  Aligned buffer(piece);
  std::vector<size_t> starts;
  for (size_t at = 0; at < bytes; at += piece) starts.push_back(at);
  bool ok = true;
  for (size_t k = starts.size(); k-- > 0;) {
    const size_t length = std::min(piece, bytes - starts[k]);
    uint8_t* src = buffer.at((shift + 5 * k) % 64);
    std::memcpy(src, in + starts[k], length);
    ok = target.unpack(starts[k], src, length) && ok;
  }
  return ok;
}

void testEveryKernelFromMisalignedPieces() {
  // 4100: runs of whole elements longer than a page, for every element size.
  const size_t counts[] = {1, 2, 3, 7, 33, 1000, 4100};
  for (const DType dtype : kDtypes) {
    const size_t esz = ucxb::elementSize(dtype);
    for (const ReduceKind kind : kKinds) {
      const ucxb::ReduceFn fn = ucxb::findReduce(dtype, kind);
      if (fn == nullptr) continue;
      for (const size_t count : counts) {
        const size_t bytes = count * esz;
        Aligned in(bytes);
        Aligned start(bytes);
        Aligned want(bytes);
        fill(in.at(0), bytes, dtype, static_cast<uint32_t>(count));
        fill(start.at(0), bytes, dtype, static_cast<uint32_t>(count + 7));
        std::memcpy(want.at(0), start.at(0), bytes);
        fn(want.at(0), in.at(0), bytes / esz);
        for (const size_t piece : {size_t{1}, size_t{3}, esz + 1, size_t{13}, size_t{4099},
                                   bytes}) {
          for (const size_t shift : {size_t{0}, size_t{1}, size_t{2}, size_t{7}}) {
            Aligned acc(bytes);
            std::memcpy(acc.at(0), start.at(0), bytes);
            const bool ok = foldInPieces(fn, esz, acc.at(0), in.at(0), bytes, piece, shift);
            const std::string what = std::string(ucxb::dtypeName(dtype)) + " " +
                                     ucxb::reduceName(kind) + " of " + std::to_string(bytes) +
                                     " bytes in pieces of " + std::to_string(piece) +
                                     " shifted " + std::to_string(shift);
            CHECK_MSG(ok, what + ": a piece was refused");
            CHECK_MSG(std::memcmp(acc.at(0), want.at(0), bytes) == 0, what + ": wrong bits");
          }
        }
      }
    }
  }
}

// A piece past the posted size is refused, and nothing of it is folded.
void testPieceBeyondTheMessageIsRefused() {
  const ucxb::ReduceFn fn = ucxb::findReduce(DType::kInt64, ReduceKind::kSum);
  Aligned acc(64);
  Aligned in(64);
  std::memset(acc.at(0), 0, 64);
  std::memset(in.at(0), 1, 64);
  FoldTarget target(acc.at(0), 32, 8, fn);
  CHECK(!target.unpack(24, in.at(3), 9));
  CHECK(!target.unpack(33, in.at(3), 0));
  Aligned zero(64);
  std::memset(zero.at(0), 0, 64);
  CHECK(std::memcmp(acc.at(0), zero.at(0), 64) == 0);
}

const ucxb::check::Group kGroups[] = {
    {"misaligned_pieces", testEveryKernelFromMisalignedPieces, true},
    {"beyond_the_message", testPieceBeyondTheMessageIsRefused, true},
};

}  // namespace

int main(int argc, char** argv) {
  return ucxb::check::runGroups("fold_target_test", kGroups, argc, argv);
}
