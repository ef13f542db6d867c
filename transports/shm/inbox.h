// The layout of a rank's inbox: the shared-memory segment into which every other rank of a
// one-host group writes its messages for this rank (shm_transport.h). The receiver creates
// it; each sender maps it and writes only its own ring. Torch-free, UCX-free.
//
//   [0, 64)       InboxHeader: what a sender checks before writing, and the mapping count
//   [64, 128)     the receiver's `sleeping` word (a line of its own: every sender reads it)
//   [128, ...)    one RingControl per sender rank (its own rank's is unused)
//   page-aligned  one ring of ringBytesFor(ranks) per sender rank
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transports/shm/byte_ring.h"

namespace ucxb::shm {

// Bytes of all the rings of one inbox, about: each sender's ring gets an equal share, a power
// of two within [kMinRingBytes, kMaxRingBytes], so that a host's group needs about
// kInboxBytes per rank of /dev/shm (8 ranks: 8 MiB; a default Docker container has 64 MiB).
// A message up to its ring's size is sent in one pass; a longer one streams through it
// while the receiver copies out.
constexpr size_t kInboxBytes = size_t{1} << 20;
constexpr size_t kMinRingBytes = size_t{16} << 10;
constexpr size_t kMaxRingBytes = size_t{256} << 10;
constexpr size_t ringBytesFor(int ranks) {
  size_t ring = kMaxRingBytes;
  while (ring > kMinRingBytes && ring * static_cast<size_t>(ranks) > kInboxBytes) ring /= 2;
  return ring;
}
// How far ahead a sender populates its ring where InboxHeader::sendersPopulate says so
// (ShmTransport::populateOut): a page at a time would take a call per 4 KiB of a ring's first
// pass; the smallest ring is 16 KiB.
constexpr size_t kPopulateStep = size_t{16} << 10;
// What a sender gives madvise(MADV_POPULATE_WRITE) to populate bytes [from, upTo) of its ring,
// which starts `ringOffset` bytes into the inbox: the offset (into the inbox, whose mapping
// starts on a page) and length of a span that starts on a page of `page` bytes, since madvise
// takes no other address. The layout aligns rings to 4 KiB only, and kPopulateStep is 16 KiB:
// under 16 or 64 KiB pages (arm64 kernels) a ring's bytes start inside a page. The span may
// then begin in the page's bytes of the header or of another sender's ring: populating a page
// writes nothing into it.
struct PopulateSpan {
  size_t offset;
  size_t length;
};
constexpr PopulateSpan populateSpan(size_t ringOffset, size_t from, size_t upTo, size_t page) {
  const size_t start = (ringOffset + from) / page * page;
  return {start, ringOffset + upTo - start};
}
constexpr uint64_t kInboxMagic = 0x75636b62696e6278ULL;  // "ucxbinbx"

struct InboxHeader {
  uint64_t magic;
  uint32_t ranks;
  uint32_t ringBytes;
  // Peers that mapped this inbox: the one that makes it size - 1 removes the name
  // (SharedSegment::removeName), so that nothing of it outlives a crash in /dev/shm.
  std::atomic<uint32_t> mapped;
  // Nonzero when the receiver reserved only [0, ringsOffset) and each sender populates the
  // pages of its own ring before it first writes them (madvise MADV_POPULATE_WRITE, which
  // fails with an error where /dev/shm is full instead of a write's SIGBUS). Reserving the
  // whole inbox at creation zeroed 1 MiB per rank, about 0.2 ms of CPU, for rings of which
  // a group's first small op touches one page each (docs/performance.md, "Start-up"). Zero
  // where the kernel has no MADV_POPULATE_WRITE (before 5.14): the receiver reserved it all.
  uint32_t sendersPopulate;
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
    return ringsOffset(ranks) + ringBytesFor(ranks) * static_cast<size_t>(ranks);
  }
  static InboxHeader* header(uint8_t* base) { return reinterpret_cast<InboxHeader*>(base); }
  // Set by the receiver's arm() before it sleeps on its doorbell: the first sender that then
  // publishes bytes clears it and rings (ShmTransport::wake).
  static std::atomic<uint32_t>* sleeping(uint8_t* base) {
    return reinterpret_cast<std::atomic<uint32_t>*>(base + kSleepingOffset);
  }
  // The bytes of the ring `sender` writes into this inbox (page-aligned).
  static uint8_t* ringBytes(uint8_t* base, int ranks, int sender) {
    return base + ringsOffset(ranks) + ringBytesFor(ranks) * static_cast<size_t>(sender);
  }
  // The ring `sender` writes into this inbox.
  static ByteRing ring(uint8_t* base, int ranks, int sender) {
    auto* controls = reinterpret_cast<RingControl*>(base + kControlsOffset);
    return ByteRing(controls + sender, ringBytes(base, ranks, sender), ringBytesFor(ranks));
  }
};

}  // namespace ucxb::shm
