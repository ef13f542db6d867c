#include "tests/cpp/algorithms/sweep.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/cpp/algorithms/elements.h"
#include "tests/cpp/check.h"

namespace ucxb::algotest {

using algo::Algorithm;
using algo::Op;
using inproc::ThreadWorld;
using inproc::WorldOptions;

namespace {

// An op's deadline: 5 s, or ALGORITHMS_TEST_TIMEOUT_S seconds (slow builds such as
// ThreadSanitizer's run the thousands of one-byte chunks ten times slower).
std::chrono::milliseconds opTimeout() {
  const char* seconds = std::getenv("ALGORITHMS_TEST_TIMEOUT_S");
  return std::chrono::seconds(seconds != nullptr ? std::atoi(seconds) : 5);
}

// ALGORITHMS_TEST_WORLDS: unset or "all", or "sanitizer" (see worldShapes).
bool sanitizerWorlds() {
  const char* worlds = std::getenv("ALGORITHMS_TEST_WORLDS");
  if (worlds == nullptr || std::string(worlds) == "all") return false;
  if (std::string(worlds) == "sanitizer") return true;
  std::fprintf(stderr, "ALGORITHMS_TEST_WORLDS=%s: expected all or sanitizer\n", worlds);
  std::exit(2);
}

}  // namespace

std::vector<WorldShape> worldShapes() {
  const bool sanitizer = sanitizerWorlds();
  std::vector<WorldShape> shapes;
  for (int n : kWorldSizes) {
    if (sanitizer && n == 8) continue;
    shapes.push_back({n, false, kSmallChunk, false});
    if (n > 1) shapes.push_back({n, true, kSmallChunk, false});
    // Device memory that the transport cannot carry (udp's CUDA path), odd and even groups.
    if (n == 2 || n == 3) shapes.push_back({n, false, kSmallChunk, true});
    // A transport that folds as the pieces arrive (ucx: transports/ucx/fold_receive.h).
    if (n == 2 || n == 3) shapes.push_back({n, false, kSmallChunk, false, true});
  }
  for (int n : kLargeWorldSizes) {
    shapes.push_back({n, false, kLargeChunk, false});
    shapes.push_back({n, true, kLargeChunk, false});
  }
  shapes.push_back({2, false, kLargeChunk, false, true});
  for (int n : kOddChunkWorldSizes) shapes.push_back({n, false, kOddChunk, false});
  if (sanitizer) return shapes;
  for (int n : kStepSpaceWorldSizes) shapes.push_back({n, false, kOneByteChunk, false});
  return shapes;
}

std::vector<size_t> smallCounts(int n) {
  return {0, 1, static_cast<size_t>(n + 1), static_cast<size_t>(13 * n + 3), 257};
}

void sweep(Op op, Algorithm algorithm, const Cases& cases) {
  bool timedOut = false;
  for (const WorldShape& shape : worldShapes()) {
    if (timedOut) {
      std::printf("  skipped %s after a timeout\n", shape.label().c_str());
      continue;
    }
    WorldOptions options;
    options.size = shape.size;
    options.staged = shape.staged;
    options.bounced = shape.bounced;
    options.folds = shape.folds;
    options.tuning.chunkBytes = shape.chunkBytes;
    options.tuning.forced[static_cast<size_t>(op)] = algorithm;
    options.opTimeout = opTimeout();
    ThreadWorld world(options);
    bool failed = false;
    auto run = [&](const std::string& label, const ThreadWorld::Job& job) {
      if (failed) return false;
      const std::string report = world.run(job);
      CHECK_MSG(report.empty(), shape.label() + " " + label + ":\n" + report);
      failed = !report.empty();
      timedOut = check::contains(report, "no progress before the timeout");
      return !failed;
    };
    cases(world, shape, run);
  }
}

std::function<std::string(std::string)> valuesOf(DType d) {
  return [d](std::string bytes) { return algotest::withPositiveZeros(d, std::move(bytes)); };
}

std::string caseLabel(DType d, ReduceKind op, size_t count) {
  return std::string(dtypeName(d)) + " " + reduceName(op) + " count=" + std::to_string(count);
}

std::vector<ReduceCase> reduceCases(const WorldShape& shape) {
  std::vector<ReduceCase> cases;
  if (shape.stepSpace()) return {{DType::kInt32, ReduceKind::kSum, kStepSpaceCount}};
  if (shape.large()) {
    cases.push_back({DType::kInt32, ReduceKind::kSum, kLargeBytes / 4 + 3});
    cases.push_back({DType::kFloat64, ReduceKind::kMax, kLargeBytes / 8 + 1});
    return cases;
  }
  for (size_t count : smallCounts(shape.size)) {
    cases.push_back({DType::kInt32, ReduceKind::kSum, count});
    cases.push_back({DType::kUInt8, ReduceKind::kBxor, count});
  }
  for (DType d : kAllDTypes) {
    for (ReduceKind op : kAllOps) {
      if (findReduce(d, op) != nullptr) {
        cases.push_back({d, op, static_cast<size_t>(2 * shape.size + 3)});
      }
    }
  }
  return cases;
}

std::vector<int> roots(const WorldShape& shape) {
  const int n = shape.size;
  if (shape.stepSpace()) return {n - 1};
  std::vector<int> r = {0, n - 1, n / 2};
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

std::vector<size_t> byteSizes(const WorldShape& shape) {
  if (shape.stepSpace()) return {kStepSpaceBytes};
  if (shape.large()) return {kLargeBytes};
  return smallCounts(shape.size);
}

}  // namespace ucxb::algotest
