// reduce_scatter: a ring that never modifies the inputs and needs two chunks of scratch
// (bandwidth), and recursive halving over a working copy (latency; small messages only).
#include <cstring>
#include <memory>
#include <string>

#include "csrc/collectives/building_blocks.h"

namespace ucxb::algo {

using namespace detail;

namespace {

// Chunk k of every block travels round the ring on its own: in step s a rank receives the
// partial sum of block (r-s-2) from the left into a scratch slot, folds in its own input, and
// forwards that slot in step s+1 while receiving into the other slot. The last step receives
// block r straight into `out`.
void ring(Comm& c, const std::vector<const uint8_t*>& blocks, uint8_t* out, size_t blockCount,
          const Reduction& red) {
  const int n = c.size();
  const int r = c.rank();
  const size_t esz = red.elementSize;
  const size_t chunk = chunkElems(c, blockCount, esz, kStepSpace / static_cast<size_t>(n - 1));
  const size_t chunks = chunksOf(blockCount, chunk);
  // Slots alternate by ring step, not by chunk: two whenever the ring is longer than three.
  const size_t slotBytes = slotElems(blockCount, chunk) * esz;
  uint8_t* slots = n > 2 ? c.scratch(2 * slotBytes) : nullptr;
  for (size_t k = 0; k < chunks; ++k) {
    const size_t off = k * chunk * esz;
    const size_t bytes = piece(blockCount, chunk, k) * esz;
    const uint32_t last = k + 1 == chunks ? kLastChunk : 0;
    const uint8_t* sendFrom = blockCount ? blocks[mod(r - 1, n)] + off : nullptr;
    for (int s = 0; s < n - 1; ++s) {
      const int recvBlock = mod(r - s - 2, n);
      uint8_t* into = s == n - 2 ? out + off : slots + (s % 2) * slotBytes;
      const uint32_t step = static_cast<uint32_t>(k * (n - 1) + s) | last;
      auto rq = c.recv(mod(r - 1, n), step, blockCount ? into : nullptr, bytes);
      auto sq = c.send(mod(r + 1, n), step, sendFrom, bytes);
      c.wait({rq, sq});
      if (bytes) c.reduce(red, into, blocks[recvBlock] + off, bytes / esz);
      sendFrom = into;
    }
  }
}

// Recursive halving over a copy of the input (size proportional to the message, which is
// why the automatic choice uses it only below kReduceScatterHalvingMax; the copy is kept in
// the group's scratch pool). Non-powers of two fold as in all_reduce; a participant standing
// for two ranks hands the even one its block.
void recursiveHalving(Comm& c, const std::vector<const uint8_t*>& blocks, uint8_t* out,
                      size_t blockCount, const Reduction& red) {
  const int n = c.size();
  const size_t esz = red.elementSize;
  const size_t blockBytes = blockCount * esz;
  const size_t total = blockCount * n;
  const Pow2Fold f(c.rank(), n);
  const size_t chunk =
      chunkElems(c, total, esz, kStepSpace / static_cast<size_t>(f.levels() + 2));
  // The copy lives in the group's pooled scratch, after the two slots exchangeReduce uses
  // (it asks for them from the same pool, at its start): no allocation per op.
  // (exchangeReduce's slots for any part of `total` fit pairedSlotElems(total, chunk).)
  const size_t slotBytes = pairedSlotElems(total, chunk) * esz;
  uint8_t* const work = c.scratch(slotBytes + total * esz) + slotBytes;
  for (int b = 0; b < n && blockBytes; ++b) {
    c.copy(work + b * blockBytes, blocks[b], blockBytes);
  }
  const uint32_t perPhase = foldIn(c, f, work, total, chunk, red);
  const int partner = f.foldPartner(c.rank());
  const uint32_t handBack = perPhase * static_cast<uint32_t>(f.levels() + 1);
  if (f.folded()) {
    c.wait({c.recv(partner, handBack, blockBytes ? out : nullptr, blockBytes)});
    return;
  }
  std::vector<size_t> bound;
  for (int p = 0; p <= f.pof2; ++p) bound.push_back(f.firstBlockOf(p) * blockCount);
  halvingReduceScatter(c, f, work, bound, chunk, perPhase, red);
  if (partner >= 0) {
    c.wait({c.send(partner, handBack, blockBytes ? work + partner * blockBytes : nullptr,
                   blockBytes)});
  }
  if (blockBytes) c.copy(out, work + c.rank() * blockBytes, blockBytes);
}

}  // namespace

void reduceScatter(Comm& comm, const std::vector<const void*>& blocks, void* out,
                   size_t blockCount, const Reduction& red) {
  std::vector<const uint8_t*> b;
  for (const void* p : blocks) b.push_back(static_cast<const uint8_t*>(p));
  auto* dst = static_cast<uint8_t*>(out);
  if (comm.size() == 1) {
    if (blockCount) comm.copy(dst, b[0], blockCount * red.elementSize);
    return;
  }
  const size_t bytes = blockCount * red.elementSize * comm.size();
  if (choose(comm.tuning(), Op::kReduceScatter, bytes, comm.size()) ==
      Algorithm::kRecursiveHalving) {
    recursiveHalving(comm, b, dst, blockCount, red);
  } else {
    ring(comm, b, dst, blockCount, red);
  }
}

}  // namespace ucxb::algo
