#include "csrc/collectives/staged_exchange.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "csrc/collectives/building_blocks.h"

namespace ucxb::algo::detail {

namespace {

using Notice = StagedNotice;

uint32_t noticeStep(uint32_t first, size_t k) { return first + static_cast<uint32_t>(2 * k); }
uint32_t creditStep(uint32_t first, size_t k) { return noticeStep(first, k) + 1; }

// Piece k's notice from `from` must describe an `n`-byte piece of a `total`-byte message.
void checkNotice(const Notice& got, size_t total, size_t n, int from) {
  if (got.total != total || got.bytes != n) {
    throw OpFailed("expected " + std::to_string(total) + " bytes from rank " +
                   std::to_string(from) + " but it sent " + std::to_string(got.total) +
                   ": the ranks passed tensors of different sizes");
  }
}

// checkNotice for a stagedExchange, whose sender may wait for nothing but our credits: it
// hears of the mismatch from us (refuseStaged) before we throw.
void acceptNotice(Comm& c, const Notice& got, size_t total, size_t n, int from) {
  if (got.total != total || got.bytes != n) refuseStaged(c, from, total);
  checkNotice(got, total, n, from);
}

// Length of piece k of a `total`-byte message cut into `piece`-byte pieces.
size_t pieceLength(size_t total, size_t piece, size_t k) {
  return std::min(piece, total - std::min(total, k * piece));
}

// Folds an `n`-byte piece out of the peer's slot into `dst` with `red`, or copies it.
void takePiece(uint8_t* dst, const uint8_t* in, size_t n, const Reduction* red) {
  if (red != nullptr) {
    red->fn(dst, in, n / red->elementSize);
  } else {
    std::memcpy(dst, in, n);
  }
}

std::string slotsInUse(int rank, int peer) {
  return "rank " + std::to_string(rank) +
         " stopped using its shared-memory slots after an earlier op failed while rank " +
         std::to_string(peer) +
         " could still read them; destroy this process group and create a new one";
}

bool outstanding(const std::vector<RequestPtr>& credits) {
  return std::any_of(credits.begin(), credits.end(), [](const RequestPtr& r) {
    return r && (r->pending() || r->failed());
  });
}

}  // namespace

void refuseStaged(Comm& c, int from, size_t expected) noexcept {
  static_assert(sizeof(StagedRefusal) == sizeof(uint64_t));
  // The request reads it until it has left, which the wait below sees (or abandons).
  auto refusal = std::make_shared<StagedRefusal>(StagedRefusal{expected});
  try {
    RequestPtr sent = c.send(from, kRefusedStep, refusal.get(), sizeof(StagedRefusal));
    sent->keepAlive(refusal);
    c.wait({sent});
  } catch (...) {
    // Best effort: `from` then learns of it at its timeout, as before; our error stands.
  }
}

RequestPtr refusalWire(Comm& c, int to, size_t sendBytes, StagedRefusal& into) {
  const std::string mine = std::to_string(sendBytes) + " bytes to rank " + std::to_string(to);
  return c.tripwire(to, kRefusedStep, &into, sizeof(into), [mine, &into](const Request&) {
    return "sent " + mine + " through shared memory but it expected " +
           std::to_string(into.expected) + ": the ranks passed tensors of different sizes";
  });
}

bool refusedBy(const Comm& c, int to) { return c.trippedAt(to, kRefusedStep); }

void stagedExchange(Comm& c, int to, const uint8_t* src, size_t sendBytes, int from, uint8_t* dst,
                    size_t recvBytes, uint32_t firstStep, const Reduction* red, PieceSize pieces) {
  StagingArea& st = *c.staging();
  if (!st.retiredBecause().empty()) throw OpFailed(st.retiredBecause());
  const size_t esz = red != nullptr ? red->elementSize : 1;
  // Each direction is cut by its own message's length, as the rank at its other end cuts it.
  const size_t sendPiece = st.pieceBytes(esz, pieces, sendBytes);
  const size_t recvPiece = st.pieceBytes(esz, pieces, recvBytes);
  const size_t slots = st.slots();
  const size_t sendPieces = to >= 0 ? chunksOf(sendBytes, sendPiece) : 0;
  const size_t recvPieces = from >= 0 ? chunksOf(recvBytes, recvPiece) : 0;
  std::vector<Notice> sent(sendPieces);
  std::vector<Notice> arrived(slots);
  std::vector<RequestPtr> credits(sendPieces);  // from `to`: slot of piece k free again
  std::vector<RequestPtr> notices(recvPieces);  // from `from`: piece k is in its slot
  std::vector<RequestPtr> small;                // our own notices and credits, in flight
  auto postNotice = [&](size_t k) {
    notices[k] = c.recv(from, noticeStep(firstStep, k), &arrived[k % slots], sizeof(Notice));
  };
  auto pending = [&] {
    std::vector<RequestPtr> all;
    for (const auto* list : {&credits, &notices, &small}) {
      for (const auto& r : *list) {
        if (r && r->pending()) all.push_back(r);
      }
    }
    return all;
  };
  try {
    for (size_t k = 0; k < std::min(slots, recvPieces); ++k) postNotice(k);
    for (size_t k = 0; k < std::max(sendPieces, recvPieces); ++k) {
      if (k < sendPieces) {
        if (k >= slots) c.wait({credits[k - slots]});
        const size_t n = pieceLength(sendBytes, sendPiece, k);
        st.fillOwnSlot(k, src + k * sendPiece, n);
        sent[k] = Notice{n, sendBytes};
        small.push_back(c.send(to, noticeStep(firstStep, k), &sent[k], sizeof(Notice)));
        // Posted after the notice it answers, and that loses nothing: the transports that
        // stage (ucx, shm; udp never does, permitsSharedMemory) keep a message that comes
        // before its receive as unexpected and match it when the receive is posted, and the
        // credit comes only after `to` has taken the notice and folded the piece.
        credits[k] = c.recv(to, creditStep(firstStep, k), nullptr, 0);
      }
      if (k < recvPieces) {
        c.wait({notices[k]});
        const Notice got = arrived[k % slots];
        const size_t n = pieceLength(recvBytes, recvPiece, k);
        acceptNotice(c, got, recvBytes, n, from);
        if (k + slots < recvPieces) postNotice(k + slots);  // after `got` was read
        takePiece(dst + k * recvPiece, st.peerSlot(from, k), n, red);
        small.push_back(c.send(from, creditStep(firstStep, k), nullptr, 0));
      }
    }
    c.wait(pending());  // the last credits: our slots are free for the next exchange
  } catch (...) {
    c.abandon(pending());
    // A credit that never arrived (still pending, or failed: a timeout cancels it) means `to`
    // may yet read that slot, even after this op is gone; unless a tripwire for `to` caught
    // its refusal (refusalWire): it refused at our first notice, and reads none.
    if (outstanding(credits) && !refusedBy(c, to)) {
      st.retire(slotsInUse(c.rank(), to));
    }
    throw;
  }
}

bool pairFusedFits(const StagingArea& staging) { return staging.slots() >= 2 * kFusedDepth; }

void stagedPairAllreduce(Comm& c, uint8_t* data, size_t mineOffset, size_t mineBytes,
                         size_t theirsOffset, size_t theirsBytes, uint32_t firstStep,
                         const Reduction& red, PieceSize pieces) {
  StagingArea& st = *c.staging();
  if (!st.retiredBecause().empty()) throw OpFailed(st.retiredBecause());
  const int peer = 1 - c.rank();
  const size_t minePiece = st.pieceBytes(red.elementSize, pieces, mineBytes);
  const size_t theirsPiece = st.pieceBytes(red.elementSize, pieces, theirsBytes);
  // The peer cuts its `theirs` (this rank's `mine`) by the same length, and so alike.
  const size_t minePieces = chunksOf(mineBytes, minePiece);
  const size_t theirsPieces = chunksOf(theirsBytes, theirsPiece);
  const size_t last = std::max(minePieces, theirsPieces);
  uint8_t* mine = data + mineOffset;
  uint8_t* theirs = data + theirsOffset;
  const auto rawSlot = [](size_t k) { return k % kFusedDepth; };
  const auto reducedSlot = [](size_t k) { return kFusedDepth + k % kFusedDepth; };
  const auto rawStep = [firstStep](size_t k) { return firstStep + static_cast<uint32_t>(2 * k); };
  const auto reducedStep = [&](size_t k) { return rawStep(k) + 1; };
  const uint32_t doneStep = rawStep(last);
  std::vector<Notice> sentRaw(theirsPieces);
  std::vector<Notice> sentReduced(minePieces);
  Notice rawIn[kFusedDepth];
  Notice reducedIn[kFusedDepth];
  std::vector<RequestPtr> rawNotices(minePieces);        // the peer's raw piece k of `mine`
  std::vector<RequestPtr> reducedNotices(theirsPieces);  // its reduced piece k of `theirs`
  std::vector<RequestPtr> small;                         // our own notices
  RequestPtr done;                                       // the peer read its last piece
  bool announced = false;                                // the peer may read our slots
  auto postRaw = [&](size_t k) {
    rawNotices[k] = c.recv(peer, rawStep(k), &rawIn[k % kFusedDepth], sizeof(Notice));
  };
  auto postReduced = [&](size_t k) {
    reducedNotices[k] =
        c.recv(peer, reducedStep(k), &reducedIn[k % kFusedDepth], sizeof(Notice));
  };
  auto pending = [&] {
    std::vector<RequestPtr> all;
    for (const auto* list : {&rawNotices, &reducedNotices, &small}) {
      for (const auto& r : *list) {
        if (r && r->pending()) all.push_back(r);
      }
    }
    if (done && done->pending()) all.push_back(done);
    return all;
  };
  // The peer's reduced piece j of `theirs`, copied out of its slot.
  auto copyReduced = [&](size_t j) {
    c.wait({reducedNotices[j]});
    const size_t n = pieceLength(theirsBytes, theirsPiece, j);
    checkNotice(reducedIn[j % kFusedDepth], theirsBytes, n, peer);
    if (j + kFusedDepth < theirsPieces) postReduced(j + kFusedDepth);  // after it was read
    takePiece(theirs + j * theirsPiece, st.peerSlot(peer, reducedSlot(j)), n, nullptr);
  };
  try {
    for (size_t k = 0; k < std::min(kFusedDepth, minePieces); ++k) postRaw(k);
    for (size_t k = 0; k < std::min(kFusedDepth, theirsPieces); ++k) postReduced(k);
    done = c.recv(peer, doneStep, nullptr, 0);
    for (size_t k = 0; k < last; ++k) {
      if (k < theirsPieces) {  // our raw piece of the peer's block, for it to fold
        const size_t n = pieceLength(theirsBytes, theirsPiece, k);
        st.fillOwnSlot(rawSlot(k), theirs + k * theirsPiece, n);
        sentRaw[k] = Notice{n, theirsBytes};
        announced = true;
        small.push_back(c.send(peer, rawStep(k), &sentRaw[k], sizeof(Notice)));
      }
      if (k < minePieces) {  // fold the peer's raw piece of our block, hand the result over
        c.wait({rawNotices[k]});
        const size_t n = pieceLength(mineBytes, minePiece, k);
        checkNotice(rawIn[k % kFusedDepth], mineBytes, n, peer);
        if (k + kFusedDepth < minePieces) postRaw(k + kFusedDepth);  // after it was read
        uint8_t* piece = mine + k * minePiece;
        takePiece(piece, st.peerSlot(peer, rawSlot(k)), n, &red);
        st.fillOwnSlot(reducedSlot(k), piece, n);  // still in cache from the fold
        sentReduced[k] = Notice{n, mineBytes};
        announced = true;
        small.push_back(c.send(peer, reducedStep(k), &sentReduced[k], sizeof(Notice)));
      }
      // One piece behind, so that the peer's fold of piece k runs while we copy k - 1.
      if (k >= 1 && k - 1 < theirsPieces) copyReduced(k - 1);
    }
    if (last - 1 < theirsPieces) copyReduced(last - 1);
    small.push_back(c.send(peer, doneStep, nullptr, 0));
    c.wait(pending());  // the peer's `done`: our slots are free for the next exchange
  } catch (...) {
    c.abandon(pending());
    // Without `done` the peer may yet read a slot we announced, even after this op is gone.
    if (announced && (done == nullptr || done->pending() || done->failed())) {
      st.retire(slotsInUse(c.rank(), peer));
    }
    throw;
  }
}

bool PostedStagedExchange::fits(const StagingArea& staging, size_t bytes, size_t elementSize,
                                PieceSize pieces) {
  return chunksOf(bytes, staging.pieceBytes(elementSize, pieces, bytes)) <= staging.slots();
}

PostedStagedExchange::PostedStagedExchange(Comm& c, int peer, const uint8_t* src, size_t bytes,
                                           size_t elementSize, uint32_t firstStep,
                                           PieceSize pieces)
    : staging_(*c.staging()),
      peer_(peer),
      rank_(c.rank()),
      bytes_(bytes),
      piece_(staging_.pieceBytes(elementSize, pieces, bytes)),
      firstStep_(firstStep),
      paired_(staging_.pairFits(bytes)) {
  if (!staging_.retiredBecause().empty()) throw OpFailed(staging_.retiredBecause());
  try {
    post(c, src);
  } catch (...) {
    // Filling a slot can fail after receives and notices are posted (reserving the slot's
    // pages: a full /dev/shm). Those requests point into arrived_ and sent_, which go with
    // this half-made exchange, and no destructor runs for it: give them up here, before the
    // members are freed, and retire the slots if the peer was told of one.
    std::vector<RequestPtr> posted = notices_;
    posted.insert(posted.end(), small_.begin(), small_.end());
    posted.insert(posted.end(), credits_.begin(), credits_.end());
    c.abandon(posted);
    if (!small_.empty()) staging_.retire(slotsInUse(rank_, peer_));
    throw;
  }
}

void PostedStagedExchange::post(Comm& c, const uint8_t* src) {
  const size_t bytes = bytes_;
  const int peer = peer_;
  const uint32_t firstStep = firstStep_;
  if (paired_) {
    pairSlot_ = staging_.takePairSlot();
    sent_.resize(1);
    arrived_.resize(1);
    notices_.push_back(c.recv(peer, noticeStep(firstStep, 0), &arrived_[0], sizeof(Notice)));
    staging_.fillOwnPairSlot(pairSlot_, src, bytes);
    sent_[0] = Notice{bytes, bytes};
    small_.push_back(c.send(peer, noticeStep(firstStep, 0), &sent_[0], sizeof(Notice)));
    return;
  }
  const size_t n = chunksOf(bytes, piece_);
  sent_.resize(n);
  arrived_.resize(n);
  for (size_t k = 0; k < n; ++k) {
    notices_.push_back(c.recv(peer, noticeStep(firstStep, k), &arrived_[k], sizeof(Notice)));
  }
  for (size_t k = 0; k < n; ++k) {
    const size_t len = pieceLength(bytes, piece_, k);
    staging_.fillOwnSlot(k, src + k * piece_, len);
    sent_[k] = Notice{len, bytes};
    small_.push_back(c.send(peer, noticeStep(firstStep, k), &sent_[k], sizeof(Notice)));
    credits_.push_back(c.recv(peer, creditStep(firstStep, k), nullptr, 0));
  }
}

PostedStagedExchange::~PostedStagedExchange() {
  // Through a pair slot there is no credit to tell: an exchange that failed before it had
  // folded may leave the peer reading this rank's pair slot at any time.
  if (outstanding(credits_) || (paired_ && !consumed_)) {
    staging_.retire(slotsInUse(rank_, peer_));
  }
}

std::vector<RequestPtr> PostedStagedExchange::consume(Comm& c, uint8_t* dst,
                                                      const Reduction* red) {
  if (consumed_) throw OpFailed("internal: a staged exchange consumed twice");
  if (paired_) {
    checkNotice(arrived_[0], bytes_, bytes_, peer_);
    takePiece(dst, staging_.peerPairSlot(peer_, pairSlot_), bytes_, red);
    consumed_ = true;
    return small_;
  }
  consumed_ = true;
  for (size_t k = 0; k < arrived_.size(); ++k) {
    const size_t n = pieceLength(bytes_, piece_, k);
    checkNotice(arrived_[k], bytes_, n, peer_);
    takePiece(dst + k * piece_, staging_.peerSlot(peer_, k), n, red);
    small_.push_back(c.send(peer_, creditStep(firstStep_, k), nullptr, 0));
  }
  std::vector<RequestPtr> last = credits_;
  last.insert(last.end(), small_.begin(), small_.end());
  return last;
}

}  // namespace ucxb::algo::detail
