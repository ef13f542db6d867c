// Shared-memory staging slots for a group whose ranks all run on one host.
//
// Every rank owns one segment of `slots` slots and maps every peer's. A sender copies a piece
// of its message into one of its own slots; the receiver reduces (or copies) it straight out
// of that slot into its output. Going through UCX instead costs a copy into UCX's shared FIFO
// and another out of it into scratch before the reduction: the staged path moves each byte
// once less, and the pieces of a two-way exchange stay in cache between the two processes.
// Which slot holds which piece, and when it may be reused, travels in small tag messages (see
// collectives/staged_exchange.h), so timeouts and peer failures work as for any message.
// Torch-free and UCX-free.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "csrc/engine/streaming_copy.h"
#include "transports/shm/shared_segment.h"

namespace ucxb {

// How a message is cut into pieces; sender and receiver of a message must pass the same (each
// call site of stagedExchange names one for all its ranks) and each sizes the pieces from the
// message's length, which both know.
enum class PieceSize {
  // At most 256 KiB: for exchanges in which every rank copies into its slots and out of a
  // peer's at once (the rings, all_to_all). Four such pieces are 1 MiB, about one core's L2
  // here; larger ones fall out of cache between the copy in and the fold and measured slower.
  kCacheSized,
  // A sixteenth of the message, from 256 KiB up to the whole slot: for one-way transfers (a
  // broadcast's parent to its child), where each rank only copies in or only copies out, so
  // the notice and credit per piece weigh more. Whole 1 MiB slots ran 16-64 MB broadcasts
  // 1.5-1.9x faster than 256 KiB pieces here, but a 1-4 MB one needs several pieces in flight.
  kScaledToMessage,
};

// How a rank writes the pieces it stages into its own slots (the group's staging_stores).
// Each rank chooses for itself: a reader sees the same bytes either way.
enum class SlotStores {
  // Per write (StagingArea::streams): streaming for every pair slot's exchange, cached for
  // everything else.
  kAuto,
  kCached,     // memcpy: the bytes stay in the writer's cache for the reader to pull across
  kStreaming,  // streamingCopy: they go to memory; for hosts where that hand-off is slow
};

struct StagingLayout {
  // Four slots of at most 1 MiB: 4 MiB of /dev/shm per rank, of which cache-sized pieces
  // touch only the first 256 KiB of each. A group's chunk_bytes caps them (tests use tiny
  // chunks to cut messages into many uneven pieces); 16 bytes holds any element.
  static constexpr size_t kMaxSlotBytes = size_t{1} << 20;
  static constexpr size_t kCacheSizedPieceBytes = size_t{256} << 10;
  static constexpr size_t kMinSlotBytes = 16;
  // Slots start on cache-line boundaries whatever chunk_bytes is, so every element the
  // reductions read from a slot is aligned.
  static constexpr size_t kSlotAlignment = 64;
  size_t slotBytes = kMaxSlotBytes;
  size_t slots = 4;
  // Two more slots of one cache-sized piece each, after the others, for the exchanges of a
  // 2-rank group that fit one piece (StagingArea::takePairSlot): 0 in larger groups.
  size_t pairSlots = 2;
  // The segment starts with a page holding the creator's cookie (how a peer knows it opened
  // the right object) and, on a cache line of its own, the rank's core word (StagingArea::
  // publishCore); the slots follow, page-aligned.
  static constexpr size_t kHeaderBytes = 4096;
  static constexpr size_t kCoreWordOffset = 64;
  size_t slotStride() const {
    return (slotBytes + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
  }
  // A pair slot holds what one cache-sized piece of a slot holds.
  size_t pairSlotBytes() const { return std::min(slotBytes, kCacheSizedPieceBytes); }
  size_t pairSlotStride() const {
    return (pairSlotBytes() + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
  }
  size_t segmentBytes() const {
    return kHeaderBytes + slotStride() * slots + pairSlotStride() * pairSlots;
  }
};

class StagingArea {
 public:
  // `peers[rank]` is rank's segment mapped here; peers[own rank] is left empty.
  StagingArea(StagingLayout layout, shm::SharedSegment mine, std::vector<shm::SharedSegment> peers,
              SlotStores stores = SlotStores::kAuto)
      : layout_(layout),
        mine_(std::move(mine)),
        peers_(std::move(peers)),
        stores_(stores),
        reserved_(layout.slots + layout.pairSlots, 0) {}

  size_t slotBytes() const { return layout_.slotBytes; }
  // Piece length for a message of `messageBytes`: whole `elementSize`-byte elements.
  size_t pieceBytes(size_t elementSize, PieceSize size, size_t messageBytes) const {
    size_t room = std::min(layout_.slotBytes, StagingLayout::kCacheSizedPieceBytes);
    if (size == PieceSize::kScaledToMessage) {
      room = std::max(room, std::min(layout_.slotBytes, messageBytes / 16));
    }
    return room / elementSize * elementSize;
  }
  size_t slots() const { return layout_.slots; }
  // Slot of piece k of a message (k modulo slots()).
  uint8_t* ownSlot(size_t k) const { return slotIn(mine_, k); }
  const uint8_t* peerSlot(int peer, size_t k) const { return slotIn(peers_.at(peer), k); }
  // Copies `n` (at most slotBytes()) bytes of `src` into ownSlot(k) the way stores() says.
  // Throws TransportError where /dev/shm has no room for pages of the slot never written before.
  void fillOwnSlot(size_t k, const uint8_t* src, size_t n) {
    reserveOwn(k % layout_.slots, ownSlot(k), n);
    fill(ownSlot(k), src, n, streams(false));
  }
  SlotStores stores() const { return stores_; }
  // Whether a write into one of this rank's slots (a pair slot when `pairSlot`) goes around
  // the cache. The one rule for kAuto: a pair slot's write streams, whatever its size. In
  // that exchange both ranks write their slot and fold the peer's at once, and a cached write
  // leaves every line for the peer to pull out of this core's cache and, two exchanges later,
  // to invalidate in the peer's before writing it again: two hand-offs of every line per op,
  // which this host's slow mode makes about 4x dearer. At 64 KiB that took 15.6 us per op
  // against 12.8 streamed in the host's fast mode, 41 against 12.6 in its slow one. At 4 KiB
  // (the smallest pair exchange, kAllreducePairSlotsMin) the cached write is about 0.4 us
  // faster in the fast mode but 2-3 us slower in the slow one, which put a 4 KB all_reduce
  // above twice torch's dispatch floor in half the runs; streamed it stays within it in both.
  // Measured in docs/performance.md (the pair slots' stores; the 4 KB floor).
  bool streams(bool pairSlot) const {
    switch (stores_) {
      case SlotStores::kStreaming:
        return true;
      case SlotStores::kCached:
        return false;
      case SlotStores::kAuto:
        break;
    }
    return pairSlot;
  }

  // The pair slots: a 2-rank exchange whose message fits one (`bytes` at most
  // pairSlotBytes()) writes its own pair slot s and reads the peer's, and the exchanges
  // alternate between s = 0 and 1. They need no credits: before an exchange writes slot s
  // again, it has received the peer's notice of the exchange in between, which the peer sends
  // only after its reads of slot s have ended (collectives/staged_exchange.h). Every rank
  // runs the same exchanges in the same order, so both ranks' turns agree.
  bool pairFits(size_t bytes) const {
    return layout_.pairSlots == 2 && bytes <= layout_.pairSlotBytes();
  }
  size_t takePairSlot() {
    const size_t s = nextPairSlot_;
    nextPairSlot_ ^= 1;
    return s;
  }
  void fillOwnPairSlot(size_t s, const uint8_t* src, size_t n) {
    reserveOwn(layout_.slots + s % 2, pairSlotIn(mine_, s), n);
    fill(pairSlotIn(mine_, s), src, n, streams(true));
  }
  const uint8_t* peerPairSlot(int peer, size_t s) const { return pairSlotIn(peers_.at(peer), s); }

  // The core this rank's driver (the caller of an inline op, or the progress thread) last
  // waited on, for a peer to see whether the two share a core (engine/progress_engine.h);
  // -1 before the first. Stored as
  // core + 1: the segment starts zero-filled.
  void publishCore(int core) const {
    coreWord(mine_).store(core + 1, std::memory_order_relaxed);
  }
  int peerCore(int peer) const {
    return coreWord(peers_.at(peer)).load(std::memory_order_relaxed) - 1;
  }

  // Called when an op fails while a peer may still read this rank's slots (it has not
  // returned every credit): writing them again could hand that peer the next op's bytes as
  // the old op's, so no later op of this group writes them; each fails with `why` instead.
  void retire(std::string why) { retiredBecause_ = std::move(why); }
  // Empty while the slots may be used.
  const std::string& retiredBecause() const { return retiredBecause_; }

 private:
  static std::atomic<int32_t>& coreWord(const shm::SharedSegment& s) {
    static_assert(std::atomic<int32_t>::is_always_lock_free, "shared between processes");
    return *reinterpret_cast<std::atomic<int32_t>*>(s.data() + StagingLayout::kCoreWordOffset);
  }
  uint8_t* slotIn(const shm::SharedSegment& s, size_t k) const {
    return s.data() + StagingLayout::kHeaderBytes + (k % layout_.slots) * layout_.slotStride();
  }
  uint8_t* pairSlotIn(const shm::SharedSegment& s, size_t k) const {
    return s.data() + StagingLayout::kHeaderBytes + layout_.slots * layout_.slotStride() +
           (k % 2) * layout_.pairSlotStride();
  }
  // The segment was created with only its header reserved (staging_setup.cpp: zeroing every
  // page of every rank's slots cost each group's creation 0.5-2.5 ms, and most groups never
  // stage); the first `n` bytes of this rank's slot `region` (`dst`) are reserved before
  // they are first written, so that a full /dev/shm fails the op instead of a SIGBUS.
  void reserveOwn(size_t region, const uint8_t* dst, size_t n) {
    size_t& done = reserved_[region];
    if (n <= done) return;
    mine_.reserve(static_cast<size_t>(dst - mine_.data()) + done, n - done);
    done = n;
  }
  // Copies `n` bytes into one of this rank's slots, around the cache when `streaming`.
  static void fill(uint8_t* dst, const uint8_t* src, size_t n, bool streaming) {
    if (streaming) {
      streamingCopy(dst, src, n);
    } else {
      std::memcpy(dst, src, n);
    }
  }

  StagingLayout layout_;
  shm::SharedSegment mine_;
  std::vector<shm::SharedSegment> peers_;
  SlotStores stores_;
  std::string retiredBecause_;
  size_t nextPairSlot_ = 0;  // used only by the thread that owns the group's transport
  // Bytes reserved from the start of each own slot, then of each pair slot (reserveOwn); as
  // nextPairSlot_, used only by that thread.
  std::vector<size_t> reserved_;
};

}  // namespace ucxb
