// The half and bfloat16 reduction kernels (branch-free, cloned for AVX2) against a plain
// branching reference: every half/bfloat16 value as the accumulator, against operands that
// cover zeros, subnormals, the rounding boundaries, the largest finite values, infinities
// and NaNs, plus pseudo-random ones. Results must be bit-identical, except that when both
// operands are NaN either NaN may come out (the vector units pick the payload by operand
// order). Uses tests/cpp/check.h (one check per kernel and operand; the first mismatches are
// printed). Built twice by tests/test_reduce_kernels.py:
// as shipped (the AVX2 clone where the CPU has it) and with -DUCXB_NO_NARROW_CLONES. Also:
// findReduceTiesToIn's kernels give findReduce's bits with the operands swapped.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "csrc/collectives/reduce_kernels.h"
#include "tests/cpp/check.h"

namespace {


float refHalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t refFloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t out;
  if (std::isnan(f)) {
    out = 0x7e00;
  } else if (x >= 0x47800000u) {
    out = 0x7c00;
  } else if (x < 0x38800000u) {
    // Round |f| to a multiple of 2^-24, ties to even (rint under the default rounding mode).
    out = static_cast<uint32_t>(std::nearbyint(std::ldexp(std::bit_cast<float>(x), 24)));
  } else {
    const uint32_t mant = x & 0x7fffffu;
    const uint32_t exp = (x >> 23) - 112;
    out = (exp << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (out & 1u))) ++out;  // may carry into inf
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

float refBf16ToFloat(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

uint16_t refFloatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40);
  uint32_t out = x >> 16;
  const uint32_t rest = x & 0xffffu;
  if (rest > 0x8000u || (rest == 0x8000u && (out & 1u))) ++out;
  return static_cast<uint16_t>(out);
}

float refOp(ucxb::ReduceKind op, float a, float b) {
  switch (op) {
    case ucxb::ReduceKind::kSum: return a + b;
    case ucxb::ReduceKind::kProduct: return a * b;
    case ucxb::ReduceKind::kMin:
      if (std::isnan(a) || std::isnan(b)) return a + b;
      return b < a ? b : a;
    case ucxb::ReduceKind::kMax:
      if (std::isnan(a) || std::isnan(b)) return a + b;
      return a < b ? b : a;
    default: return 0;
  }
}

std::vector<uint16_t> operands() {
  std::vector<uint16_t> v = {
      0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x3c01, 0x3bff,
      0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe00, 0x0080, 0x007f, 0x3f80,
      0xbf80, 0x3f81, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x4000, 0x5640,
      0x1000, 0x0200, 0x4b00, 0x3555, 0x3e00, 0x4400, 0x6800, 0x7000, 0x0c00, 0x2000};
  uint32_t s = 12345;
  for (int i = 0; i < 88; ++i) {
    s = s * 1664525u + 1013904223u;
    v.push_back(static_cast<uint16_t>(s >> 16));
  }
  return v;
}

// Every accumulator value of `dt` against every operand, for each of the four ops.
void checkNarrowFloat(ucxb::DType dt) {
  using ucxb::DType;
  using ucxb::ReduceKind;
  const std::vector<uint16_t> bs = operands();
  int printed = 0;
  const bool half = dt == DType::kFloat16;
  auto toF = half ? refHalfToFloat : refBf16ToFloat;
  auto fromF = half ? refFloatToHalf : refFloatToBf16;
  auto isNan = [&](uint16_t v) { return std::isnan(toF(v)); };
  for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kProduct, ReduceKind::kMin,
                        ReduceKind::kMax}) {
    const ucxb::ReduceFn fn = ucxb::findReduce(dt, op);
    std::vector<uint16_t> acc(65536);
    std::vector<uint16_t> in(65536);
    for (uint16_t b : bs) {
      for (uint32_t a = 0; a < 65536; ++a) {
        acc[a] = static_cast<uint16_t>(a);
        in[a] = b;
      }
      // Odd offsets and lengths too: the vector loop's head and tail.
      fn(acc.data() + 1, in.data() + 1, 65536 - 2);
      fn(acc.data(), in.data(), 1);
      fn(acc.data() + 65535, in.data() + 65535, 1);
      int wrong = 0;
      for (uint32_t a = 0; a < 65536; ++a) {
        const auto ai = static_cast<uint16_t>(a);
        const uint16_t want = fromF(refOp(op, toF(ai), toF(b)));
        const uint16_t got = acc[a];
        const bool ok = got == want || (isNan(ai) && isNan(b) && isNan(got));
        if (!ok && wrong++ == 0 && printed++ < 10) {
          std::printf("%s %s: %04x op %04x = %04x, want %04x\n", ucxb::dtypeName(dt),
                      ucxb::reduceName(op), a, b, got, want);
        }
      }
      char what[64];
      std::snprintf(what, sizeof(what), "%s %s, operand %04x", ucxb::dtypeName(dt),
                    ucxb::reduceName(op), b);
      CHECK_MSG(wrong == 0, std::string(what) + ": " + std::to_string(wrong) + " wrong");
    }
  }
}

// findReduceTiesToIn's kernel folding y into x gives the bits findReduce's gives folding x
// into y (a 2-rank all_reduce folds with one on each rank): -0 and +0 in both orders, and
// unequal values. `bits` are the element's bit patterns, as the dtype stores them.
template <typename Bits>
void checkTiesToIn(ucxb::DType dt, const std::vector<Bits>& bits) {
  using ucxb::ReduceKind;
  for (ReduceKind op : {ReduceKind::kSum, ReduceKind::kProduct, ReduceKind::kMin,
                        ReduceKind::kMax}) {
    // Every ordered pair, 33 long or more: the vector loops and their tails.
    std::vector<Bits> xs, ys;
    for (Bits x : bits) {
      for (Bits y : bits) {
        xs.push_back(x);
        ys.push_back(y);
      }
    }
    while (xs.size() < 33) {
      xs.push_back(xs[0]);
      ys.push_back(ys[0]);
    }
    std::vector<Bits> plain = ys, tiesToIn = xs;  // y op x; x op' y
    ucxb::findReduce(dt, op)(plain.data(), xs.data(), xs.size());
    ucxb::findReduceTiesToIn(dt, op)(tiesToIn.data(), ys.data(), ys.size());
    int wrong = 0;
    for (size_t i = 0; i < xs.size(); ++i) wrong += plain[i] != tiesToIn[i];
    CHECK_MSG(wrong == 0, std::string(ucxb::dtypeName(dt)) + " " + ucxb::reduceName(op) + ": " +
                              std::to_string(wrong) + " pairs depend on the fold's direction");
  }
}

void testTiesToIn() {
  // -0, +0, 1, -1.5 in each format.
  checkTiesToIn<uint16_t>(ucxb::DType::kFloat16, {0x8000, 0x0000, 0x3c00, 0xbe00});
  checkTiesToIn<uint16_t>(ucxb::DType::kBFloat16, {0x8000, 0x0000, 0x3f80, 0xbfc0});
  checkTiesToIn<uint32_t>(ucxb::DType::kFloat32, {0x80000000u, 0, 0x3f800000u, 0xbfc00000u});
  checkTiesToIn<uint64_t>(ucxb::DType::kFloat64,
                          {uint64_t{1} << 63, 0, 0x3ff0000000000000u, 0xbff8000000000000u});
}

void testFloat16() { checkNarrowFloat(ucxb::DType::kFloat16); }
void testBFloat16() { checkNarrowFloat(ucxb::DType::kBFloat16); }

}  // namespace

int main(int argc, char** argv) {
  const ucxb::check::Group groups[] = {
      {"float16", testFloat16, true},
      {"bfloat16", testBFloat16, true},
      {"ties to in", testTiesToIn, true},
  };
  return ucxb::check::runGroups("reduce_kernels_test", groups, argc, argv);
}
