// csrc/engine/staging_area.h on its own: where slots start, how messages are cut into
// pieces, and the streaming stores (csrc/engine/streaming_copy.h) a rank may fill its slots
// with. Built and run by tests/test_shared_memory.py (tests/cpp/check.h: exits 0 when every
// check passed).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "csrc/engine/staging_area.h"
#include "csrc/engine/streaming_copy.h"
#include "tests/cpp/check.h"
#include "transports/transport.h"

using ucxb::PieceSize;
using ucxb::SlotStores;
using ucxb::StagingArea;
using ucxb::StagingLayout;
using ucxb::shm::SharedSegment;

namespace {

StagingArea areaWithSlots(size_t slotBytes, SlotStores stores = SlotStores::kCached) {
  StagingLayout layout;
  layout.slotBytes = slotBytes;
  const std::string name =
      "/ucxb-test-area-" + std::to_string(getpid()) + "-" + std::to_string(slotBytes);
  SharedSegment mine = SharedSegment::create(name, layout.segmentBytes());
  std::vector<SharedSegment> peers(2);
  peers[1] = SharedSegment::open(name, layout.segmentBytes());
  mine.unlink();
  return StagingArea(layout, std::move(mine), std::move(peers), stores);
}

uint8_t patternAt(size_t i) { return static_cast<uint8_t>(i * 131 + 7); }

// Copies `n` bytes from `srcOffset` into `dstOffset` of a buffer full of guard bytes: the
// copy must equal the source and leave every byte around it alone.
void checkStreamingCopy(size_t n, size_t srcOffset, size_t dstOffset) {
  constexpr uint8_t kGuard = 0xA5;
  std::vector<uint8_t> src(n + srcOffset + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = patternAt(i);
  std::vector<uint8_t> dst(n + dstOffset + 64, kGuard);
  ucxb::streamingCopy(dst.data() + dstOffset, src.data() + srcOffset, n);
  bool ok = true;
  for (size_t i = 0; i < dst.size() && ok; ++i) {
    const bool inside = i >= dstOffset && i < dstOffset + n;
    ok = dst[i] == (inside ? src[i - dstOffset + srcOffset] : kGuard);
  }
  CHECK_MSG(ok, "streamingCopy of " + std::to_string(n) + " bytes, source offset " +
                 std::to_string(srcOffset) + ", destination offset " +
                 std::to_string(dstOffset));
}

constexpr size_t KiB = 1024;
constexpr size_t MiB = 1024 * KiB;

void testSlots() {
  // chunk_bytes can make a slot any size: every slot must still start on a cache line, or
  // the reductions would read misaligned int64/double elements out of it.
  for (size_t slotBytes : {size_t{16}, size_t{20}, size_t{40}, size_t{1000}, 256 * KiB, MiB}) {
    const StagingArea area = areaWithSlots(slotBytes);
    for (size_t k = 0; k < 2 * area.slots(); ++k) {
      const auto own = reinterpret_cast<uintptr_t>(area.ownSlot(k));
      const auto peer = reinterpret_cast<uintptr_t>(area.peerSlot(1, k));
      CHECK_MSG(own % 64 == 0 && peer % 64 == 0,
             "slot " + std::to_string(k) + " of " + std::to_string(slotBytes) + "-byte slots is "
             "64-byte aligned");
      if (k > 0) {
        CHECK_MSG(area.ownSlot(k) - area.ownSlot(k - 1) >= static_cast<ptrdiff_t>(slotBytes) ||
                   k % area.slots() == 0,
               "slots of " + std::to_string(slotBytes) + " bytes do not overlap");
      }
    }
  }

  const StagingArea full = areaWithSlots(MiB);
  // Both ways at once: never more than 256 KiB, whatever the message.
  CHECK_MSG(full.pieceBytes(1, PieceSize::kCacheSized, 64 * MiB) == 256 * KiB,
         "cache-sized pieces of a large message are 256 KiB");
  CHECK_MSG(full.pieceBytes(4, PieceSize::kCacheSized, 100) == 256 * KiB,
         "cache-sized pieces do not depend on the message");
  // One way: a sixteenth of the message, between 256 KiB and the slot.
  CHECK_MSG(full.pieceBytes(1, PieceSize::kScaledToMessage, MiB) == 256 * KiB,
         "a 1 MiB one-way message still travels in four pieces");
  CHECK_MSG(full.pieceBytes(1, PieceSize::kScaledToMessage, 8 * MiB) == 512 * KiB,
         "an 8 MiB one-way message travels in sixteen pieces");
  CHECK_MSG(full.pieceBytes(1, PieceSize::kScaledToMessage, 64 * MiB) == MiB,
         "a 64 MiB one-way message uses whole slots");
  CHECK_MSG(full.pieceBytes(8, PieceSize::kScaledToMessage, 8 * MiB + 8) % 8 == 0,
         "pieces hold whole elements");
  const StagingArea tiny = areaWithSlots(40);
  CHECK_MSG(tiny.pieceBytes(8, PieceSize::kScaledToMessage, 64 * MiB) == 40 &&
             tiny.pieceBytes(16, PieceSize::kCacheSized, 64 * MiB) == 32,
         "chunk_bytes caps the piece, rounded down to whole elements");

  StagingArea retired = areaWithSlots(64);
  CHECK_MSG(retired.retiredBecause().empty(), "a new area is usable");
  retired.retire("rank 0 stopped");
  CHECK_MSG(retired.retiredBecause() == "rank 0 stopped", "retire records why");
}

void testStreamingCopy() {
  // Streaming stores: every length around the 16- and 64-byte steps, at every alignment of
  // source and destination (the head before an aligned store, the 64- and 16-byte loops and
  // the tail), and a slot-sized copy that ends mid-vector.
  for (size_t n = 0; n <= 200; ++n) {
    for (size_t srcOffset : {0, 1, 8, 15}) {
      for (size_t dstOffset = 0; dstOffset < 17; ++dstOffset) {
        checkStreamingCopy(n, srcOffset, dstOffset);
      }
    }
  }
  checkStreamingCopy(MiB + 13, 3, 5);
}

void testStreamingSlots() {
  const StagingArea full = areaWithSlots(MiB);
  // A streaming area's slot, read through the peer's mapping of the same segment.
  StagingArea streaming = areaWithSlots(1000, SlotStores::kStreaming);
  CHECK_MSG(streaming.stores() == SlotStores::kStreaming && full.stores() == SlotStores::kCached,
         "an area keeps the stores it was made with");
  std::vector<uint8_t> piece(1000);
  for (size_t i = 0; i < piece.size(); ++i) piece[i] = patternAt(i + 3);
  for (size_t k = 0; k < streaming.slots(); ++k) {
    streaming.fillOwnSlot(k, piece.data() + k, piece.size() - k);
    CHECK_MSG(std::memcmp(streaming.peerSlot(1, k), piece.data() + k, piece.size() - k) == 0,
           "streaming slot " + std::to_string(k) + " reads back through the peer's mapping");
  }
}

// staging_stores=auto streams every pair slot's write, whatever its size, and caches every
// write into the credited slots; cached and streaming are what they say for every write.
void testAutoStores() {
  StagingArea autoArea = areaWithSlots(MiB, SlotStores::kAuto);
  CHECK_MSG(autoArea.streams(true), "auto streams a pair slot's write, 4 KiB ones included");
  CHECK_MSG(!autoArea.streams(false), "auto caches every write into the credited slots");
  const StagingArea cached = areaWithSlots(MiB, SlotStores::kCached);
  const StagingArea streaming = areaWithSlots(MiB, SlotStores::kStreaming);
  for (const bool pair : {false, true}) {
    CHECK_MSG(!cached.streams(pair) && streaming.streams(pair),
              "cached and streaming are the same for every write");
  }
  // Both kinds of pair write read back through the peer's mapping, from an odd source offset
  // (the head before the first aligned streaming store) and with an odd length (the tail).
  std::vector<uint8_t> vec(16 * 1024 + 100);
  for (size_t i = 0; i < vec.size(); ++i) vec[i] = patternAt(i + 11);
  for (const size_t n : {size_t{4096 - 3}, size_t{16 * 1024 + 5}}) {
    for (size_t s = 0; s < 2; ++s) {
      autoArea.fillOwnPairSlot(s, vec.data() + 1, n);
      CHECK_MSG(std::memcmp(autoArea.peerPairSlot(1, s), vec.data() + 1, n) == 0,
                "an auto pair slot of " + std::to_string(n) + " bytes reads back");
    }
  }
}

}  // namespace

// An area whose own segment is a peer's mapping, which reserve() refuses: a fill that
// reserves before it writes throws and leaves the slot as it was.
void testReservesBeforeWriting() {
  StagingLayout layout;
  layout.slotBytes = 4096;
  const std::string name = "/ucxb-test-area-unreserved-" + std::to_string(getpid());
  SharedSegment creator = SharedSegment::create(name, layout.segmentBytes());
  SharedSegment view = SharedSegment::open(name, layout.segmentBytes());
  std::vector<SharedSegment> peers(2);
  peers[1] = SharedSegment::open(name, layout.segmentBytes());
  creator.unlink();
  StagingArea area(layout, std::move(view), std::move(peers));
  CHECK_MSG(area.stores() == SlotStores::kAuto, "an area's stores are auto by default");
  const std::vector<uint8_t> piece(64, 0x5A);
  const std::string err = ucxb::check::thrownMessage<ucxb::TransportError>(
      [&] { area.fillOwnSlot(1, piece.data(), piece.size()); });
  CHECK_MSG(ucxb::check::contains(err, "reserve()"), "a slot is reserved before it is filled");
  CHECK_MSG(area.peerSlot(1, 1)[0] == 0, "nothing was written into the unreserved slot");
  const std::string pair = ucxb::check::thrownMessage<ucxb::TransportError>(
      [&] { area.fillOwnPairSlot(0, piece.data(), piece.size()); });
  CHECK_MSG(ucxb::check::contains(pair, "reserve()"), "so is a pair slot");
}

int main(int argc, char** argv) {
  const ucxb::check::Group groups[] = {
      {"slots", testSlots, true},
      {"streaming_copy", testStreamingCopy, true},
      {"streaming_slots", testStreamingSlots, true},
      {"auto_stores", testAutoStores, true},
      {"reserves_before_writing", testReservesBeforeWriting, true},
  };
  return ucxb::check::runGroups("staging_area_test", groups, argc, argv);
}
