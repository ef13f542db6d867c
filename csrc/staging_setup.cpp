#include "csrc/staging_setup.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

namespace ucxb {

namespace {

std::vector<uint8_t> bytesOf(const std::string& s) { return {s.begin(), s.end()}; }
std::string stringOf(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

uint64_t randomWord() {
  std::random_device entropy;
  return (uint64_t{entropy()} << 32) ^ entropy();
}

// What a rank publishes: "<host identity> slot=<bytes>\n<segment name>\n<cookie>", or "" when it takes
// no part (shared memory off, or its segment could not be created).
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

// UCXBACKEND_TEST_KILL_AT=<point> (a test-only hook, docs/testing.md#test-only-hooks): this
// process dies by SIGKILL at that point of the set-up, as a rank killed there would.
void testKillPoint(const char* point) {
  const char* v = std::getenv("UCXBACKEND_TEST_KILL_AT");
  if (v != nullptr && std::strcmp(v, point) == 0) ::kill(::getpid(), SIGKILL);
}

}  // namespace

std::unique_ptr<StagingArea> setUpStaging(const BackendOptions& options,
                                          const Transport& transport, size_t chunkBytes,
                                          AddressExchange& exchange) {
  const int rank = transport.rank();
  const int size = transport.size();
  if (size < 2) return nullptr;
  // This rank's own say: its options ask for staging and its transport permits it (udp never
  // does; ucx not under a UCX_TLS without shared memory). A rank that declines still takes
  // part in both rounds, with an empty offer: UCX_TLS is per process, and a peer whose
  // environment differs must get an answer, not wait for one.
  const bool wanted = options.stagingWanted() && transport.permitsSharedMemory();

  StagingLayout layout;
  layout.slotBytes =
      std::clamp(chunkBytes, StagingLayout::kMinSlotBytes, StagingLayout::kMaxSlotBytes);
  shm::SharedSegment mine;
  uint64_t cookie = 0;
  std::string offer;
  if (wanted) {
    // Segments of earlier groups on this host whose creator was killed before it could
    // remove the name (SIGKILL, or the SIGTERM torchrun sends) would fill /dev/shm: remove
    // those whose owner is provably dead.
    shm::removeOrphanedSegments();
    try {
      const std::string name =
          shm::segmentName(shm::currentOwner(), randomWord() & 0xffffffffffff, rank);
      mine = shm::SharedSegment::create(name, layout.segmentBytes());
      cookie = randomWord() | 1;
      std::memcpy(mine.data(), &cookie, sizeof(cookie));
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(cookie));
      // Ranks agree to share only with the same slot layout (chunk_bytes set alike).
      testKillPoint("shm_created");
      offer = shm::hostIdentity() + " slot=" + std::to_string(layout.slotBytes) + "\n" + name +
              "\n" + hex;
    } catch (const TransportError&) {
      offer.clear();  // no shared memory here (/dev/shm missing or full): take no part
    }
  }
  // Round 1: is every rank on this host and willing? (Every rank publishes, so a rank with
  // shared memory off never leaves the others waiting.)
  const auto offers = exchange.allGather("shm_offer", bytesOf(offer));
  const std::string myHost = Offer::parse(offer).host;
  for (const auto& o : offers) {
    if (myHost.empty() || Offer::parse(stringOf(o)).host != myHost) return nullptr;
  }
  testKillPoint("shm_offered");
  // Round 2: could every rank map every peer's segment (and find its cookie there)? The last
  // peer to map a segment removes its name at once, as POSIX shared-memory handoffs do: from
  // then on a crash of any rank leaves nothing in /dev/shm (the memory goes with the last
  // mapping). The creator removes it too once round 2 is over, in case a peer never got there.
  std::vector<shm::SharedSegment> peers(size);
  bool mapped = true;
  for (int p = 0; p < size && mapped; ++p) {
    if (p == rank) continue;
    const Offer o = Offer::parse(stringOf(offers[p]));
    try {
      peers[p] = shm::SharedSegment::open(o.name, layout.segmentBytes());
      uint64_t found = 0;
      std::memcpy(&found, peers[p].data(), sizeof(found));
      mapped = found == o.cookie;
    } catch (const TransportError&) {
      mapped = false;
    }
    if (mapped && exchange.add("shm_opened", p, 1) == size - 1) peers[p].removeName();
  }
  const auto results = exchange.allGather("shm_mapped", {static_cast<uint8_t>(mapped)});
  mine.unlink();  // every peer has mapped it by now, or never will
  for (const auto& r : results) {
    if (r.empty() || r[0] != 1) return nullptr;
  }
  return std::make_unique<StagingArea>(layout, std::move(mine), std::move(peers),
                                       options.slotStores());
}

}  // namespace ucxb
