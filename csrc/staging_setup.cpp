#include "csrc/staging_setup.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "csrc/creation_liveness.hpp"
#include "transports/entropy.h"

namespace ucxb {

namespace {

// In a segment's header page (StagingLayout::kHeaderBytes, reserved at creation), after the
// cookie (offset 0) and the core word (StagingLayout::kCoreWordOffset), on a cache line of
// its own: how many peers mapped the segment, where no Store round counts them (agreeing
// without a round, below). The peer whose mapping makes it size - 1 removes the name.
constexpr size_t kMappedCountOffset = StagingLayout::kCoreWordOffset + 64;
static_assert(kMappedCountOffset + sizeof(uint32_t) <= StagingLayout::kHeaderBytes);

std::atomic<uint32_t>& mappedCount(const shm::SharedSegment& segment) {
  static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared between processes");
  return *reinterpret_cast<std::atomic<uint32_t>*>(segment.data() + kMappedCountOffset);
}

// A rank's offer (StagingOffer::text), read back.
struct Offer {
  std::string host;
  std::string name;
  uint64_t cookie = 0;

  static Offer parse(const std::string& s) {
    Offer o;
    const size_t a = s.find('\n');
    const size_t b = a == std::string::npos ? a : s.find('\n', a + 1);
    if (b == std::string::npos) return o;
    o.host = s.substr(0, a);
    o.name = s.substr(a + 1, b - a - 1);
    o.cookie = std::strtoull(s.c_str() + b + 1, nullptr, 16);
    return o;
  }
};

}  // namespace

StagingOffer offerStaging(const BackendOptions& options, const Transport& transport,
                          size_t chunkBytes) {
  StagingOffer offer;
  offer.layout.slotBytes =
      std::clamp(chunkBytes, StagingLayout::kMinSlotBytes, StagingLayout::kMaxSlotBytes);
  // Only a 2-rank group runs the exchanges that use the pair slots (every rank knows the size).
  offer.layout.pairSlots = transport.size() == 2 ? 2 : 0;
  // This rank's own say. A rank that declines still publishes (an empty offer): UCX_TLS is per
  // process, and a peer whose environment differs must get an answer, not wait for one.
  if (transport.size() < 2 || !options.stagingWanted() || !transport.permitsSharedMemory()) {
    return offer;
  }
  // Segments of earlier groups on this host whose creator was killed before it could
  // remove the name (SIGKILL, or the SIGTERM torchrun sends) would fill /dev/shm: remove
  // those whose owner is provably dead.
  shm::removeOrphanedSegments();
  try {
    const std::string name = shm::segmentName(shm::currentOwner(),
                                              randomWord() & 0xffffffffffff, transport.rank());
    // Only the header (the cookie below, the core word) is reserved now; each slot's pages
    // are reserved on its first write (StagingArea::reserveOwn). /dev/shm must have room for
    // every rank's segment: the group's size bounds the ranks on this host.
    offer.segment = shm::SharedSegment::create(name, offer.layout.segmentBytes(),
                                               StagingLayout::kHeaderBytes,
                                               static_cast<size_t>(transport.size()));
    offer.cookie = randomWord() | 1;
    std::memcpy(offer.segment.data(), &offer.cookie, sizeof(offer.cookie));
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(offer.cookie));
    testKillPoint("shm_created");
    // Ranks agree to share only with the same slot layout (chunk_bytes set alike).
    offer.text = shm::hostIdentity() + " slot=" + std::to_string(offer.layout.slotBytes) +
                 "\n" + name + "\n" + hex;
  } catch (const TransportError&) {
    // No shared memory here (/dev/shm missing or full): take no part.
    offer = StagingOffer{offer.layout, {}, 0, {}};
  }
  return offer;
}

std::unique_ptr<StagingArea> setUpStaging(const BackendOptions& options, StagingOffer mine,
                                          const std::vector<std::string>& offers, int rank,
                                          AddressExchange& exchange, bool transportMappedPeers) {
  // Is every rank on this host and willing? Every rank read the same offers.
  const std::string myHost = Offer::parse(mine.text).host;
  for (const auto& o : offers) {
    if (myHost.empty() || Offer::parse(o).host != myHost) return nullptr;
  }
  testKillPoint("shm_offered");
  // Could every rank map every peer's segment (and find its cookie there)? The rank whose
  // yes completes the count removes every segment's name at once, as POSIX shared-memory
  // handoffs do: from then on a crash of any rank leaves nothing in /dev/shm (the memory goes
  // with the last mapping). A rank that gives up (a peer never answered: the Store timed out)
  // removes the names of the segments it mapped, and its own: the creation failed, and a
  // peer killed after its offer leaves nothing behind either.
  const int size = static_cast<int>(offers.size());
  std::vector<shm::SharedSegment> peers(size);
  if (transportMappedPeers) {
    // Agreeing without a round: the group's transport (the one-host transport) mapped every
    // peer's inbox from the same /dev/shm, by the same kind of name, as this rank's user, or
    // the creation failed there. A staging segment that cannot be mapped after that is the
    // same failure, and fails the creation the same way, on this rank, whose record the others
    // then find given up (~AddressExchange). So every rank that gets past this point staged,
    // and no Store round is needed to agree on it: two Store calls less per rank, and the
    // deletion of two keys less for the last one (docs/performance.md, "Start-up"). Each
    // segment's name goes with its last peer's mapping, as an inbox's does (inbox.h); until
    // then its creator's own release() removes it (a failed creation), or, if the creator is
    // killed first, the next creation's sweep on the host.
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      const Offer o = Offer::parse(offers[p]);
      try {
        peers[p] = shm::SharedSegment::open(o.name, mine.layout.segmentBytes());
      } catch (const TransportError& e) {
        // Gone: only its creator's failed creation or, once the creator died, a sweep
        // removes a name that this rank has not mapped yet.
        throw TransportError("the shared-memory staging segment of rank " + std::to_string(p) +
                                 " could not be mapped (did it fail or die during this "
                                 "creation?): " + e.what(),
                             p);
      }
      uint64_t found = 0;
      std::memcpy(&found, peers[p].data(), sizeof(found));
      if (found != o.cookie) {
        throw TransportError("the staging segment " + o.name + " of rank " + std::to_string(p) +
                                 " holds another cookie: not the segment it offered",
                             p);
      }
      if (mappedCount(peers[p]).fetch_add(1, std::memory_order_acq_rel) + 1 ==
          static_cast<uint32_t>(size - 1)) {
        peers[p].removeName();
      }
    }
    return std::make_unique<StagingArea>(mine.layout, std::move(mine.segment), std::move(peers),
                                         options.slotStores());
  }
  bool mapped = true;
  for (int p = 0; p < size && mapped; ++p) {
    if (p == rank) continue;
    const Offer o = Offer::parse(offers[p]);
    try {
      peers[p] = shm::SharedSegment::open(o.name, mine.layout.segmentBytes());
      uint64_t found = 0;
      std::memcpy(&found, peers[p].data(), sizeof(found));
      mapped = found == o.cookie;
    } catch (const TransportError&) {
      mapped = false;
    }
  }
  bool agreed = false;
  try {
    agreed = exchange.everyoneSays("shm", mapped, [&peers] {
      for (auto& segment : peers) segment.removeName();
    });
  } catch (...) {
    for (auto& segment : peers) segment.removeName();
    mine.segment.unlink();
    throw;
  }
  mine.segment.unlink();  // every peer has mapped it by now, or never will
  if (!agreed) return nullptr;
  return std::make_unique<StagingArea>(mine.layout, std::move(mine.segment), std::move(peers),
                                       options.slotStores());
}

}  // namespace ucxb
