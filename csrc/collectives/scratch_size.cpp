#include "csrc/collectives/scratch_size.h"

#include <algorithm>

#include "csrc/collectives/building_blocks.h"

namespace ucxb::algo {

using namespace detail;

namespace {

// chunkElems as the algorithm's call site computes it, at the chunk size the site reads: the
// larger of the host's and the device's, so that the bound holds whichever a site takes.
size_t chunkAt(const Tuning& tuning, bool deviceMemory, size_t count, size_t esz,
               size_t maxChunks) {
  Tuning t = tuning;
  t.chunkBytes = std::max(chunkBytesFor(tuning, false), chunkBytesFor(tuning, deviceMemory));
  return chunkElems(t, count, esz, maxChunks);
}

// The log-step algorithms' chunk (DoublingSchedule, rabenseifner, recursiveHalving): one tag
// step per chunk in each of levels + 2 phases.
size_t logStepChunk(const Tuning& t, bool device, size_t count, size_t esz, int n) {
  const Pow2Fold fold(0, n);
  return chunkAt(t, device, count, esz, kStepSpace / static_cast<size_t>(fold.levels() + 2));
}

}  // namespace

size_t scratchBytes(const Tuning& tuning, Op op, size_t count, size_t esz, int n,
                    bool deviceMemory) {
  if (n <= 1) return 0;
  const bool dev = deviceMemory;
  switch (op) {
    case Op::kAllreduce: {
      // choose()'s algorithm, each folding through exchangeReduce's two slots. The postable
      // one-chunk recursive doubling (its whole vector in scratch, within one of its chunks)
      // runs only where choose() answers recursive doubling too.
      switch (choose(tuning, op, count * esz, n, dev)) {
        case Algorithm::kRecursiveDoubling:
        case Algorithm::kRabenseifner:
          return 2 * logStepChunk(tuning, dev, count, esz, n) * esz;
        default: {  // the ring's reduce-scatter phase, chunked by its largest block
          const size_t perStep =
              (kStepSpace - std::min<size_t>(kStepSpace, static_cast<size_t>(n))) /
              static_cast<size_t>(std::max(1, n - 1));
          const size_t largest = (count + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
          return 2 * chunkAt(tuning, dev, largest, esz, perStep) * esz;
        }
      }
    }
    case Op::kReduce:
      // chainReduce's two slots, binomialReduce's accumulator and slot (or the root's
      // exchangeReduce), each at its own chunking.
      if (choose(tuning, op, count * esz, n) == Algorithm::kChain) {
        return 2 * chunkAt(tuning, dev, count, esz, kStepSpace) * esz;
      }
      return 2 * chunkAt(tuning, dev, count, esz, kStepSpace / 32) * esz;
    case Op::kReduceScatter: {
      const size_t block = count / static_cast<size_t>(n);
      if (choose(tuning, op, count * esz, n) == Algorithm::kRecursiveHalving) {
        // Two slots, then the working copy of the whole input after them.
        return 2 * logStepChunk(tuning, dev, count, esz, n) * esz + count * esz;
      }
      if (n <= 2) return 0;  // the ring of two receives straight into the output
      return 2 * chunkAt(tuning, dev, block, esz, kStepSpace / static_cast<size_t>(n - 1)) * esz;
    }
    default:
      return 0;
  }
}

}  // namespace ucxb::algo
