// csrc/engine/staging_area.h on its own: where slots start and how messages are cut into
// pieces. Built and run by tests/test_shared_memory.py; prints "OK" and exits 0, else names
// the first failed check and exits 1.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "csrc/engine/staging_area.h"

using ucxb::PieceSize;
using ucxb::StagingArea;
using ucxb::StagingLayout;
using ucxb::shm::SharedSegment;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  }
}

StagingArea areaWithSlots(size_t slotBytes) {
  StagingLayout layout;
  layout.slotBytes = slotBytes;
  const std::string name =
      "/ucxb-test-area-" + std::to_string(getpid()) + "-" + std::to_string(slotBytes);
  SharedSegment mine = SharedSegment::create(name, layout.segmentBytes());
  std::vector<SharedSegment> peers(2);
  peers[1] = SharedSegment::open(name, layout.segmentBytes());
  mine.unlink();
  return StagingArea(layout, std::move(mine), std::move(peers));
}

}  // namespace

int main() {
  constexpr size_t KiB = 1024;
  constexpr size_t MiB = 1024 * KiB;
  // chunk_bytes can make a slot any size: every slot must still start on a cache line, or
  // the reductions would read misaligned int64/double elements out of it.
  for (size_t slotBytes : {size_t{16}, size_t{20}, size_t{40}, size_t{1000}, 256 * KiB, MiB}) {
    const StagingArea area = areaWithSlots(slotBytes);
    for (size_t k = 0; k < 2 * area.slots(); ++k) {
      const auto own = reinterpret_cast<uintptr_t>(area.ownSlot(k));
      const auto peer = reinterpret_cast<uintptr_t>(area.peerSlot(1, k));
      expect(own % 64 == 0 && peer % 64 == 0,
             "slot " + std::to_string(k) + " of " + std::to_string(slotBytes) + "-byte slots is "
             "64-byte aligned");
      if (k > 0) {
        expect(area.ownSlot(k) - area.ownSlot(k - 1) >= static_cast<ptrdiff_t>(slotBytes) ||
                   k % area.slots() == 0,
               "slots of " + std::to_string(slotBytes) + " bytes do not overlap");
      }
    }
  }

  const StagingArea full = areaWithSlots(MiB);
  // Both ways at once: never more than 256 KiB, whatever the message.
  expect(full.pieceBytes(1, PieceSize::kCacheSized, 64 * MiB) == 256 * KiB,
         "cache-sized pieces of a large message are 256 KiB");
  expect(full.pieceBytes(4, PieceSize::kCacheSized, 100) == 256 * KiB,
         "cache-sized pieces do not depend on the message");
  // One way: a sixteenth of the message, between 256 KiB and the slot.
  expect(full.pieceBytes(1, PieceSize::kScaledToMessage, MiB) == 256 * KiB,
         "a 1 MiB one-way message still travels in four pieces");
  expect(full.pieceBytes(1, PieceSize::kScaledToMessage, 8 * MiB) == 512 * KiB,
         "an 8 MiB one-way message travels in sixteen pieces");
  expect(full.pieceBytes(1, PieceSize::kScaledToMessage, 64 * MiB) == MiB,
         "a 64 MiB one-way message uses whole slots");
  expect(full.pieceBytes(8, PieceSize::kScaledToMessage, 8 * MiB + 8) % 8 == 0,
         "pieces hold whole elements");
  const StagingArea tiny = areaWithSlots(40);
  expect(tiny.pieceBytes(8, PieceSize::kScaledToMessage, 64 * MiB) == 40 &&
             tiny.pieceBytes(16, PieceSize::kCacheSized, 64 * MiB) == 32,
         "chunk_bytes caps the piece, rounded down to whole elements");

  StagingArea retired = areaWithSlots(64);
  expect(retired.retiredBecause().empty(), "a new area is usable");
  retired.retire("rank 0 stopped");
  expect(retired.retiredBecause() == "rank 0 stopped", "retire records why");

  if (failures == 0) std::printf("OK\n");
  return failures == 0 ? 0 : 1;
}
