// Shared-memory staging slots for a group whose ranks all run on one host.
//
// Every rank owns one segment of `slots` slots and maps every peer's. A sender copies a piece
// of its message into one of its own slots; the receiver reduces (or copies) it straight out
// of that slot into its output. Going through UCX instead costs a copy into UCX's shared FIFO
// and another out of it into scratch before the reduction: the staged path moves each byte
// once less, and the slots are small enough to stay in cache between the two processes.
// Which slot holds which piece, and when it may be reused, travels in small tag messages (see
// collectives/staged_exchange.h), so timeouts and peer failures work as for any message.
// Torch-free and UCX-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "transports/shm/shared_segment.h"

namespace ucxb {

struct StagingLayout {
  // Four slots of at most 256 KiB: 1 MiB per rank, about one core's L2 here. Larger slots
  // fall out of cache between the copy in and the reduction; smaller ones cost more
  // notifications. A group's chunk_bytes caps them (tests use tiny chunks to cut messages
  // into many uneven pieces); 16 bytes holds any element.
  static constexpr size_t kMaxSlotBytes = size_t{256} << 10;
  static constexpr size_t kMinSlotBytes = 16;
  size_t slotBytes = kMaxSlotBytes;
  size_t slots = 4;
  // The segment starts with a page holding the creator's cookie (how a peer knows it opened
  // the right object); the slots follow, page-aligned.
  static constexpr size_t kHeaderBytes = 4096;
  size_t segmentBytes() const { return kHeaderBytes + slotBytes * slots; }
};

class StagingArea {
 public:
  // `peers[rank]` is rank's segment mapped here; peers[own rank] is left empty.
  StagingArea(StagingLayout layout, shm::SharedSegment mine, std::vector<shm::SharedSegment> peers)
      : layout_(layout), mine_(std::move(mine)), peers_(std::move(peers)) {}

  size_t slotBytes() const { return layout_.slotBytes; }
  // The largest piece of whole `elementSize`-byte elements that fits a slot.
  size_t pieceBytes(size_t elementSize) const {
    return layout_.slotBytes / elementSize * elementSize;
  }
  size_t slots() const { return layout_.slots; }
  // Slot of piece k of a message (k modulo slots()).
  uint8_t* ownSlot(size_t k) const { return slotIn(mine_, k); }
  const uint8_t* peerSlot(int peer, size_t k) const { return slotIn(peers_.at(peer), k); }

 private:
  uint8_t* slotIn(const shm::SharedSegment& s, size_t k) const {
    return s.data() + StagingLayout::kHeaderBytes + (k % layout_.slots) * layout_.slotBytes;
  }

  StagingLayout layout_;
  shm::SharedSegment mine_;
  std::vector<shm::SharedSegment> peers_;
};

}  // namespace ucxb
