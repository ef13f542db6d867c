#include "csrc/collectives/reduce_kernels.h"

// The kernels never read floating-point exception flags, so GCC may compute both sides of a
// select (a NaN check, the cases of a half conversion) and vectorize the loops; without
// this it keeps branches there. Results are unchanged (tests/cpp/reduce_kernels_test.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <complex>
#include <cstring>
#include <type_traits>

namespace ucxb {

namespace {

// IEEE half and bfloat16 stored as uint16_t; arithmetic happens in float and rounds back to
// nearest-even after every element, as a half-precision ALU would.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

float bitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}
uint32_t floatToBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float toFloat(Half h) {
  const uint32_t sign = uint32_t{h.bits & 0x8000u} << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1f;
  const uint32_t man = h.bits & 0x3ff;
  const uint32_t special = 0x7f800000u | (man << 13);  // inf, nan
  // Zero and subnormals: man * 2^-24, exact in float.
  // (int32 to float: x86 vectors convert signed integers only)
  const uint32_t small =
      floatToBits(static_cast<float>(static_cast<int32_t>(man)) * 5.9604644775390625e-8f);
  const uint32_t normal = ((exp + 112) << 23) | (man << 13);
  return bitsToFloat(sign | (exp == 0x1f ? special : (exp == 0 ? small : normal)));
}

// The conversions are branch-free (every case computed, one selected), so that the element
// loops below vectorize; they round exactly as branching versions would.
Half toHalf(float f) {
  uint32_t x = floatToBits(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  // >= 65536 (after rounding everything >= 65520 is inf), inf, nan: nan stays nan; finite
  // overflow and inf -> inf.
  const uint32_t huge = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // Below the smallest normal half, let the FPU round: adding 0.5 (2^-1) aligns the half
  // subnormal grid (2^-24) to float's last mantissa bit.
  const uint32_t tiny = floatToBits(bitsToFloat(x) + 0.5f) - 0x3f000000u;
  // Rebias the exponent (-112 << 23) and round to nearest even.
  const uint32_t normal = (x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13;
  const uint32_t out = x >= 0x47800000u ? huge : (x < 0x38800000u ? tiny : normal);
  return Half{static_cast<uint16_t>((out & 0xffffu) | (sign >> 16))};
}

float toFloat(BFloat16 b) { return bitsToFloat(uint32_t{b.bits} << 16); }

BFloat16 toBFloat16(float f) {
  const uint32_t x = floatToBits(f);
  const uint32_t quietNan = (x >> 16) | 0x40u;
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return BFloat16{static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quietNan : rounded)};
}

// --- element operations -------------------------------------------------------------------

template <typename T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct Sum {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {  // wrap around like C unsigned arithmetic
      return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
    } else {
      return a + b;
    }
  }
};
struct Product {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
    } else {
      return a * b;
    }
  }
};
// min/max propagate NaN, as torch.minimum/maximum do.
// (Selects, not branches, so that the loops vectorize.)
struct Min {
  template <typename T>
  T operator()(T a, T b) const {
    const T m = b < a ? b : a;
    if constexpr (std::is_floating_point_v<T>) {
      return std::isunordered(a, b) ? a + b : m;
    } else {
      return m;
    }
  }
};
struct Max {
  template <typename T>
  T operator()(T a, T b) const {
    const T m = a < b ? b : a;
    if constexpr (std::is_floating_point_v<T>) {
      return std::isunordered(a, b) ? a + b : m;
    } else {
      return m;
    }
  }
};
// Min and Max with their operands swapped: folding y into x with these gives the bits that
// folding x into y with Min and Max does, -0 and +0 included (which of two NaNs comes out is
// the compiler's to choose, as for SUM: it may commute the addition that propagates them).
struct MinTiesToIn {
  template <typename T>
  T operator()(T a, T b) const { return Min{}(b, a); }
};
struct MaxTiesToIn {
  template <typename T>
  T operator()(T a, T b) const { return Max{}(b, a); }
};
struct Band {
  template <typename T>
  T operator()(T a, T b) const { return static_cast<T>(a & b); }
};
struct Bor {
  template <typename T>
  T operator()(T a, T b) const { return static_cast<T>(a | b); }
};
struct Bxor {
  template <typename T>
  T operator()(T a, T b) const { return static_cast<T>(a ^ b); }
};

template <typename T, typename Op>
void apply(void* acc, const void* in, size_t count) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  const Op op;
  for (size_t i = 0; i < count; ++i) {
    a[i] = op(a[i], b[i]);
  }
}

// Always inlined, so that each AVX2 clone below gets its own AVX2 copy of the loop.
#define UCXB_INLINE inline __attribute__((always_inline))

template <typename Op>
UCXB_INLINE void applyHalf(void* acc, const void* in, size_t count) {
  auto* a = static_cast<Half*>(acc);
  const auto* b = static_cast<const Half*>(in);
  const Op op;
  for (size_t i = 0; i < count; ++i) {
    a[i] = toHalf(op(toFloat(a[i]), toFloat(b[i])));
  }
}

template <typename Op>
UCXB_INLINE void applyBFloat16(void* acc, const void* in, size_t count) {
  auto* a = static_cast<BFloat16*>(acc);
  const auto* b = static_cast<const BFloat16*>(in);
  const Op op;
  for (size_t i = 0; i < count; ++i) {
    a[i] = toBFloat16(op(toFloat(a[i]), toFloat(b[i])));
  }
}

// bool is one byte holding 0 or 1; the logical ops map onto bitwise ones on those values.
ReduceFn boolReduce(ReduceKind op) {
  switch (op) {
    case ReduceKind::kSum:
    case ReduceKind::kMax:
    case ReduceKind::kBor:
      return &apply<uint8_t, Bor>;
    case ReduceKind::kProduct:
    case ReduceKind::kMin:
    case ReduceKind::kBand:
      return &apply<uint8_t, Band>;
    case ReduceKind::kBxor:
      return &apply<uint8_t, Bxor>;
  }
  return nullptr;
}

template <typename T>
ReduceFn integerReduce(ReduceKind op) {
  switch (op) {
    case ReduceKind::kSum: return &apply<T, Sum>;
    case ReduceKind::kProduct: return &apply<T, Product>;
    case ReduceKind::kMin: return &apply<T, Min>;
    case ReduceKind::kMax: return &apply<T, Max>;
    case ReduceKind::kBand: return &apply<T, Band>;
    case ReduceKind::kBor: return &apply<T, Bor>;
    case ReduceKind::kBxor: return &apply<T, Bxor>;
  }
  return nullptr;
}

template <typename T>
ReduceFn floatReduce(ReduceKind op) {
  switch (op) {
    case ReduceKind::kSum: return &apply<T, Sum>;
    case ReduceKind::kProduct: return &apply<T, Product>;
    case ReduceKind::kMin: return &apply<T, Min>;
    case ReduceKind::kMax: return &apply<T, Max>;
    default: return nullptr;
  }
}


// half and bfloat16 convert every element to float and back, which the x86-64 baseline
// (SSE2) does at ~1 (half) and ~5 (bfloat16) GB/s here: slow enough to matter for fp16/bf16
// gradients. Where the CPU has them, half uses F16C's conversions and bfloat16 an AVX2 clone
// of its loop (picked when the library loads), 8 elements at a time. float32/64 and
// integers stay on the baseline: their loops are memory-bound (AVX2 measured 60 -> 71 GB/s
// in L2, 23 -> 24 GB/s from DRAM).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(UCXB_NO_NARROW_CLONES)  // (the unit test builds the baseline loops this way)
#define UCXB_NARROW_X86 1
#if defined(__GLIBC__)  // target_clones resolves through an ifunc, which needs glibc
#define UCXB_NARROW_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define UCXB_NARROW_CLONES
#endif
#else
#define UCXB_NARROW_X86 0
#define UCXB_NARROW_CLONES
#endif

#if UCXB_NARROW_X86
// Eight halves per step: F16C converts exactly (round to nearest even, subnormals, inf);
// the reduction itself is the scalar functor over the eight floats, which GCC turns into
// vector instructions. NaNs come out as sign | 0x7e00, as from toHalf.
template <typename Op>
__attribute__((target("avx2,f16c"))) void applyHalfF16c(void* acc, const void* in,
                                                        size_t count) {
  auto* a = static_cast<uint16_t*>(acc);
  const auto* b = static_cast<const uint16_t*>(in);
  const Op op;
  const __m128i quietNan = _mm_set1_epi16(0x7e00);
  const __m128i signBit = _mm_set1_epi16(static_cast<int16_t>(0x8000));
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    alignas(32) float x[8];
    alignas(32) float y[8];
    _mm256_store_ps(x, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))));
    _mm256_store_ps(y, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i))));
    for (int j = 0; j < 8; ++j) x[j] = op(x[j], y[j]);
    const __m256 r = _mm256_load_ps(x);
    __m128i h = _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(r, r, _CMP_UNORD_Q));
    const __m128i nan16 =
        _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
    h = _mm_blendv_epi8(h, _mm_or_si128(_mm_and_si128(h, signBit), quietNan), nan16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(a + i), h);
  }
  applyHalf<Op>(a + i, b + i, count - i);
}

bool haveF16c() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"); }
#endif

// target_clones cannot be put on a template, hence one function per bfloat16 op.
#define UCXB_BFLOAT16_KERNEL(name, op) \
  UCXB_NARROW_CLONES void name(void* a, const void* b, size_t n) { applyBFloat16<op>(a, b, n); }
UCXB_BFLOAT16_KERNEL(bfloat16Sum, Sum)
UCXB_BFLOAT16_KERNEL(bfloat16Product, Product)
UCXB_BFLOAT16_KERNEL(bfloat16Min, Min)
UCXB_BFLOAT16_KERNEL(bfloat16Max, Max)
UCXB_BFLOAT16_KERNEL(bfloat16MinTiesToIn, MinTiesToIn)
UCXB_BFLOAT16_KERNEL(bfloat16MaxTiesToIn, MaxTiesToIn)
#undef UCXB_BFLOAT16_KERNEL

ReduceFn bfloat16Reduce(ReduceKind op) {
  switch (op) {
    case ReduceKind::kSum: return &bfloat16Sum;
    case ReduceKind::kProduct: return &bfloat16Product;
    case ReduceKind::kMin: return &bfloat16Min;
    case ReduceKind::kMax: return &bfloat16Max;
    default: return nullptr;
  }
}

template <typename Op>
ReduceFn halfKernel() {
#if UCXB_NARROW_X86
  if (haveF16c()) return &applyHalfF16c<Op>;
#endif
  return &applyHalf<Op>;
}

ReduceFn halfReduce(ReduceKind op) {
  switch (op) {
    case ReduceKind::kSum: return halfKernel<Sum>();
    case ReduceKind::kProduct: return halfKernel<Product>();
    case ReduceKind::kMin: return halfKernel<Min>();
    case ReduceKind::kMax: return halfKernel<Max>();
    default: return nullptr;
  }
}

// findReduceTiesToIn's kernels: only floating-point MIN and MAX differ from findReduce's.
ReduceFn tiesToInReduce(DType dtype, ReduceKind op) {
  const bool min = op == ReduceKind::kMin;
  if (!min && op != ReduceKind::kMax) return nullptr;
  switch (dtype) {
    case DType::kFloat16: return min ? halfKernel<MinTiesToIn>() : halfKernel<MaxTiesToIn>();
    case DType::kBFloat16: return min ? &bfloat16MinTiesToIn : &bfloat16MaxTiesToIn;
    case DType::kFloat32: return min ? &apply<float, MinTiesToIn> : &apply<float, MaxTiesToIn>;
    case DType::kFloat64: return min ? &apply<double, MinTiesToIn> : &apply<double, MaxTiesToIn>;
    default: return nullptr;
  }
}

template <typename T>
ReduceFn complexReduce(ReduceKind op) {
  switch (op) {
    case ReduceKind::kSum: return &apply<std::complex<T>, Sum>;
    case ReduceKind::kProduct: return &apply<std::complex<T>, Product>;
    default: return nullptr;
  }
}

}  // namespace

size_t elementSize(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kBool: return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kFloat64:
    case DType::kInt64:
    case DType::kComplex64: return 8;
    case DType::kComplex128: return 16;
  }
  return 0;
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
    case DType::kComplex64: return "complex64";
    case DType::kComplex128: return "complex128";
  }
  return "?";
}

const char* reduceName(ReduceKind op) {
  switch (op) {
    case ReduceKind::kSum: return "SUM";
    case ReduceKind::kProduct: return "PRODUCT";
    case ReduceKind::kMin: return "MIN";
    case ReduceKind::kMax: return "MAX";
    case ReduceKind::kBand: return "BAND";
    case ReduceKind::kBor: return "BOR";
    case ReduceKind::kBxor: return "BXOR";
  }
  return "?";
}

ReduceFn findReduce(DType dtype, ReduceKind op) {
  switch (dtype) {
    case DType::kFloat16: return halfReduce(op);
    case DType::kBFloat16: return bfloat16Reduce(op);
    case DType::kFloat32: return floatReduce<float>(op);
    case DType::kFloat64: return floatReduce<double>(op);
    case DType::kInt8: return integerReduce<int8_t>(op);
    case DType::kUInt8: return integerReduce<uint8_t>(op);
    case DType::kInt16: return integerReduce<int16_t>(op);
    case DType::kInt32: return integerReduce<int32_t>(op);
    case DType::kInt64: return integerReduce<int64_t>(op);
    case DType::kBool: return boolReduce(op);
    case DType::kComplex64: return complexReduce<float>(op);
    case DType::kComplex128: return complexReduce<double>(op);
  }
  return nullptr;
}

Reduction makeReduction(DType dtype, ReduceKind op) {
  return {findReduce(dtype, op), elementSize(dtype), dtype, op};
}

ReduceFn findReduceTiesToIn(DType dtype, ReduceKind op) {
  const ReduceFn fn = tiesToInReduce(dtype, op);
  return fn != nullptr ? fn : findReduce(dtype, op);
}

}  // namespace ucxb
