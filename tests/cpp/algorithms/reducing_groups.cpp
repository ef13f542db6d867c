// The reducing collectives: all_reduce, reduce_scatter and reduce, every algorithm, each
// result against reducedBytes() (elements.h).
#include <memory>
#include <string>
#include <vector>

#include "csrc/collectives/algorithms.h"
#include "tests/cpp/algorithms/elements.h"
#include "tests/cpp/algorithms/groups.h"
#include "tests/cpp/algorithms/guarded_buffer.h"
#include "tests/cpp/algorithms/sweep.h"

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
