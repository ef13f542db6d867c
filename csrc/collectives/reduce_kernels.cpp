#include "csrc/collectives/reduce_kernels.h"

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
  uint32_t exp = (h.bits >> 10) & 0x1f;
  uint32_t man = h.bits & 0x3ff;
  if (exp == 0x1f) {
    return bitsToFloat(sign | 0x7f800000u | (man << 13));
  }
  if (exp == 0) {
    if (man == 0) {
      return bitsToFloat(sign);
    }
    // Subnormal half: value = man * 2^-24, exact in float.
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bitsToFloat(sign | ((exp + 112) << 23) | (man << 13));
}

Half toHalf(float f) {
  uint32_t x = floatToBits(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint16_t out;
  if (x >= 0x47800000u) {  // >= 65536 (after rounding everything >= 65520 is inf), inf, nan
    out = x > 0x7f800000u ? 0x7e00 : 0x7c00;  // nan stays nan; finite overflow and inf -> inf
  } else if (x < 0x38800000u) {  // below the smallest normal half: let the FPU round
    // Adding 0.5 (2^-1) aligns the half subnormal grid (2^-24) to float's last mantissa bit.
    const float shifted = bitsToFloat(x) + 0.5f;
    out = static_cast<uint16_t>(floatToBits(shifted) - 0x3f000000u);
  } else {
    const uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd;  // rebias exponent (-112 << 23) and round to nearest even
    out = static_cast<uint16_t>(x >> 13);
  }
  return Half{static_cast<uint16_t>(out | (sign >> 16))};
}

float toFloat(BFloat16 b) { return bitsToFloat(uint32_t{b.bits} << 16); }

BFloat16 toBFloat16(float f) {
  const uint32_t x = floatToBits(f);
  if (std::isnan(f)) {
    return BFloat16{static_cast<uint16_t>((x >> 16) | 0x40)};
  }
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(rounded >> 16)};
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
struct Min {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) return a + b;
    }
    return b < a ? b : a;
  }
};
struct Max {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(a) || std::isnan(b)) return a + b;
    }
    return a < b ? b : a;
  }
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

template <typename Op>
void applyHalf(void* acc, const void* in, size_t count) {
  auto* a = static_cast<Half*>(acc);
  const auto* b = static_cast<const Half*>(in);
  const Op op;
  for (size_t i = 0; i < count; ++i) {
    a[i] = toHalf(op(toFloat(a[i]), toFloat(b[i])));
  }
}

template <typename Op>
void applyBFloat16(void* acc, const void* in, size_t count) {
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

template <template <typename> class Apply>
ReduceFn narrowFloatReduce(ReduceKind op) {
  switch (op) {
    case ReduceKind::kSum: return &Apply<Sum>::run;
    case ReduceKind::kProduct: return &Apply<Product>::run;
    case ReduceKind::kMin: return &Apply<Min>::run;
    case ReduceKind::kMax: return &Apply<Max>::run;
    default: return nullptr;
  }
}

template <typename Op>
struct HalfKernel {
  static void run(void* a, const void* b, size_t n) { applyHalf<Op>(a, b, n); }
};
template <typename Op>
struct BFloat16Kernel {
  static void run(void* a, const void* b, size_t n) { applyBFloat16<Op>(a, b, n); }
};

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
    case DType::kFloat16: return narrowFloatReduce<HalfKernel>(op);
    case DType::kBFloat16: return narrowFloatReduce<BFloat16Kernel>(op);
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

}  // namespace ucxb
