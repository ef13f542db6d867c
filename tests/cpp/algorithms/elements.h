// Test inputs for the reducing collectives and their expected results, computed here without
// the reduction kernels: every input element is a small integer (or a pair of them, for
// complex types), so every partial result of a reduction is exactly representable in every
// dtype, the order in which an algorithm folds ranks cannot change a bit, and the expected
// bytes can be compared with memcmp, floats included. Integer types wrap as the kernels do.
#pragma once

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "csrc/collectives/reduce_kernels.h"

namespace ucxb::algotest {

// One element's value before encoding; `im` only for complex types.
struct Value {
  int64_t re = 0;
  int64_t im = 0;
};

inline bool isComplex(DType d) { return d == DType::kComplex64 || d == DType::kComplex128; }

// Element i of rank `rank`'s input in a case numbered `salt`. Products use factors of
// magnitude 1 or 2 (a 2 on only a third of the ranks), so that eight ranks stay within a
// bfloat16's 8 significant bits; unsigned types and bool get non-negative values.
inline Value inputValue(DType d, ReduceKind op, int rank, size_t i, uint32_t salt) {
  const auto mix = [&](uint32_t k) {
    return static_cast<int64_t>((static_cast<uint64_t>(rank) * 7919 + i * 104729 + salt * 31 + k) %
                                11);
  };
  Value v;
  if (op == ReduceKind::kProduct) {
    const int64_t pick = mix(0) % 3;
    v.re = rank % 3 == 0 && pick == 0 ? 2 : (pick == 1 ? -1 : 1);
    // No zero parts: a product's zero part then only ever comes from x - x, which is +0 in
    // every fold order (a zero factor would make the sign of zero depend on the order).
    if (isComplex(d)) v.im = mix(1) % 2 == 0 ? 1 : -1;
  } else {
    v.re = mix(0) - 5;
    v.im = mix(1) - 5;
  }
  if (d == DType::kUInt8) v.re = std::llabs(v.re) * 3;
  if (d == DType::kBool) v.re = v.re > 0 ? 1 : 0;
  return v;
}

// The fold of two values as the dtype's kernel computes it (before the wrap of narrow ints).
inline Value combine(DType d, ReduceKind op, Value a, Value b) {
  if (d == DType::kBool) {
    switch (op) {
      case ReduceKind::kSum: case ReduceKind::kMax: case ReduceKind::kBor:
        return {a.re | b.re, 0};
      case ReduceKind::kBxor: return {a.re ^ b.re, 0};
      default: return {a.re & b.re, 0};
    }
  }
  switch (op) {
    case ReduceKind::kSum: return {a.re + b.re, a.im + b.im};
    case ReduceKind::kProduct:
      if (isComplex(d)) return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
      return {a.re * b.re, 0};
    case ReduceKind::kMin: return {a.re < b.re ? a.re : b.re, 0};
    case ReduceKind::kMax: return {a.re > b.re ? a.re : b.re, 0};
    case ReduceKind::kBand: return {a.re & b.re, 0};
    case ReduceKind::kBor: return {a.re | b.re, 0};
    case ReduceKind::kBxor: return {a.re ^ b.re, 0};
  }
  return a;
}

// IEEE binary16 bits of a small integer (|v| < 2048: exact).
inline uint16_t halfBits(int64_t v) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  const auto a = static_cast<uint64_t>(std::llabs(v));
  const int e = 63 - std::countl_zero(a);
  const auto mantissa = static_cast<uint16_t>(((a << 10) >> e) & 0x3ff);
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | mantissa);
}

// Writes `v` as one element of `d` at `out`.
inline void encode(DType d, Value v, uint8_t* out) {
  auto put = [&](auto x) { std::memcpy(out, &x, sizeof(x)); };
  switch (d) {
    case DType::kInt8: put(static_cast<int8_t>(v.re)); return;
    case DType::kUInt8: put(static_cast<uint8_t>(v.re)); return;
    case DType::kBool: put(static_cast<uint8_t>(v.re != 0)); return;
    case DType::kInt16: put(static_cast<int16_t>(v.re)); return;
    case DType::kInt32: put(static_cast<int32_t>(v.re)); return;
    case DType::kInt64: put(v.re); return;
    case DType::kFloat32: put(static_cast<float>(v.re)); return;
    case DType::kFloat64: put(static_cast<double>(v.re)); return;
    case DType::kFloat16: put(halfBits(v.re)); return;
    // A small integer's float has no bits below the top 16: bfloat16 is its upper half.
    case DType::kBFloat16:
      put(static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v.re)) >> 16));
      return;
    case DType::kComplex64: {
      const float parts[2] = {static_cast<float>(v.re), static_cast<float>(v.im)};
      std::memcpy(out, parts, sizeof(parts));
      return;
    }
    case DType::kComplex128: {
      const double parts[2] = {static_cast<double>(v.re), static_cast<double>(v.im)};
      std::memcpy(out, parts, sizeof(parts));
      return;
    }
  }
}

// Rank `rank`'s whole input of `count` elements.
inline std::string inputBytes(DType d, ReduceKind op, int rank, size_t count, uint32_t salt) {
  const size_t esz = elementSize(d);
  std::string bytes(count * esz, '\0');
  for (size_t i = 0; i < count; ++i) {
    encode(d, inputValue(d, op, rank, i, salt), reinterpret_cast<uint8_t*>(bytes.data()) + i * esz);
  }
  return bytes;
}

// Elements [first, first+count) of the reduction over ranks 0..n-1 of their inputs.
inline std::string reducedBytes(DType d, ReduceKind op, int n, size_t first, size_t count,
                                uint32_t salt) {
  const size_t esz = elementSize(d);
  std::string bytes(count * esz, '\0');
  for (size_t i = 0; i < count; ++i) {
    Value acc = inputValue(d, op, 0, first + i, salt);
    for (int r = 1; r < n; ++r) acc = combine(d, op, acc, inputValue(d, op, r, first + i, salt));
    encode(d, acc, reinterpret_cast<uint8_t*>(bytes.data()) + i * esz);
  }
  return bytes;
}

// Rewrites every -0 of a floating dtype in `bytes` as +0. The sign of a zero that a sum of
// two products (a complex product's parts) cancels to depends on how the kernel rounds and
// fuses, so it may differ between fold orders; every other bit may not.
inline std::string withPositiveZeros(DType d, std::string bytes) {
  size_t part = 0;  // bytes of one floating-point number; 0 for integer types
  switch (d) {
    case DType::kFloat16: case DType::kBFloat16: part = 2; break;
    case DType::kFloat32: case DType::kComplex64: part = 4; break;
    case DType::kFloat64: case DType::kComplex128: part = 8; break;
    default: return bytes;
  }
  for (size_t at = 0; at + part <= bytes.size(); at += part) {
    bool negativeZero = static_cast<uint8_t>(bytes[at + part - 1]) == 0x80;  // little-endian
    for (size_t b = 0; b + 1 < part && negativeZero; ++b) negativeZero = bytes[at + b] == 0;
    if (negativeZero) bytes[at + part - 1] = 0;
  }
  return bytes;
}

// Byte i of rank `rank`'s message in the data-moving ops (broadcast, gathers, all_to_all),
// different for every rank, offset and case.
inline uint8_t patternByte(int rank, size_t i, uint32_t salt) {
  return static_cast<uint8_t>(rank * 73 + i * 151 + salt * 29 + (i >> 8) * 7 + 1);
}

inline std::string patternBytes(int rank, size_t bytes, uint32_t salt) {
  std::string s(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) s[i] = static_cast<char>(patternByte(rank, i, salt));
  return s;
}

}  // namespace ucxb::algotest
