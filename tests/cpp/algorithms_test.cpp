// Every collective algorithm of csrc/collectives, run on threads of this one process over the
// in-memory transport (tests/cpp/inproc/), at world sizes 1-5 and 8, with and without the
// shared-memory staging slots, for uneven sizes (0 elements, 1, not divisible by the world,
// many chunks of a tiny chunk size, 64 KiB+ messages that take the staged paths, messages
// of more one-byte chunks than an op has tag steps) and every dtype x reduce op the kernels
// have. Each result is compared byte for byte with a reference
// computed here (tests/cpp/algorithms/elements.h); memory an op must not write (inputs, the
// bytes around every buffer) is checked too. One group per op x algorithm; built and run by
// tests/test_algorithms_inproc.py (`algorithms_test --list`, `algorithms_test GROUP`).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "csrc/collectives/algorithms.h"
#include "tests/cpp/algorithms/elements.h"
#include "tests/cpp/algorithms/guarded_buffer.h"
#include "tests/cpp/check.h"
#include "tests/cpp/inproc/thread_world.h"
#include "tests/cpp/inproc_transport_checks.h"

namespace {

using namespace ucxb;
using algo::Algorithm;
using algo::Op;
using algotest::compare;
using algotest::GuardedBuffer;
using inproc::ThreadWorld;
using inproc::WorldOptions;

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
  bool large() const { return chunkBytes == kLargeChunk; }
  bool stepSpace() const { return chunkBytes == kOneByteChunk; }
  std::string label() const {
    return "n=" + std::to_string(size) + (staged ? " staged" : "") +
           " chunk=" + std::to_string(chunkBytes);
  }
};

std::vector<WorldShape> worldShapes() {
  std::vector<WorldShape> shapes;
  for (int n : kWorldSizes) {
    shapes.push_back({n, false, kSmallChunk});
    if (n > 1) shapes.push_back({n, true, kSmallChunk});
  }
  for (int n : kLargeWorldSizes) {
    shapes.push_back({n, false, kLargeChunk});
    shapes.push_back({n, true, kLargeChunk});
  }
  for (int n : kOddChunkWorldSizes) shapes.push_back({n, false, kOddChunk});
  for (int n : kStepSpaceWorldSizes) shapes.push_back({n, false, kOneByteChunk});
  return shapes;
}

// Element counts (or bytes) per rank: empty, one, not divisible by the world, several chunks.
std::vector<size_t> smallCounts(int n) {
  return {0, 1, static_cast<size_t>(n + 1), static_cast<size_t>(13 * n + 3), 257};
}

// Runs `cases` in a world of every shape with `op` forced to `algorithm`. A world stops at its
// first failed case (later ones would only repeat it, or wait for peers that gave up), and
// the group at its first timeout (each further world would wait out the deadline again).
using Cases = std::function<void(ThreadWorld& world, const WorldShape& shape,
                                 const std::function<bool(const std::string&, const ThreadWorld::Job&)>& run)>;

// An op's deadline: 5 s, or ALGORITHMS_TEST_TIMEOUT_S seconds (slow builds such as
// ThreadSanitizer's run the thousands of one-byte chunks ten times slower).
std::chrono::milliseconds opTimeout() {
  const char* seconds = std::getenv("ALGORITHMS_TEST_TIMEOUT_S");
  return std::chrono::seconds(seconds != nullptr ? std::atoi(seconds) : 5);
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

algo::Reduction reductionOf(DType d, ReduceKind op) { return {findReduce(d, op), elementSize(d)}; }

// What a reduction's result is compared as: its bytes, up to the sign of zeros.
std::function<std::string(std::string)> valuesOf(DType d) {
  return [d](std::string bytes) { return algotest::withPositiveZeros(d, std::move(bytes)); };
}

std::string caseLabel(DType d, ReduceKind op, size_t count) {
  return std::string(dtypeName(d)) + " " + reduceName(op) + " count=" + std::to_string(count);
}

// The reducing ops' cases for one world: two common dtype/op pairs at every small count, then
// every pair the kernels have at one uneven count; or one count of 64 KiB+ in a large world.
struct ReduceCase {
  DType dtype;
  ReduceKind op;
  size_t count;
};

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

// Roots to try: the first, the last and one in the middle (only the last for the long
// messages of the step-space worlds).
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

// --- all_reduce ------------------------------------------------------------------------------

void allreduceWith(Algorithm a) {
  sweep(Op::kAllreduce, a, [](ThreadWorld& world, const WorldShape& shape, const auto& run) {
    uint32_t salt = 0;
    for (const ReduceCase& k : reduceCases(shape)) {
      ++salt;
      run(caseLabel(k.dtype, k.op, k.count), [&, k, salt](Comm& c) {
        const size_t esz = elementSize(k.dtype);
        GuardedBuffer data(k.count * esz,
                           algotest::inputBytes(k.dtype, k.op, c.rank(), k.count, salt));
        algo::allreduce(c, data.data(), k.count, reductionOf(k.dtype, k.op));
        return compare(data,
                       algotest::reducedBytes(k.dtype, k.op, world.size(), 0, k.count, salt),
                       "result", valuesOf(k.dtype));
      });
    }
  });
}

void testAllreduceRing() { allreduceWith(Algorithm::kRing); }
void testAllreduceRecursiveDoubling() { allreduceWith(Algorithm::kRecursiveDoubling); }
void testAllreduceRabenseifner() { allreduceWith(Algorithm::kRabenseifner); }

// --- reduce_scatter --------------------------------------------------------------------------

void reduceScatterWith(Algorithm a) {
  sweep(Op::kReduceScatter, a, [](ThreadWorld&, const WorldShape& shape, const auto& run) {
    uint32_t salt = 0;
    for (const ReduceCase& k : reduceCases(shape)) {
      ++salt;
      // k.count elements per block: the whole input is n blocks.
      const size_t blockCount =
          shape.large() || shape.stepSpace() ? k.count / static_cast<size_t>(shape.size) : k.count;
      run(caseLabel(k.dtype, k.op, blockCount) + " per block", [&, k, salt, blockCount](Comm& c) {
        const int n = c.size();
        const size_t esz = elementSize(k.dtype);
        const std::string input =
            algotest::inputBytes(k.dtype, k.op, c.rank(), blockCount * n, salt);
        GuardedBuffer in(input.size(), input);
        GuardedBuffer out(blockCount * esz);
        std::vector<const void*> blocks;
        for (int p = 0; p < n; ++p) blocks.push_back(in.data() + p * blockCount * esz);
        algo::reduceScatter(c, blocks, out.data(), blockCount, reductionOf(k.dtype, k.op));
        return compare(out,
                       algotest::reducedBytes(k.dtype, k.op, n, c.rank() * blockCount,
                                              blockCount, salt),
                       "result", valuesOf(k.dtype)) +
               compare(in, input, "input");
      });
    }
  });
}

void testReduceScatterRing() { reduceScatterWith(Algorithm::kRing); }
void testReduceScatterRecursiveHalving() { reduceScatterWith(Algorithm::kRecursiveHalving); }

// --- reduce ----------------------------------------------------------------------------------

void reduceWith(Algorithm a) {
  sweep(Op::kReduce, a, [](ThreadWorld& world, const WorldShape& shape, const auto& run) {
    uint32_t salt = 0;
    for (const ReduceCase& k : reduceCases(shape)) {
      for (int root : roots(shape)) {
        for (bool inPlace : {false, true}) {
          if (inPlace && shape.stepSpace()) continue;
          ++salt;
          const std::string label = caseLabel(k.dtype, k.op, k.count) + " root=" +
                                    std::to_string(root) + (inPlace ? " in place" : "");
          run(label, [&, k, salt, root, inPlace](Comm& c) {
            const size_t esz = elementSize(k.dtype);
            const std::string input =
                algotest::inputBytes(k.dtype, k.op, c.rank(), k.count, salt);
            GuardedBuffer in(input.size(), input);
            GuardedBuffer out(k.count * esz);  // off the root it must stay untouched
            void* dst = inPlace ? static_cast<void*>(in.data()) : out.data();
            algo::reduce(c, in.data(), dst, k.count, reductionOf(k.dtype, k.op), root);
            const std::string want =
                algotest::reducedBytes(k.dtype, k.op, world.size(), 0, k.count, salt);
            if (c.rank() != root) {
              return compare(in, input, "input") +
                     compare(out, std::string(k.count * esz, char(GuardedBuffer::kGuard)),
                             "output off the root");
            }
            return inPlace ? compare(in, want, "result", valuesOf(k.dtype))
                           : compare(out, want, "result", valuesOf(k.dtype)) +
                                 compare(in, input, "input");
          });
        }
      }
      if (shape.large() || shape.stepSpace()) break;  // one long case is enough here
    }
  });
}

void testReduceBinomial() { reduceWith(Algorithm::kBinomial); }
void testReduceChain() { reduceWith(Algorithm::kChain); }

// --- broadcast -------------------------------------------------------------------------------

void broadcastWith(Algorithm a) {
  sweep(Op::kBroadcast, a, [](ThreadWorld&, const WorldShape& shape, const auto& run) {
    uint32_t salt = 0;
    for (size_t bytes : byteSizes(shape)) {
      for (int root : roots(shape)) {
        ++salt;
        run("bytes=" + std::to_string(bytes) + " root=" + std::to_string(root),
            [&, bytes, root, salt](Comm& c) {
              const std::string want = algotest::patternBytes(root, bytes, salt);
              GuardedBuffer data(bytes, c.rank() == root ? want : std::string());
              algo::broadcast(c, data.data(), bytes, root);
              return compare(data, want, c.rank() == root ? "root's data" : "result");
            });
      }
    }
  });
}

void testBroadcastBinomial() { broadcastWith(Algorithm::kBinomial); }
void testBroadcastChain() { broadcastWith(Algorithm::kChain); }

// --- all_gather ------------------------------------------------------------------------------

void allgatherWith(Algorithm a) {
  sweep(Op::kAllgather, a, [](ThreadWorld&, const WorldShape& shape, const auto& run) {
    uint32_t salt = 0;
    for (size_t bytes : byteSizes(shape)) {
      // In place: rank r's input is already outs[r] (all_gather_into_tensor's usual layout).
      for (bool inPlace : {false, true}) {
        if (inPlace && shape.stepSpace()) continue;
        ++salt;
        run("bytes=" + std::to_string(bytes) + (inPlace ? " in place" : ""),
            [&, bytes, inPlace, salt](Comm& c) {
              const int n = c.size();
              const std::string mine = algotest::patternBytes(c.rank(), bytes, salt);
              GuardedBuffer in(bytes, mine);
              std::vector<std::unique_ptr<GuardedBuffer>> outs;
              std::vector<void*> outPtrs;
              for (int p = 0; p < n; ++p) {
                outs.push_back(std::make_unique<GuardedBuffer>(
                    bytes, inPlace && p == c.rank() ? mine : std::string()));
                outPtrs.push_back(outs.back()->data());
              }
              algo::allgather(c, inPlace ? outPtrs[c.rank()] : in.data(), outPtrs, bytes);
              std::string wrong = compare(in, mine, "input");
              for (int p = 0; p < n; ++p) {
                wrong += compare(*outs[p], algotest::patternBytes(p, bytes, salt),
                                 "block of rank " + std::to_string(p));
              }
              return wrong;
            });
      }
    }
  });
}

void testAllgatherRing() { allgatherWith(Algorithm::kRing); }
void testAllgatherBruck() { allgatherWith(Algorithm::kBruck); }
void testAllgatherLinear() { allgatherWith(Algorithm::kLinear); }

// --- gather and scatter (linear at the root; nothing to force) --------------------------------

void testGather() {
  sweep(Op::kAllgather, Algorithm::kAuto, [](ThreadWorld&, const WorldShape& shape,
                                            const auto& run) {
    uint32_t salt = 0;
    for (size_t bytes : byteSizes(shape)) {
      for (int root : roots(shape)) {
        ++salt;
        run("bytes=" + std::to_string(bytes) + " root=" + std::to_string(root),
            [&, bytes, root, salt](Comm& c) {
              const int n = c.size();
              const std::string mine = algotest::patternBytes(c.rank(), bytes, salt);
              GuardedBuffer in(bytes, mine);
              std::vector<std::unique_ptr<GuardedBuffer>> outs;
              std::vector<void*> outPtrs;
              if (c.rank() == root) {
                for (int p = 0; p < n; ++p) {
                  outs.push_back(std::make_unique<GuardedBuffer>(bytes));
                  outPtrs.push_back(outs.back()->data());
                }
              }
              algo::gather(c, in.data(), outPtrs, bytes, root);
              std::string wrong = compare(in, mine, "input");
              for (size_t p = 0; p < outs.size(); ++p) {
                wrong += compare(*outs[p], algotest::patternBytes(static_cast<int>(p), bytes, salt),
                                 "block of rank " + std::to_string(p));
              }
              return wrong;
            });
      }
    }
  });
}

void testScatter() {
  sweep(Op::kAllgather, Algorithm::kAuto, [](ThreadWorld&, const WorldShape& shape,
                                            const auto& run) {
    uint32_t salt = 0;
    for (size_t bytes : byteSizes(shape)) {
      for (int root : roots(shape)) {
        ++salt;
        run("bytes=" + std::to_string(bytes) + " root=" + std::to_string(root),
            [&, bytes, root, salt](Comm& c) {
              const int n = c.size();
              // The root's block for rank p is pattern "rank" 100 + p.
              std::vector<std::unique_ptr<GuardedBuffer>> ins;
              std::vector<const void*> inPtrs;
              if (c.rank() == root) {
                for (int p = 0; p < n; ++p) {
                  ins.push_back(std::make_unique<GuardedBuffer>(
                      bytes, algotest::patternBytes(100 + p, bytes, salt)));
                  inPtrs.push_back(ins.back()->data());
                }
              }
              GuardedBuffer out(bytes);
              algo::scatter(c, inPtrs, out.data(), bytes, root);
              std::string wrong = compare(
                  out, algotest::patternBytes(100 + c.rank(), bytes, salt), "result");
              for (size_t p = 0; p < ins.size(); ++p) {
                wrong += compare(*ins[p],
                                 algotest::patternBytes(100 + static_cast<int>(p), bytes, salt),
                                 "root's block for rank " + std::to_string(p));
              }
              return wrong;
            });
      }
    }
  });
}

// --- all_to_all ------------------------------------------------------------------------------

// Bytes rank `from` sends rank `to`: uneven, zero for some pairs, ~`base` on average.
size_t alltoallBytes(int from, int to, size_t base) {
  if (base == 0) return 0;
  return (base * (1 + static_cast<size_t>((from * 5 + to * 3) % 4))) / 2 -
         static_cast<size_t>((from + to) % 3 == 0 ? base / 2 : 0);
}

void alltoallWith(Algorithm a) {
  sweep(Op::kAlltoall, a, [](ThreadWorld&, const WorldShape& shape, const auto& run) {
    uint32_t salt = 0;
    for (size_t base : byteSizes(shape)) {
      ++salt;
      run("bytes~" + std::to_string(base), [&, base, salt](Comm& c) {
        const int n = c.size();
        const int r = c.rank();
        std::vector<std::unique_ptr<GuardedBuffer>> sends;
        std::vector<std::unique_ptr<GuardedBuffer>> recvs;
        std::vector<const void*> sendPtrs;
        std::vector<void*> recvPtrs;
        std::vector<size_t> sendBytes;
        std::vector<size_t> recvBytes;
        // The pattern of the block from s to d is "rank" s * 64 + d.
        for (int p = 0; p < n; ++p) {
          sendBytes.push_back(alltoallBytes(r, p, base));
          recvBytes.push_back(alltoallBytes(p, r, base));
          sends.push_back(std::make_unique<GuardedBuffer>(
              sendBytes[p], algotest::patternBytes(r * 64 + p, sendBytes[p], salt)));
          recvs.push_back(std::make_unique<GuardedBuffer>(recvBytes[p]));
          sendPtrs.push_back(sends.back()->data());
          recvPtrs.push_back(recvs.back()->data());
        }
        algo::alltoall(c, sendPtrs, sendBytes, recvPtrs, recvBytes);
        std::string wrong;
        for (int p = 0; p < n; ++p) {
          wrong += compare(*recvs[p], algotest::patternBytes(p * 64 + r, recvBytes[p], salt),
                           "block from rank " + std::to_string(p));
          wrong += compare(*sends[p], algotest::patternBytes(r * 64 + p, sendBytes[p], salt),
                           "input block for rank " + std::to_string(p));
        }
        return wrong;
      });
    }
  });
}

void testAlltoallPairwise() { alltoallWith(Algorithm::kPairwise); }
void testAlltoallLinear() { alltoallWith(Algorithm::kLinear); }

// --- barrier ---------------------------------------------------------------------------------

// Round k: one rank (a different one each round) arrives 2 ms late; nobody may leave the
// barrier before every rank has arrived.
void testBarrier() {
  sweep(Op::kAllreduce, Algorithm::kAuto, [](ThreadWorld&, const WorldShape& shape,
                                            const auto& run) {
    if (shape.large() || shape.stepSpace()) return;
    std::atomic<int> arrived{0};
    for (int round = 0; round < 3 * shape.size; ++round) {
      run("round " + std::to_string(round), [&, round](Comm& c) -> std::string {
        if (c.rank() == round % c.size()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        arrived.fetch_add(1);
        algo::barrier(c);
        const int seen = arrived.load();
        if (seen < (round + 1) * c.size()) {
          return "left the barrier after " + std::to_string(seen) + " arrivals, before " +
                 std::to_string((round + 1) * c.size());
        }
        return "";
      });
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  const ucxb::check::Group groups[] = {
      {"inproc_transport", ucxb::inproc_checks::testInprocTransport, true},
      {"comm_errors", ucxb::inproc_checks::testCommErrors, true},
      {"allreduce_ring", testAllreduceRing, true},
      {"allreduce_recursive_doubling", testAllreduceRecursiveDoubling, true},
      {"allreduce_rabenseifner", testAllreduceRabenseifner, true},
      {"reduce_scatter_ring", testReduceScatterRing, true},
      {"reduce_scatter_recursive_halving", testReduceScatterRecursiveHalving, true},
      {"reduce_binomial", testReduceBinomial, true},
      {"reduce_chain", testReduceChain, true},
      {"broadcast_binomial", testBroadcastBinomial, true},
      {"broadcast_chain", testBroadcastChain, true},
      {"all_gather_ring", testAllgatherRing, true},
      {"all_gather_bruck", testAllgatherBruck, true},
      {"all_gather_linear", testAllgatherLinear, true},
      {"gather", testGather, true},
      {"scatter", testScatter, true},
      {"all_to_all_pairwise", testAlltoallPairwise, true},
      {"all_to_all_linear", testAlltoallLinear, true},
      {"barrier", testBarrier, true},
  };
  return ucxb::check::runGroups("algorithms_test", groups, argc, argv);
}
