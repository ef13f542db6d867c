// The layout of a rank's inbox: the shared-memory segment into which every other rank of a
// one-host group writes its messages for this rank (shm_transport.h). The receiver creates
// it; each sender maps it and writes only its own ring. Torch-free, UCX-free.
//
//   [0, 64)       InboxHeader: what a sender checks before writing, and the mapping count
//   [64, 128)     the receiver's `sleeping` word (a line of its own: every sender reads it)
//   [128, ...)    one RingControl per sender rank (its own rank's is unused)
//   page-aligned  one ring of kRingBytes per sender rank
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transports/shm/byte_ring.h"

namespace ucxb::shm {

// Bytes of each sender's ring: one 64 KiB all_reduce notice stream, or a 64 KiB message in
// one pass. A larger message streams through it while the receiver copies out; the group
// reserves size * size rings of this size on the host (8 ranks: 4 MiB).
constexpr size_t kRingBytes = size_t{64} << 10;
constexpr uint64_t kInboxMagic = 0x75636b62696e6278ULL;  // "ucxbinbx"

struct InboxHeader {
  uint64_t magic;
  uint32_t ranks;
  uint32_t ringBytes;
  // Peers that mapped this inbox: the one that makes it size - 1 removes the name
  // (SharedSegment::removeName), so that nothing of it outlives a crash in /dev/shm.
  std::atomic<uint32_t> mapped;
};

// Where each part of an inbox for `ranks` ranks lies.
struct InboxLayout {
  static constexpr size_t kSleepingOffset = 64;
  static constexpr size_t kControlsOffset = 128;
  static size_t ringsOffset(int ranks) {
    const size_t end = kControlsOffset + sizeof(RingControl) * static_cast<size_t>(ranks);
    return (end + 4095) & ~size_t{4095};
  }
  static size_t bytes(int ranks) {
    return ringsOffset(ranks) + kRingBytes * static_cast<size_t>(ranks);
  }
  static InboxHeader* header(uint8_t* base) { return reinterpret_cast<InboxHeader*>(base); }
  // Nonzero while the receiver sleeps on its doorbell (or is about to): a sender that
  // publishes bytes then rings it.
  static std::atomic<uint32_t>* sleeping(uint8_t* base) {
    return reinterpret_cast<std::atomic<uint32_t>*>(base + kSleepingOffset);
  }
  // The ring `sender` writes into this inbox.
  static ByteRing ring(uint8_t* base, int ranks, int sender) {
    auto* controls = reinterpret_cast<RingControl*>(base + kControlsOffset);
    return ByteRing(controls + sender, base + ringsOffset(ranks) + kRingBytes * sender,
                    kRingBytes);
  }
};

}  // namespace ucxb::shm
