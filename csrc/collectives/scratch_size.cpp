#include "csrc/collectives/scratch_size.h"

#include <algorithm>

#include "csrc/collectives/algorithms.h"
#include "csrc/collectives/building_blocks.h"

namespace ucxb::algo {

using namespace detail;

namespace {

// The log-step algorithms' chunk (DoublingSchedule, rabenseifner, recursiveHalving): one tag
// step per chunk in each of levels + 2 phases.
size_t logStepChunk(const Tuning& t, size_t count, size_t esz, int n) {
  const Pow2Fold fold(0, n);
  return chunkElems(t, count, esz, kStepSpace / static_cast<size_t>(fold.levels() + 2));
}

}  // namespace

size_t scratchBytes(const Tuning& tuning, Op op, size_t count, size_t esz, int n,
                    bool deviceMemory) {
  if (n <= 1) return 0;
  const bool dev = deviceMemory;
  switch (op) {
    case Op::kAllreduce: {
      // The peer-mapped pair under device_peer_map=on folds in the ranks' own buffers and
      // never falls back (peer_map.cpp: it fails instead): nothing to lend. Under auto a rank
      // that cannot map runs the automatic choice below, which needs its scratch.
      if (tuning.peerMap == PeerMapMode::kOn && peerMapApplies(tuning, count * esz, n, dev)) {
        return 0;
      }
      // allreduce(): one exchange posted at once where it fits one chunk (device memory has
      // no staging slots: PostedRecursiveDoubling, the peer's whole vector in scratch; on host
      // memory the slots' posted exchange asks for none), else choose()'s algorithm, each
      // folding through exchangeReduce's two slots (one where the message is one chunk).
      if (allreducePostable(tuning, count, esz, n, /*staging=*/nullptr)) {
        return count * esz;
      }
      switch (choose(tuning, op, count * esz, n, dev)) {
        case Algorithm::kRecursiveDoubling:
        case Algorithm::kRabenseifner:
          return pairedSlotElems(count, logStepChunk(tuning, count, esz, n)) * esz;
        default: {  // the ring's reduce-scatter phase, chunked by its largest block
          const size_t perStep =
              (kStepSpace - std::min<size_t>(kStepSpace, static_cast<size_t>(n))) /
              static_cast<size_t>(std::max(1, n - 1));
          const size_t largest = (count + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
          return pairedSlotElems(largest, chunkElems(tuning, largest, esz, perStep)) * esz;
        }
      }
    }
    case Op::kReduce:
      // chainReduce's two slots, binomialReduce's accumulator and slot (or the root's
      // exchangeReduce, never more), each at its own chunking.
      if (choose(tuning, op, count * esz, n) == Algorithm::kChain) {
        return pairedSlotElems(count, chunkElems(tuning, count, esz, kStepSpace)) * esz;
      }
      return 2 * slotElems(count, chunkElems(tuning, count, esz, kStepSpace / 32)) * esz;
    case Op::kReduceScatter: {
      const size_t block = count / static_cast<size_t>(n);
      if (choose(tuning, op, count * esz, n) == Algorithm::kRecursiveHalving) {
        // Two slots, then the working copy of the whole input after them.
        return pairedSlotElems(count, logStepChunk(tuning, count, esz, n)) * esz + count * esz;
      }
      if (n <= 2) return 0;  // the ring of two receives straight into the output
      return 2 * slotElems(block, chunkElems(tuning, block, esz,
                                             kStepSpace / static_cast<size_t>(n - 1))) * esz;
    }
    default:
      return 0;
  }
}

}  // namespace ucxb::algo
