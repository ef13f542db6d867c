#include "csrc/staging_setup.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "csrc/creation_liveness.hpp"
#include "transports/entropy.h"

namespace ucxb {

namespace {

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
                                          AddressExchange& exchange) {
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
