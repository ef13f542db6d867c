// The send-while-receive exchange of exchangeReduce, through the group's shared-memory slots
// (engine/staging_area.h) instead of the transport's data path; whether a message takes it
// is planStaged's answer (staged_path.h, which explains the layer). Internal to
// csrc/collectives.
//
// Piece k of a message (StagingArea::pieceBytes long, the last one shorter) travels as: the
// sender copies it into its own slot k % slots, then
// sends a 16-byte notice (its length and the message's total) with step firstStep + 2k; the
// receiver folds or copies it straight out of that slot and answers with an empty credit,
// step firstStep + 2k + 1, after which the sender may reuse the slot. The notices and
// credits are ordinary tag messages, so deadlines, peer failures and cancellation behave as
// on the transport path; only the bulk bytes bypass it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "csrc/collectives/algorithms.h"
#include "csrc/collectives/building_blocks.h"

namespace ucxb::algo::detail {

// The 16-byte notice that announces a piece in its sender's slot.
struct StagedNotice {
  uint64_t bytes;  // in this piece's slot
  uint64_t total;  // of the whole message: ranks that disagree on it fail, not corrupt
};

// A receiver whose sender's notice announces a message of another length than it expects
// fails at once, and tells the sender so with this message (step kRefusedStep, from the
// receiver): the sender waits for credits that now never come, and in a one-way exchange (a
// broadcast's parent) it has nothing else to learn the mismatch from before the op's
// timeout. A sender that has nothing else to wait on listens for it with refusalWire.
struct StagedRefusal {
  uint64_t expected;  // bytes the receiver expected
};
// Above every step of a staged exchange's notices and credits (below kStepSpace) and of a
// whole message (kWholeMessage + a few): a refusal is never taken for either. It is also the
// step of a last chunk 32767 (chunkStep: a message of 32768 chunks), but the one rank that
// listens for a refusal, a staged broadcast's parent, gets no chunk from the child it listens
// to.
constexpr uint32_t kRefusedStep = kWholeMessage + kStepSpace - 1;

// Sends `from` the refusal of its staged message (we expected `expected` bytes) and waits for
// it to leave, until the op's deadline at most. Never throws: the caller is failing already,
// with its own error.
void refuseStaged(Comm& c, int from, size_t expected) noexcept;

// A tripwire (Comm::tripwire) for `to`'s refusal of this rank's `sendBytes`-byte staged
// message, read into `into`: once it arrives, every pending request of the op is cancelled
// and its wait() throws an error naming both lengths. Post it before the exchange, abandon it
// (Comm::abandon) once the exchange has returned or thrown; `into` outlives it.
RequestPtr refusalWire(Comm& c, int to, size_t sendBytes, StagedRefusal& into);
// Whether `to`'s refusal, caught by refusalWire, is what failed this op: `to` then refused at
// our first notice and reads none of our slots. Any other tripwire for `to` (another path's
// message from it: a mismatch in the other direction) says nothing of what it reads.
bool refusedBy(const Comm& c, int to);

// Sends `sendBytes` of `src` to `to` while receiving `recvBytes` from `from` into `dst`:
// folded into it with `red`, or copied when `red` is null. Either direction may be absent
// (peer -1). `pieces` and the steps it uses from firstStep are those of planStaged's plan
// for the longer direction (staged_path.h). A sender and receiver that disagree on the
// length fail with OpFailed naming both lengths; the receiver refuses the message
// (refuseStaged) before it throws. An exchange that fails while `to` may still
// read this rank's slots retires them (StagingArea::retire): every later staged exchange of
// the group fails with that reason.
void stagedExchange(Comm& c, int to, const uint8_t* src, size_t sendBytes, int from, uint8_t* dst,
                    size_t recvBytes, uint32_t firstStep, const Reduction* red, PieceSize pieces);

// A 2-rank all_reduce through the slots in one pass, in place over `data`: rank r reduces
// block r (`mine`, `mineBytes` at `data + mineOffset`) and the peer block 1 - r (`theirs`).
// The ring would take two phases, a reduce-scatter (copy `theirs` into a slot, fold the
// peer's copy of `mine` out of its slot) and then an all-gather (copy the reduced `mine`
// into a slot, copy the peer's reduced `theirs` out of its slot). Here each reduced piece
// goes into a slot while it is still in cache from the fold, and the peer copies it out
// one piece later: every byte of `data` is read from memory once and written once, where
// the ring reads `mine` again for the all-gather (and, beyond the caches, `theirs` again
// before writing it), and the op never waits for a phase to end.
//
// Piece k of either block (the plan's pieces) goes through slot k % kFusedDepth (raw) or
// kFusedDepth + k % kFusedDepth (reduced), announced by a notice (steps firstStep + 2k and
// firstStep + 2k + 1). No credit answers a piece: a rank writes slot s again for piece
// k + kFusedDepth only after it has received a notice that the peer sends only once it has
// read piece k: its reduced piece k (sent after folding our raw piece k) for a raw slot, its
// raw piece k + 2 (sent after copying out our reduced piece k) for a reduced one. One empty
// `done` message each way (step firstStep + 2 * pieces) ends the op, after which the peer
// reads no slot of this rank's. Each element is folded on one rank (own op peer's, as the
// ring's reduce-scatter folds) and copied to the other, so both end bit-identical. Needs
// 2 * kFusedDepth slots (pairFusedFits) and 2 steps per piece of the longer block plus one
// from firstStep. An op that fails after announcing a piece and before the peer's `done`
// retires the slots, as stagedExchange does.
constexpr size_t kFusedDepth = 2;
bool pairFusedFits(const StagingArea& staging);
void stagedPairAllreduce(Comm& c, uint8_t* data, size_t mineOffset, size_t mineBytes,
                         size_t theirsOffset, size_t theirsBytes, uint32_t firstStep,
                         const Reduction& red, PieceSize pieces);

// stagedExchange with one peer both ways, for a message that fits the slots at once (no
// piece waits for a credit), split where it waits: for the posted all_reduce (PostedOp),
// which the backend may drive on the caller's thread. Both ranks of an exchange run this
// class (they decide alike: same group, same length), in one of two ways:
// - a message that fits a pair slot (StagingArea::pairFits: one cache-sized piece, in a
//   2-rank group) goes through the pair slots with one notice each way and no credits: the
//   exchange waits for the peer once. The peer's notice of the next pair exchange is what
//   frees this one's slot (StagingArea::takePairSlot says why that suffices).
// - any other goes through the slots with the messages and steps of stagedExchange(c, peer,
//   src, bytes, peer, dst, bytes, firstStep, red, pieces): a notice and a credit per piece,
//   and it ends when the peer's credits have come.
class PostedStagedExchange {
 public:
  // Whether `bytes` of `elementSize`-byte elements fit the slots at once.
  static bool fits(const StagingArea& staging, size_t bytes, size_t elementSize,
                   PieceSize pieces);
  // Posts the receives of the peer's notices, copies `src` into this rank's slots, sends the
  // notices and posts the receives of the credits. Throws OpFailed if the slots are retired.
  PostedStagedExchange(Comm& c, int peer, const uint8_t* src, size_t bytes, size_t elementSize,
                       uint32_t firstStep, PieceSize pieces);
  // An exchange that ends with a credit outstanding (it failed) retires the slots, as
  // stagedExchange does.
  ~PostedStagedExchange();
  PostedStagedExchange(const PostedStagedExchange&) = delete;
  PostedStagedExchange& operator=(const PostedStagedExchange&) = delete;

  // What the first half waits for: the peer's notices.
  const std::vector<RequestPtr>& notices() const { return notices_; }
  // Once the notices have arrived: folds the peer's pieces into `dst` with `red` (copies them
  // when null), answers each with a credit and returns what the exchange waits for last (the
  // peer's credits, so that the slots are free for the next exchange, and its own sends;
  // through a pair slot: its own notice only).
  // Throws OpFailed when the peer's message has another length.
  std::vector<RequestPtr> consume(Comm& c, uint8_t* dst, const Reduction* red);

 private:
  // The constructor's work: posts the notices' receives, fills the slots, sends the notices.
  void post(Comm& c, const uint8_t* src);

  StagingArea& staging_;
  const int peer_;
  const int rank_;
  const size_t bytes_;
  const size_t piece_;
  const uint32_t firstStep_;
  const bool paired_;      // through a pair slot, without credits
  size_t pairSlot_ = 0;    // which one, when paired_
  std::vector<StagedNotice> sent_;
  std::vector<StagedNotice> arrived_;
  std::vector<RequestPtr> notices_;
  std::vector<RequestPtr> credits_;
  std::vector<RequestPtr> small_;
  bool consumed_ = false;
};

}  // namespace ucxb::algo::detail
