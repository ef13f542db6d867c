// The scaffolding of tests/cpp/algorithms_test.cpp: the worlds every algorithm runs in (sizes,
// staging, chunk sizes), the sizes and dtype x reduce-op cases it runs there, and sweep(),
// which runs a group's cases in every world with the op forced to one algorithm.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "csrc/collectives/algorithms.h"
#include "tests/cpp/inproc/thread_world.h"

namespace ucxb::algotest {

// Not a multiple of any element size above 8, so chunks (and staged pieces, which the chunk
// size caps) split messages unevenly.
constexpr size_t kSmallChunk = 40;
// One element per chunk for every element size from 2 bytes up (and 3-element int8 chunks).
constexpr size_t kOddChunk = 3;
const int kOddChunkWorldSizes[] = {3};
// The large cases: 64 KiB+ messages (the staged thresholds) in 4 KiB chunks.
constexpr size_t kLargeChunk = 4096;
constexpr size_t kLargeBytes = 70000;
// One-byte chunks: 12289 elements need more chunks than most algorithms have tag steps for
// (kStepSpace over their phases), so they must enlarge the chunk (chunkElems) and still agree.
constexpr size_t kOneByteChunk = 1;
constexpr size_t kStepSpaceCount = 12289;
// Just over the chain broadcast's 2^15 steps of one byte.
constexpr size_t kStepSpaceBytes = (size_t{1} << 15) + 13;

const int kWorldSizes[] = {1, 2, 3, 4, 5, 8};
const int kLargeWorldSizes[] = {2, 3, 5};
const int kStepSpaceWorldSizes[] = {4, 5};

const DType kAllDTypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                            DType::kInt8,    DType::kUInt8,    DType::kInt16,   DType::kInt32,
                            DType::kInt64,   DType::kBool,     DType::kComplex64,
                            DType::kComplex128};
const ReduceKind kAllOps[] = {ReduceKind::kSum, ReduceKind::kProduct, ReduceKind::kMin,
                              ReduceKind::kMax, ReduceKind::kBand,    ReduceKind::kBor,
                              ReduceKind::kBxor};

// One world of a sweep: its size, staging and chunk size.
struct WorldShape {
  int size;
  bool staged;
  size_t chunkBytes;
  bool bounced;  // over BouncingMemory (tests/cpp/inproc/device_stand_ins.h)
  bool folds = false;  // a transport that folds receives (WorldOptions::folds)
  bool large() const { return chunkBytes == kLargeChunk; }
  bool stepSpace() const { return chunkBytes == kOneByteChunk; }
  std::string label() const {
    return "n=" + std::to_string(size) + (staged ? " staged" : "") +
           (bounced ? " bounced" : "") + (folds ? " folded" : "") +
           " chunk=" + std::to_string(chunkBytes);
  }
};

// Every world a group runs in: each size with and without staging at kSmallChunk, then the
// large, odd-chunk and step-space worlds. With ALGORITHMS_TEST_WORLDS=sanitizer (the
// ThreadSanitizer run, which is 5-15 times slower), only the worlds that reach a code path
// of their own: the step-space worlds (the chunked exchanges of the others, thousands of
// times over, for the tag-step arithmetic the plain run checks) and n=8 (n=4's pattern with
// one more level) are left out. Both selections reach the same lines and branches of
// csrc/collectives, tests/cpp/inproc and transports/shm (gcov; docs/testing.md).
std::vector<WorldShape> worldShapes();

// Element counts (or bytes) per rank: empty, one, not divisible by the world, several chunks.
std::vector<size_t> smallCounts(int n);

// Runs one case on every rank of the world; false once the world has failed (the case was
// skipped or failed).
using RunCase = std::function<bool(const std::string& label, const inproc::ThreadWorld::Job& job)>;
using Cases = std::function<void(inproc::ThreadWorld& world, const WorldShape& shape,
                                 const RunCase& run)>;

// Runs `cases` in a world of every shape with `op` forced to `algorithm`. A world stops at its
// first failed case (later ones would only repeat it, or wait for peers that gave up), and
// the group at its first timeout (each further world would wait out the deadline again).
void sweep(algo::Op op, algo::Algorithm algorithm, const Cases& cases);

// What a reduction's result is compared as: its bytes, up to the sign of zeros.
std::function<std::string(std::string)> valuesOf(DType d);
std::string caseLabel(DType d, ReduceKind op, size_t count);

struct ReduceCase {
  DType dtype;
  ReduceKind op;
  size_t count;
};

// The reducing ops' cases for one world: two common dtype/op pairs at every small count, then
// every pair the kernels have at one uneven count; or one long count in a large or
// step-space world.
std::vector<ReduceCase> reduceCases(const WorldShape& shape);

// Roots to try: the first, the last and one in the middle (only the last for the long
// messages of the step-space worlds).
std::vector<int> roots(const WorldShape& shape);

// Message sizes of the ops that only move bytes.
std::vector<size_t> byteSizes(const WorldShape& shape);

}  // namespace ucxb::algotest
