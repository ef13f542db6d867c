// Pieces the algorithms share: chunking of messages into tag steps, the chunked
// send-while-receive-and-reduce exchange, block splitting, and the power-of-two fold that
// lets log-step algorithms run on any group size. Internal to csrc/collectives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "csrc/collectives/algorithms.h"

namespace ucxb::algo::detail {

inline int mod(int a, int n) { return ((a % n) + n) % n; }

// A message's last chunk carries this bit in its tag step. Ranks that disagree on a
// message's size then disagree on which chunk is last, so the chunks do not match and the op
// fails (at the latest at its timeout) instead of returning a partial result.
constexpr uint32_t kLastChunk = uint32_t{1} << 15;
// Step numbers an op may use below kLastChunk.
constexpr size_t kStepSpace = kLastChunk;
// Added to the step of a message sent whole, unchunked and unstaged: staged notices and
// credits use steps below kStepSpace, so a rank that stages a message (the ranks disagree
// on its length) can never have a 16-byte notice taken for a peer's whole message.
constexpr uint32_t kWholeMessage = kLastChunk;

// Elements per chunk: the group's chunk size, or more when `count` would otherwise need more
// than `maxChunks` chunks (each chunk takes one tag step).
size_t chunkElems(const Tuning& tuning, size_t count, size_t esz, size_t maxChunks);
inline size_t chunkElems(const Comm& c, size_t count, size_t esz, size_t maxChunks) {
  return chunkElems(c.tuning(), count, esz, maxChunks);
}

// A 0-element message still travels, so ranks that disagree on sizes find out.
inline size_t chunksOf(size_t count, size_t chunk) {
  return count == 0 ? 1 : (count + chunk - 1) / chunk;
}

// Elements of one receive slot for a `count`-element message in `chunk`-element chunks: a
// chunk, or the whole message where it is shorter (at least one element, so that a slot has
// an address). Slots are sized by the message, not the chunk alone: a CUDA op's scratch is
// lent at issue at this size (scratch_size.cpp), and a 4-byte op in 64 MiB device chunks must
// not hold two chunks of device memory.
inline size_t slotElems(size_t count, size_t chunk) {
  return std::max<size_t>(1, std::min(count, chunk));
}

// Elements of exchangeReduce's two slots, chunk k in slot k % 2 at k * chunk: two chunks, or
// the one slot where the message is a single chunk.
inline size_t pairedSlotElems(size_t count, size_t chunk) {
  return chunksOf(count, chunk) > 1 ? 2 * chunk : slotElems(count, chunk);
}

// Elements in chunk k of a `total`-element message.
inline size_t piece(size_t total, size_t chunk, size_t k) {
  const size_t start = k * chunk;
  return start >= total ? 0 : (total - start < chunk ? total - start : chunk);
}

// Tag step of chunk k of a `chunks`-chunk message starting at `firstStep`.
inline uint32_t chunkStep(uint32_t firstStep, size_t k, size_t chunks) {
  return firstStep + static_cast<uint32_t>(k) + (k + 1 == chunks ? kLastChunk : 0);
}

// Sends `sendCount` elements of `src` to `to` while receiving `recvCount` from `from` and
// folding them into `dst`, chunk by chunk through two scratch slots (receiving and sending
// chunk k+1 overlap reducing chunk k). Chunk k travels with step chunkStep(firstStep, k,
// ...). Either direction may be absent (peer -1). `src` may equal `dst`: chunk k is folded
// only after it was sent. Uses at most chunksOf(max(sendCount, recvCount), chunk) steps.
// Where the transport folds (Comm::recvFolded) and `src` and `dst` do not overlap, the chunks
// are folded as they arrive instead, without the slots; the messages are the same.
void exchangeReduce(Comm& c, int to, const uint8_t* src, size_t sendCount, int from,
                    uint8_t* dst, size_t recvCount, size_t chunk, uint32_t firstStep,
                    const Reduction& red);

// Sends `count` elements of `data` to `to` in chunks (steps as in exchangeReduce).
void sendChunked(Comm& c, int to, const uint8_t* data, size_t count, size_t esz, size_t chunk,
                 uint32_t firstStep);

// What a rank that folds its peer's vector into its own, while the peer folds this rank's into
// its own, folds with: the higher rank of the two keeps the peer's value where the two compare
// equal (findReduceTiesToIn, and `swapped` for a memory that reduces without fn), so that both
// compute the lower rank's value op the higher's, bit for bit (MIN and MAX of -0 and +0). It
// relies on the Reduction's dtype and kind, which makeReduction sets together with its kernel.
inline Reduction lowerFirst(Reduction red, int me, int peer) {
  if (peer < me) {
    red.fn = findReduceTiesToIn(red.dtype, red.kind);
    red.swapped = true;
  }
  return red;
}

struct Blocks {
  std::vector<size_t> offset;  // elements
  std::vector<size_t> count;   // elements
  size_t largest = 0;
};

// n nearly equal blocks; the first count % n blocks get one extra element.
Blocks split(size_t count, int n);

// Log-step algorithms want a power-of-two group. With n = pof2 + rem, the first 2*rem ranks
// pair up: each even one hands its data to the odd one above it and sits out ("folded"); the
// pof2 remaining ranks ("participants") run the algorithm and the odd ones hand the result
// back. Participant p is old rank oldRank(p).
struct Pow2Fold {
  int pof2 = 1;
  int rem = 0;
  int participant = -1;  // this rank's participant number; -1 when folded

  Pow2Fold(int rank, int n);
  int oldRank(int p) const { return p < rem ? 2 * p + 1 : p + rem; }
  // Old ranks represented by participants [0, p): participant p's first old rank's block.
  int firstBlockOf(int p) const { return p < rem ? 2 * p : p + rem; }
  bool folded() const { return participant < 0; }
  // The partner this rank folds with (-1 when it is not among the first 2*rem).
  int foldPartner(int rank) const;
  int levels() const;  // log2(pof2)
};

}  // namespace ucxb::algo::detail

namespace ucxb::algo::detail {

// Ring all-gather over n blocks of `data` (block b at offset[b], count[b] elements): rank r
// starts with block r final; step s forwards block r-s and receives block r-s-1 in place.
// Uses n-1 steps from firstStep, or n-1 staged exchanges' steps (staged_path.h) through the
// group's shared-memory slots when it has them and they fit below kStepSpace.
void ringAllgather(Comm& c, const std::vector<uint8_t*>& blocks, const std::vector<size_t>& bytes,
                   uint32_t firstStep);

// The fold's first phase (steps 0..chunksOf(count, chunk)-1): a folded rank sends its
// `count` elements to its partner, which reduces them into its own. A no-op for ranks
// outside the first 2*rem. Returns the steps the phase takes, the first step of the next.
uint32_t foldIn(Comm& c, const Pow2Fold& fold, uint8_t* data, size_t count, size_t chunk,
                const Reduction& red);

// Recursive halving among the participants of `fold`: participant p ends up holding the
// reduction of elements [bound[p], bound[p+1]) of `data` (bound has pof2+1 entries). Returns
// the steps used from firstStep.
uint32_t halvingReduceScatter(Comm& c, const Pow2Fold& fold, uint8_t* data,
                              const std::vector<size_t>& bound, size_t chunk, uint32_t firstStep,
                              const Reduction& red);

// The inverse exchange pattern: afterwards every participant holds all of [bound[0],
// bound[pof2]). Uses fold.levels() steps from firstStep.
void doublingAllgather(Comm& c, const Pow2Fold& fold, uint8_t* data,
                       const std::vector<size_t>& bound, size_t esz, uint32_t firstStep);

}  // namespace ucxb::algo::detail
