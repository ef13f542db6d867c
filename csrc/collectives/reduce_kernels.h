// Element-wise reduction kernels, acc[i] = op(acc[i], in[i]), for every dtype the backend
// carries. Torch-free so the algorithms (and their tests) need no ATen.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ucxb {

enum class DType : uint8_t {
  kFloat16, kBFloat16, kFloat32, kFloat64,
  kInt8, kUInt8, kInt16, kInt32, kInt64,
  kBool, kComplex64, kComplex128,
};

enum class ReduceKind : uint8_t { kSum, kProduct, kMin, kMax, kBand, kBor, kBxor };

using ReduceFn = void (*)(void* acc, const void* in, size_t count);

// What an op reduces with: the host kernel, and the (dtype, kind) it was found for, from which
// device memory (OpMemory) picks its own kernel.
struct Reduction {
  ReduceFn fn = nullptr;
  size_t elementSize = 0;
  DType dtype = DType::kUInt8;
  ReduceKind kind = ReduceKind::kSum;
  // Fold with the operands swapped (fn is then findReduceTiesToIn's): set by all_reduce on
  // the higher rank of a pair that fold each other's vectors (allreduce.cpp's lowerFirst), so
  // that both compute the lower rank's value op the higher's. A memory that reduces without
  // fn (the device's ATen ops) swaps the operands itself.
  bool swapped = false;
};

size_t elementSize(DType dtype);
const char* dtypeName(DType dtype);
const char* reduceName(ReduceKind op);

// nullptr where the combination has no meaning (bitwise on floating types, min/max on complex).
// bool: sum = logical or, product = logical and, min = and, max = or.
ReduceFn findReduce(DType dtype, ReduceKind op);
// findReduce's kernel, but where acc[i] and in[i] compare equal it keeps in[i]'s bits (only
// floating-point MIN and MAX differ: -0 and +0): fn(x, y) with it gives the bits that
// findReduce's fn(y, x) gives, so two ranks that fold each other's vector into their own, one
// with each kernel, end bit-identical.
ReduceFn findReduceTiesToIn(DType dtype, ReduceKind op);
// The Reduction for (dtype, op): findReduce's kernel (nullptr where it has none) together with
// the dtype and kind it was found for, which kernels chosen later (device memory, the 2-rank
// fold order) are looked up by. Build every Reduction here, so the three always agree.
Reduction makeReduction(DType dtype, ReduceKind op);

}  // namespace ucxb
