// The reducing collectives: all_reduce, reduce_scatter and reduce, every algorithm, each
// result against reducedBytes() (elements.h).
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "csrc/collectives/algorithms.h"
#include "csrc/collectives/staged_exchange.h"
#include "tests/cpp/algorithms/elements.h"
#include "tests/cpp/algorithms/groups.h"
#include "tests/cpp/algorithms/guarded_buffer.h"
#include "tests/cpp/algorithms/issue_sized_scratch.h"
#include "tests/cpp/algorithms/sweep.h"
#include "tests/cpp/check.h"

namespace ucxb::algotest {

using algo::Algorithm;
using algo::Op;
using inproc::ThreadWorld;


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
        const IssueSizedScratch sized(c, Op::kAllreduce, k.count, esz);
        algo::allreduce(c, data.data(), k.count, makeReduction(k.dtype, k.op));
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

// The pair slots' exchanges have no credits (staged_exchange.h): rank 1 folds each one 20 ms
// after its notice came, by which time rank 0 has finished that exchange and written its next
// message. Rank 1 must still fold the message of the exchange it is in, and so must rank 0;
// all_reduces that take the credited slots (512 KiB) and the ring (2 MiB) come in between.
void testAllreducePairSlots() {
  inproc::WorldOptions options;
  options.size = 2;
  options.staged = true;
  ThreadWorld world(options);
  const Reduction sum = makeReduction(DType::kInt32, ReduceKind::kSum);
  // Element i of rank r in round k: distinct per round, so a message of another round shows.
  const auto value = [](int rank, int round, size_t i) {
    return static_cast<int32_t>(1000003 * round + 7 * static_cast<int32_t>(i) + rank);
  };
  const auto expected = [&](int round, size_t i) { return value(0, round, i) + value(1, round, i); };
  uint32_t round = 0;
  for (const size_t bytes : {size_t{64} << 10, size_t{64} << 10, size_t{256} << 10,
                             size_t{512} << 10, size_t{64} << 10, size_t{2} << 20,
                             size_t{4} << 10, size_t{64} << 10}) {
    const int k = static_cast<int>(round++);
    const std::string report = world.run([&, k, bytes](Comm& c) -> std::string {
      const size_t count = bytes / sizeof(int32_t);
      std::vector<int32_t> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = value(c.rank(), k, i);
      if (c.staging()->pairFits(bytes)) {
        // Two exchanges in this op: the second is the one rank 0 runs ahead into.
        for (uint32_t half = 0; half < 2; ++half) {
          std::vector<int32_t> mine(count);
          for (size_t i = 0; i < count; ++i) mine[i] = value(c.rank(), k + 100 * half, i);
          algo::detail::PostedStagedExchange ex(c, 1 - c.rank(),
                                                reinterpret_cast<const uint8_t*>(mine.data()),
                                                bytes, sizeof(int32_t), half,
                                                PieceSize::kCacheSized);
          c.wait(ex.notices());
          if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
          c.wait(ex.consume(c, reinterpret_cast<uint8_t*>(mine.data()), &sum));
          for (size_t i = 0; i < count; ++i) {
            if (mine[i] != expected(k + 100 * static_cast<int>(half), i)) {
              return "pair exchange " + std::to_string(half) + " of " + std::to_string(bytes) +
                     " bytes: element " + std::to_string(i) + " is " + std::to_string(mine[i]) +
                     ", want " + std::to_string(expected(k + 100 * static_cast<int>(half), i));
            }
          }
        }
        return "";
      }
      algo::allreduce(c, data.data(), count, sum);
      for (size_t i = 0; i < count; ++i) {
        if (data[i] != expected(k, i)) {
          return std::to_string(bytes) + "-byte all_reduce: element " + std::to_string(i) +
                 " is " + std::to_string(data[i]) + ", want " + std::to_string(expected(k, i));
        }
      }
      return "";
    });
    CHECK_MSG(report.empty(), "round " + std::to_string(k) + ":\n" + report);
  }
}

// The 2-rank staged ring in one pass (stagedPairAllreduce) answers no piece with a credit:
// a rank reuses a slot once the peer's notice of a later piece shows that the peer has read
// it. Rank 1 folds each piece 2 ms late, so rank 0 always runs ahead as far as the notices
// let it; a rank that wrote a slot again too early would hand rank 1 the wrong piece.
// Uneven blocks (one more element in block 0) and a 1 MiB all_reduce through the credited
// slots and a 64 KiB one through the pair slots in between, so that each op finds the slots
// free that the one before used.
namespace {

thread_local bool slowFolds = false;

void slowSumInt32(void* acc, const void* in, size_t count) {
  if (slowFolds) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto* a = static_cast<int32_t*>(acc);
  const auto* b = static_cast<const int32_t*>(in);
  for (size_t i = 0; i < count; ++i) a[i] += b[i];
}

}  // namespace

void testAllreduceFusedPairSlowPeer() {
  inproc::WorldOptions options;
  options.size = 2;
  options.staged = true;
  ThreadWorld world(options);
  Reduction slowSum = makeReduction(DType::kInt32, ReduceKind::kSum);
  slowSum.fn = slowSumInt32;
  const auto value = [](int rank, int round, size_t i) {
    return static_cast<int32_t>(1000003 * round + 7 * static_cast<int32_t>(i) + rank);
  };
  int round = 0;
  for (const size_t count : {size_t{(2 << 20) / 4 + 1}, size_t{(1 << 20) / 4},
                             size_t{(3 << 20) / 4 + 1}, size_t{(64 << 10) / 4},
                             size_t{(2 << 20) / 4 + 1}}) {
    const int k = round++;
    const std::string report = world.run([&, k, count](Comm& c) -> std::string {
      std::vector<int32_t> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = value(c.rank(), k, i);
      slowFolds = c.rank() == 1;
      algo::allreduce(c, data.data(), count, slowSum);
      slowFolds = false;
      for (size_t i = 0; i < count; ++i) {
        const int32_t want = value(0, k, i) + value(1, k, i);
        if (data[i] != want) {
          return std::to_string(count) + "-element all_reduce: element " + std::to_string(i) +
                 " is " + std::to_string(data[i]) + ", want " + std::to_string(want);
        }
      }
      return "";
    });
    CHECK_MSG(report.empty(), "round " + std::to_string(k) + ":\n" + report);
  }
}

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
        const IssueSizedScratch sized(c, Op::kReduceScatter, blockCount * n, esz);
        algo::reduceScatter(c, blocks, out.data(), blockCount, makeReduction(k.dtype, k.op));
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
            const IssueSizedScratch sized(c, Op::kReduce, k.count, esz);
            algo::reduce(c, in.data(), dst, k.count, makeReduction(k.dtype, k.op), root);
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

}  // namespace ucxb::algotest
