// Tests of the UDP transport's sans-IO core (transports/udp/) in the deterministic simulator
// (tests/udp_sim/). Plain C++, no framework: each scenario group is a function; failures are
// printed and counted; the exit code is non-zero if any check failed.
//
//   udp_core_test                 every group except `measure`
//   udp_core_test GROUP...        the named groups (see --list)
//   udp_core_test measure         goodput / retransmission figures (printed, not checked)
//   UDP_MEASURE_MIB=2 udp_core_test measure   the same for a 2 MiB message (default 16)
//   UDP_SOAK_SEEDS=3000 udp_core_test soak    a longer random soak (default 60 seeds)
//
// Build:
//   g++ -std=c++20 -O1 -I. transports/udp/*.cpp tests/udp_sim/*.cpp tests/cpp/udp_core_test.cpp
//       -o udp_core_test
// (tests/test_udp_core.py does this and runs each group.)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <cmath>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tests/cpp/check.h"
#include "tests/udp_sim/simulator.h"
#include "transports/udp/congestion.h"
#include "transports/udp/congestion_coupled.h"
#include "transports/udp/congestion_bdp.h"
#include "transports/udp/congestion_credit.h"
#include "transports/udp/credit_scheduler.h"
#include "transports/udp/congestion_delay.h"
#include "transports/udp/congestion_ecn.h"
#include "transports/udp/crc32c.h"
#include "transports/udp/faults.h"
#include "transports/config/key_values.h"
#include "transports/udp/loss_recovery.h"
#include "transports/udp/loss_recovery_rack.h"
#include "transports/udp/one_way_delay.h"
#include "transports/udp/range_set.h"
#include "transports/udp/reliability.h"
#include "transports/udp/rtt.h"
#include "transports/udp/udp_config.h"
#include "transports/udp/wire_format.h"

// Every operator new of the program counted (plain and array; the default array, nothrow and
// sized forms all come here), so that a check can tell that a hot path allocates nothing.
// With the sanitizers the allocation still goes through their malloc.
namespace {
std::atomic<uint64_t> gAllocations{0};
}  // namespace

void* operator new(std::size_t bytes) {
  gAllocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes != 0 ? bytes : 1)) return p;
  throw std::bad_alloc();
}
// free() pairs with the malloc() above; g++ knows only the standard pairing of new and delete.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

using namespace ucxb::udp;
using ucxb::udp::sim::LinkConfig;
using ucxb::udp::sim::SimEvent;
using ucxb::udp::sim::Simulator;

namespace {

using ucxb::check::contains;
using ucxb::check::report;
using ucxb::check::thrownMessage;
using ucxb::check::wallMs;

// ---------------------------------------------------------------------------------------------
// Data patterns: byte i of message `key` is a hash of (key, i), so a byte written at the
// wrong offset, from the wrong message, or not at all is caught.

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fillPattern(uint8_t* p, uint64_t n, uint64_t key) {
  for (uint64_t block = 0; block * 8 < n; ++block) {
    const uint64_t v = mix64(key * 0x9e3779b97f4a7c15ull + block + 1);
    for (uint64_t i = 0; i < 8 && block * 8 + i < n; ++i) p[block * 8 + i] = uint8_t(v >> (8 * i));
  }
}

// Offset of the first byte that differs from the pattern, or n.
uint64_t firstPatternMismatch(const uint8_t* p, uint64_t n, uint64_t key) {
  for (uint64_t block = 0; block * 8 < n; ++block) {
    const uint64_t v = mix64(key * 0x9e3779b97f4a7c15ull + block + 1);
    for (uint64_t i = 0; i < 8 && block * 8 + i < n; ++i) {
      if (p[block * 8 + i] != uint8_t(v >> (8 * i))) return block * 8 + i;
    }
  }
  return n;
}

constexpr size_t kGuard = 64;         // bytes around every receive buffer
constexpr uint8_t kGuardByte = 0xA5;  // what they must still hold at the end
constexpr uint8_t kSentinel = 0xEE;   // what a delivered buffer is overwritten with

bool allBytes(const uint8_t* p, size_t n, uint8_t v) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != v) return false;
  }
  return true;
}

// A receive buffer with guard bytes on both sides.
struct GuardedBuffer {
  explicit GuardedBuffer(size_t capacity) : bytes(capacity + 2 * kGuard, kGuardByte), cap(capacity) {}
  uint8_t* data() { return bytes.data() + kGuard; }
  bool guardsIntact() const {
    return allBytes(bytes.data(), kGuard, kGuardByte) &&
           allBytes(bytes.data() + kGuard + cap, kGuard, kGuardByte);
  }
  std::vector<uint8_t> bytes;
  size_t cap;
};

// ---------------------------------------------------------------------------------------------
// The transfer harness: flows of messages between simulated nodes, every byte checked.

struct Flow {
  int from = 0;
  int to = 1;
  std::vector<uint64_t> sizes;
};

struct TransferPlan {
  std::string label;
  UdpConfig config;
  LinkConfig link;
  int nodes = 2;
  std::vector<Flow> flows;
  // Faults on links from a lower to a higher node ("forward", e.g. 0 -> 1, the data of a
  // 0 -> 1 flow) and the other way ("reverse", e.g. the ACKs of that flow).
  std::optional<FaultConfig> forwardFaults;
  std::optional<FaultConfig> reverseFaults;
  // Every node's downlink (shared by all links into it), e.g. a bottleneck for an incast.
  std::optional<FaultConfig> downlinkFaults;
  uint64_t postDelayNs = 0;      // receives posted this long after the sends (0: before them)
  bool postInReverse = false;    // post a flow's receives last message first
  bool sameTag = false;          // every message of a flow carries the same tag (order test)
  uint64_t maxSimNs = 60'000'000'000ull;
  bool verbose = false;
  // Datagrams it returns true for are lost before the link (Simulator::setDropFilter).
  std::function<bool(int from, int to, std::span<const uint8_t>)> dropFilter;
};

// Counters summed over every connection of a run.
struct Totals {
  uint64_t dataPacketsSent = 0, retransmittedPackets = 0, retransmittedBytes = 0,
           declaredLost = 0, lateAcks = 0, rtoExpiries = 0, duplicatePackets = 0,
           duplicateFragments = 0, outOfOrder = 0, checksumDrops = 0, otherDrops = 0,
           payloadBytesReceived = 0, bytesDelivered = 0, creditStalls = 0, rendezvous = 0,
           eager = 0, unexpectedMessages = 0, unexpectedHighWater = 0, pings = 0,
           datagramsSent = 0, ackPacketsSent = 0, rttSamples = 0, afterGapDrops = 0,
           tailProbes = 0, spurious = 0, packetsNacked = 0, nacksSent = 0, trimmedReceived = 0,
           ceReceived = 0, ceEchoed = 0, creditPacketsSent = 0, creditTimeouts = 0;
  DurationUs rttMinUs = 0, rttSmoothedUs = 0;
  double goodputBps = 0;  // the best receiving connection's (Stats' own figure)
};

Totals totalsOf(Simulator& sim) {
  Totals t;
  for (int n = 0; n < sim.nodes(); ++n) {
    for (int p = 0; p < sim.nodes(); ++p) {
      if (n == p) continue;
      const Stats s = sim.connection(n, p).stats();
      t.dataPacketsSent += s.dataPacketsSent;
      t.retransmittedPackets += s.retransmittedPackets;
      t.retransmittedBytes += s.retransmittedBytes;
      t.declaredLost += s.packetsDeclaredLost;
      t.lateAcks += s.lateAcks;
      t.rtoExpiries += s.rtoExpiries;
      t.duplicatePackets += s.duplicatePackets;
      t.duplicateFragments += s.duplicateFragments;
      t.outOfOrder += s.outOfOrderPackets;
      t.checksumDrops += s.dropped(DropReason::kBadChecksum);
      t.otherDrops += s.datagramsDropped - s.dropped(DropReason::kBadChecksum);
      t.afterGapDrops += s.dropped(DropReason::kAfterGap);
      t.tailProbes += s.tailLossProbes;
      t.spurious += s.spuriousRetransmissions;
      t.packetsNacked += s.packetsNacked;
      t.nacksSent += s.nacksSent;
      t.trimmedReceived += s.trimmedReceived;
      t.ceReceived += s.ceReceived;
      t.ceEchoed += s.ceEchoed;
      t.creditPacketsSent += s.creditPacketsSent;
      t.creditTimeouts += s.creditTimeouts;
      t.payloadBytesReceived += s.payloadBytesReceived;
      t.bytesDelivered += s.bytesDelivered;
      t.creditStalls += s.creditStalls;
      t.rendezvous += s.rendezvousMessagesSent;
      t.eager += s.eagerMessagesSent;
      t.unexpectedMessages += s.unexpectedMessages;
      t.unexpectedHighWater = std::max(t.unexpectedHighWater, s.unexpectedBytesHighWater);
      t.pings += s.pingPacketsSent;
      t.datagramsSent += s.datagramsSent;
      t.ackPacketsSent += s.ackPacketsSent;
      t.rttSamples += s.rttSamples;
      t.goodputBps = std::max(t.goodputBps, goodputBitsPerSecond(s));
      if (s.rttSamples > 0) {
        t.rttMinUs = t.rttMinUs == 0 ? s.rttMinUs : std::min(t.rttMinUs, s.rttMinUs);
        t.rttSmoothedUs = std::max(t.rttSmoothedUs, s.rttSmoothedUs);
      }
    }
  }
  return t;
}

struct TransferOutcome {
  bool completed = false;
  uint64_t messages = 0;
  uint64_t bytes = 0;
  uint64_t doneNs = 0;  // simulated time when the last message was delivered and acknowledged
  double wallMs = 0;
  Totals totals;
  FaultInjector::Counters faults;  // summed over the links (queueHighWater: the largest)
  uint64_t traceHash = 0;          // of every datagram sent: (time, from, to, bytes)
};

struct Message {
  int from = 0, to = 0;
  uint64_t index = 0, key = 0, size = 0;
  Tag tag = 0;
  std::vector<uint8_t> payload;
  std::unique_ptr<GuardedBuffer> buffer;
  MessageId sendId = 0;
  ReceiveId receiveId = 0;
  int delivered = 0, completed = 0;
};

void applyFaults(Simulator& sim, const TransferPlan& plan) {
  for (int a = 0; a < plan.nodes; ++a) {
    for (int b = 0; b < plan.nodes; ++b) {
      if (a == b) continue;
      const auto& f = a < b ? plan.forwardFaults : plan.reverseFaults;
      if (!f) continue;
      FaultConfig c = *f;
      c.seed = f->seed * 1000003ull + static_cast<uint64_t>(a * 131 + b);  // distinct per link
      sim.setFaults(a, b, c);
    }
  }
}

TransferOutcome runTransfer(const TransferPlan& plan) {
  const auto start = std::chrono::steady_clock::now();
  TransferOutcome out;
  Simulator sim(plan.nodes, plan.config, plan.link);
  applyFaults(sim, plan);
  if (plan.dropFilter) sim.setDropFilter(plan.dropFilter);
  for (int n = 0; plan.downlinkFaults && n < plan.nodes; ++n) {
    FaultConfig c = *plan.downlinkFaults;
    c.seed = plan.downlinkFaults->seed * 1000003ull + static_cast<uint64_t>(n);
    sim.setDownlink(n, c);
  }
  sim.setTap([&](int from, int to, std::span<const uint8_t> bytes) {
    out.traceHash = mix64(out.traceHash ^ sim.nowNs()) ^ mix64(uint64_t(from * 64 + to));
    out.traceHash = mix64(out.traceHash ^ crc32c(bytes.data(), bytes.size()));
  });

  std::vector<std::unique_ptr<Message>> messages;
  for (size_t f = 0; f < plan.flows.size(); ++f) {
    const Flow& flow = plan.flows[f];
    for (size_t i = 0; i < flow.sizes.size(); ++i) {
      auto m = std::make_unique<Message>();
      m->from = flow.from;
      m->to = flow.to;
      m->index = i;
      m->key = (f + 1) * 1'000'003ull + i;
      m->size = flow.sizes[i];
      m->tag = plan.sameTag ? (0xabc0000000000000ull | f) : ((uint64_t(f) << 40) | i);
      m->payload.resize(m->size);
      fillPattern(m->payload.data(), m->size, m->key);
      m->buffer = std::make_unique<GuardedBuffer>(m->size);
      out.bytes += m->size;
      messages.push_back(std::move(m));
    }
  }
  out.messages = messages.size();

  // (node, peer, id) -> message
  std::map<std::tuple<int, int, uint64_t>, Message*> bySend, byReceive;
  uint64_t failures = 0, delivered = 0, completed = 0;
  std::string firstFailure;
  sim.setEventHandler([&](const SimEvent& e) {
    switch (e.event.kind) {
      case EventKind::kMessageReceived: {
        auto it = byReceive.find({e.node, e.peer, e.event.id});
        CHECK_MSG(it != byReceive.end(), plan.label + ": delivery to an unknown receive");
        if (it == byReceive.end()) return;
        Message& m = *it->second;
        ++m.delivered;
        ++delivered;
        CHECK_EQ(e.event.tag, m.tag);
        CHECK_EQ(e.event.bytes, m.size);
        CHECK(!e.event.truncated);
        const uint64_t bad = firstPatternMismatch(m.buffer->data(), m.size, m.key);
        CHECK_MSG(bad == m.size, plan.label + ": message " + std::to_string(m.index) + " of " +
                                     std::to_string(m.size) + " bytes differs at offset " +
                                     std::to_string(bad));
        // From now on the buffer belongs to the application: any later write is a bug.
        std::memset(m.buffer->data(), kSentinel, m.size);
        break;
      }
      case EventKind::kSendCompleted: {
        auto it = bySend.find({e.node, e.peer, e.event.id});
        CHECK_MSG(it != bySend.end(), plan.label + ": completion of an unknown send");
        if (it == bySend.end()) return;
        ++it->second->completed;
        ++completed;
        break;
      }
      default:
        ++failures;
        if (firstFailure.empty()) {
          firstFailure = std::string(eventKindName(e.event.kind)) + ": " + e.event.error;
        }
        break;
    }
  });

  const auto postAll = [&] {
    std::vector<Message*> order;
    for (auto& m : messages) order.push_back(m.get());
    if (plan.postInReverse) std::reverse(order.begin(), order.end());
    for (Message* m : order) {
      m->receiveId = sim.connection(m->to, m->from)
                         .postReceive(m->tag, ~Tag{0}, m->buffer->data(), m->size);
      byReceive[{m->to, m->from, m->receiveId}] = m;
    }
  };
  if (plan.postDelayNs == 0) postAll();
  for (auto& m : messages) {
    m->sendId = sim.connection(m->from, m->to).send(m->tag, m->payload.data(), m->size);
    bySend[{m->from, m->to, m->sendId}] = m.get();
  }
  if (plan.postDelayNs > 0) {
    const uint64_t at = sim.nowNs() + plan.postDelayNs;
    sim.runUntil([&] { return sim.nowNs() >= at; }, plan.postDelayNs);
    CHECK_EQ(delivered, uint64_t{0});
    postAll();
  }
  const uint64_t total = messages.size();
  out.completed = sim.runUntil(
      [&] { return (delivered >= total && completed >= total) || failures > 0; }, plan.maxSimNs);
  out.completed = out.completed && failures == 0;
  out.doneNs = sim.nowNs();
  CHECK_MSG(out.completed, plan.label + ": not completed: delivered " + std::to_string(delivered) +
                               "/" + std::to_string(total) + ", sends completed " +
                               std::to_string(completed) + "/" + std::to_string(total) +
                               ", stop: " + sim.stuckReason() + " " + firstFailure);
  CHECK_MSG(failures == 0, plan.label + ": " + firstFailure);

  // Let the last ACKs and timers play out, then look for anything written late.
  sim.runUntilQuiet(2'000'000'000ull);
  for (auto& m : messages) {
    const std::string what = plan.label + ": message " + std::to_string(m->index) + " (" +
                             std::to_string(m->size) + " bytes)";
    CHECK_MSG(m->delivered == 1, what + " delivered " + std::to_string(m->delivered) + " times");
    CHECK_MSG(m->completed == 1, what + " completed " + std::to_string(m->completed) + " times");
    CHECK_MSG(m->buffer->guardsIntact(), what + ": guard bytes overwritten");
    if (m->delivered == 1) {
      CHECK_MSG(allBytes(m->buffer->data(), m->size, kSentinel), what + ": written after delivery");
    }
  }
  out.totals = totalsOf(sim);
  // Each distinct byte was taken from the wire exactly once (duplicates are counted apart).
  CHECK_EQ(out.totals.payloadBytesReceived, out.bytes);
  CHECK_EQ(out.totals.bytesDelivered, out.bytes);
  for (int n = 0; n < plan.nodes; ++n) {
    for (int p = 0; p < plan.nodes; ++p) {
      if (n == p) continue;
      // Nothing left behind: no message, packet, CTS or ACK pending, no budget held.
      CHECK_MSG(sim.connection(n, p).idle(), plan.label + ": connection not idle at the end");
      CHECK(sim.connection(n, p).unexpectedBytesInUse() == 0);
    }
  }
  out.wallMs = wallMs(start);
  for (int a = 0; a < plan.nodes; ++a) {
    for (int b = 0; b < plan.nodes; ++b) {
      const FaultInjector* f = a == b ? nullptr : sim.faults(a, b);
      if (f != nullptr) out.faults.add(f->counters());
    }
    if (const FaultInjector* d = sim.downlink(a)) out.faults.add(d->counters());
  }
  if (plan.verbose) {
    const Totals& t = out.totals;
    std::printf("  %-44s %6.2f ms sim  data=%llu retx=%llu lost=%llu rto=%llu dupPk=%llu "
                "dupFr=%llu ooo=%llu crc=%llu wall=%.0f ms\n",
                plan.label.c_str(), out.doneNs / 1e6, (unsigned long long)t.dataPacketsSent,
                (unsigned long long)t.retransmittedPackets, (unsigned long long)t.declaredLost,
                (unsigned long long)t.rtoExpiries, (unsigned long long)t.duplicatePackets,
                (unsigned long long)t.duplicateFragments, (unsigned long long)t.outOfOrder,
                (unsigned long long)t.checksumDrops, out.wallMs);
  }
  return out;
}

UdpConfig configWith(const std::string& text) { return parseUdpConfig(text); }

const std::vector<std::string> kPolicies = {"selective_repeat", "go_back_n"};

// Message sizes around every boundary of the default configuration.
std::vector<uint64_t> boundarySizes(const UdpConfig& c) {
  const uint64_t frag = maxFragmentBytes(c.mtuPayload);
  const uint64_t mtu = c.mtuPayload;
  return {0,       1,          frag - 1,          frag,    frag + 1,         mtu - 1, mtu,
          mtu + 1, 2 * frag,   3 * frag + 7,      c.eagerMaxBytes,  c.eagerMaxBytes + 1,
          100'000, 1u << 20};
}

// ---------------------------------------------------------------------------------------------
// Groups

void testCrc32c() {
  // Known answers (RFC 3720 B.4 and the usual "123456789" check value).
  CHECK_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::vector<uint8_t> v(32, 0);
  CHECK_EQ(crc32c(v.data(), v.size()), 0x8A9136AAu);
  std::fill(v.begin(), v.end(), 0xFF);
  CHECK_EQ(crc32c(v.data(), v.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<uint8_t>(i);
  CHECK_EQ(crc32c(v.data(), v.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<uint8_t>(31 - i);
  CHECK_EQ(crc32c(v.data(), v.size()), 0x113FDB5Cu);
  CHECK_EQ(crc32c(nullptr, 0), 0u);
  // Slicing-by-8 against a bit-at-a-time reference, every length and alignment up to 80,
  // and extension across every split point.
  Rng rng(11);
  std::vector<uint8_t> data(200);
  for (auto& b : data) b = static_cast<uint8_t>(rng.next());
  const auto reference = [](const uint8_t* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
  };
  bool allMatch = true, extendMatches = true;
  for (size_t off = 0; off < 8; ++off) {
    for (size_t n = 0; n <= 80; ++n) {
      const uint32_t expect = reference(data.data() + off, n);
      allMatch = allMatch && crc32c(data.data() + off, n) == expect &&
                 crc32cPortableExtend(0, data.data() + off, n) == expect;
      for (size_t split = 0; split <= n; split += 7) {
        const uint32_t a = crc32c(data.data() + off, split);
        extendMatches = extendMatches &&
                        crc32cExtend(a, data.data() + off + split, n - split) == expect;
      }
    }
  }
  CHECK(allMatch);
  CHECK(extendMatches);
  // The fast kernels (carry-less folding of 256- and 64-byte blocks; the CRC32 instruction on
  // three interleaved chains of 512, 128 and 32 bytes) against the portable one, at every
  // length up to past three 512-byte blocks and at datagram sizes.
  std::vector<uint8_t> big(70'008);  // room for the longest length at the largest offset
  for (auto& b : big) b = static_cast<uint8_t>(rng.next());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 1700; ++n) lengths.push_back(n);
  for (size_t n : {1472u, 8972u, 65507u, 69'999u}) lengths.push_back(n);
  // crc32cCopy: the same sum, and an exact copy that writes nothing outside the destination.
  std::vector<uint8_t> dst(big.size() + 16);
  // Every kernel this CPU has, not only the one crc32cExtend picks, so that a machine with
  // AVX-512 still tests the SSE4.2 path (and the fold's lengths around its 256- and 64-byte
  // blocks are all in the sweep).
  std::printf("  crc32c kernel in use: %s\n", crc32cKernelName(crc32cActiveKernel()));
  for (const Crc32cKernel kernel : {Crc32cKernel::kTables, Crc32cKernel::kCrcInstruction,
                                    Crc32cKernel::kCarrylessFold}) {
    if (!crc32cKernelAvailable(kernel)) {
      std::printf("  crc32c kernel %s: not on this CPU, not tested\n", crc32cKernelName(kernel));
      continue;
    }
    const std::string name = crc32cKernelName(kernel);
    bool fastMatches = true, copyMatches = true, copyExact = true;
    for (size_t n : lengths) {
      for (size_t off : {0u, 3u}) {
        const uint32_t expect = crc32cPortableExtend(0x1234u, big.data() + off, n);
        const uint32_t sum = crc32cExtendWith(kernel, 0x1234u, big.data() + off, n);
        std::fill(dst.begin(), dst.end(), uint8_t{0xA5});
        const size_t at = 8 + off % 5;  // a destination alignment unlike the source's
        const uint32_t copied = crc32cCopyWith(kernel, 0x1234u, dst.data() + at, big.data() + off, n);
        fastMatches = fastMatches && sum == expect;
        copyMatches = copyMatches && copied == expect;
        copyExact = copyExact && std::equal(big.begin() + off, big.begin() + off + n, dst.begin() + at) &&
                    std::all_of(dst.begin(), dst.begin() + at, [](uint8_t b) { return b == 0xA5; }) &&
                    std::all_of(dst.begin() + at + n, dst.end(), [](uint8_t b) { return b == 0xA5; });
      }
    }
    CHECK_MSG(fastMatches, name);
    CHECK_MSG(copyMatches, name);
    CHECK_MSG(copyExact, name);
  }
  for (size_t n : {0u, 100u, 5000u}) {  // what crc32cExtend / crc32cCopy pick
    CHECK_EQ(crc32cExtend(9u, big.data(), n), crc32cPortableExtend(9u, big.data(), n));
    CHECK_EQ(crc32cCopy(9u, dst.data(), big.data(), n), crc32cPortableExtend(9u, big.data(), n));
  }
  CHECK_EQ(crc32cCopy(7u, nullptr, nullptr, 0), crc32cPortableExtend(7u, nullptr, 0));
}

void testRangeSet() {
  RangeSet s;
  std::vector<RangeSet::Range> parts;
  CHECK_EQ(s.insert(10, 20, &parts), uint64_t{10});
  CHECK_EQ(parts.size(), size_t{1});
  CHECK_EQ(s.insert(15, 25), uint64_t{5});
  CHECK_EQ(s.rangeCount(), size_t{1});
  CHECK_EQ(s.insert(30, 40), uint64_t{10});
  CHECK_EQ(s.rangeCount(), size_t{2});
  parts.clear();
  // Spans a gap: only the gap and the tail are new.
  CHECK_EQ(s.insert(5, 45, &parts), uint64_t{5 + 5 + 5});
  CHECK_EQ(parts.size(), size_t{3});
  CHECK(parts.size() == 3 && parts[0].begin == 5 && parts[0].end == 10 && parts[1].begin == 25 &&
        parts[1].end == 30 && parts[2].begin == 40 && parts[2].end == 45);
  CHECK_EQ(s.rangeCount(), size_t{1});
  CHECK_EQ(s.insert(5, 45), uint64_t{0});
  CHECK(s.contains(5) && s.contains(44) && !s.contains(45) && !s.contains(4));
  CHECK(s.containsAll(5, 45) && !s.containsAll(4, 45) && !s.containsAll(5, 46));
  // Adjacent intervals merge.
  CHECK_EQ(s.insert(45, 50), uint64_t{5});
  CHECK_EQ(s.insert(0, 5), uint64_t{5});
  CHECK_EQ(s.rangeCount(), size_t{1});
  CHECK_EQ(s.firstMissingFrom(0), uint64_t{50});
  CHECK_EQ(s.firstMissingFrom(60), uint64_t{60});
  s.insert(100);
  s.insert(102);
  CHECK_EQ(s.rangeCount(), size_t{3});
  CHECK_EQ(s.max(), uint64_t{102});
  std::vector<uint64_t> descending;
  s.forEachDescending([&](const RangeSet::Range& r) {
    descending.push_back(r.begin);
    return true;
  });
  CHECK(descending == std::vector<uint64_t>({102, 100, 0}));
  s.eraseBelow(30);
  CHECK_EQ(s.min(), uint64_t{30});
  CHECK(!s.contains(29) && s.contains(30));
  s.eraseBelow(101);
  CHECK_EQ(s.rangeCount(), size_t{1});
  CHECK_EQ(s.min(), uint64_t{102});
  // Random operations against a bitmap.
  Rng rng(5);
  RangeSet r;
  std::vector<bool> bits(2000, false);
  bool consistent = true;
  for (int i = 0; i < 3000; ++i) {
    const uint64_t b = rng.below(1990), e = b + 1 + rng.below(10);
    uint64_t expectNew = 0;
    for (uint64_t k = b; k < e; ++k) expectNew += bits[k] ? 0 : 1;
    parts.clear();
    const uint64_t got = r.insert(b, e, &parts);
    uint64_t partSum = 0;
    for (const auto& p : parts) {
      partSum += p.end - p.begin;
      for (uint64_t k = p.begin; k < p.end; ++k) consistent = consistent && !bits[k];
    }
    for (uint64_t k = b; k < e; ++k) bits[k] = true;
    consistent = consistent && got == expectNew && partSum == expectNew;
  }
  for (uint64_t k = 0; k < bits.size(); ++k) consistent = consistent && r.contains(k) == bits[k];
  CHECK(consistent);
  // Growing an interval allocates nothing: a stream arriving in order extends one interval
  // per datagram, in the ACK tracker and in each message's received bytes, and a node made and
  // freed per datagram was a sixth of the core's instructions per byte.
  RangeSet stream;
  stream.insert(0, 1472);
  stream.insert(10'000, 20'000);
  const uint64_t before = gAllocations.load();
  for (uint64_t b = 1472; b < 8'000; b += 1472) stream.insert(b, b + 1472);  // extends [0, ...)
  stream.insert(9'000, 10'000);                  // grows [10'000, ...) downwards
  const uint64_t joined = stream.insert(8'000, 9'000);  // joins the two
  const uint64_t allocated = gAllocations.load() - before;  // read before any check allocates
  CHECK_EQ(joined, uint64_t{168});
  CHECK_EQ(allocated, uint64_t{0});
  CHECK_EQ(stream.rangeCount(), size_t{1});
  CHECK(stream.containsAll(0, 20'000) && !stream.contains(20'000));
}

PacketHeader testHeader(uint16_t source = 3, uint64_t token = 0x1122334455667788ull) {
  PacketHeader h;
  h.sourceRank = source;
  h.token = token;
  return h;
}

void testWireFormat() {
  std::vector<uint8_t> buf(kMaxDatagramBytes);
  DecodedPacket p;
  // DATA round trip.
  std::vector<uint8_t> payload(1000);
  fillPattern(payload.data(), payload.size(), 77);
  DataHeader d;
  d.tag = 0x8000000000000123ull;
  d.messageId = 42;
  d.messageLength = 5000;
  d.offset = 4000;
  d.fragmentLength = 1000;
  d.flags = data_flags::kRendezvousData;
  size_t n = encodeData(buf, testHeader(), 9, d, payload.data());
  CHECK_EQ(n, kDataHeaderBytes + 1000);
  CHECK_EQ(peekSourceRank(std::span<const uint8_t>(buf.data(), n)).value_or(0), uint16_t{3});
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone);
  CHECK(p.header.type == PacketType::kData && p.header.sourceRank == 3 &&
        p.header.token == 0x1122334455667788ull && p.packetNumber == 9);
  CHECK(p.data.tag == d.tag && p.data.messageId == 42 && p.data.messageLength == 5000 &&
        p.data.offset == 4000 && p.data.fragmentLength == 1000 && p.data.flags == d.flags);
  CHECK(p.payload.size() == 1000 && std::memcmp(p.payload.data(), payload.data(), 1000) == 0);
  CHECK(p.payload.data() == buf.data() + 64);
  // The padding (bytes 59-63) is zero on the wire and checked: anything else is malformed.
  for (size_t at = 59; at < 64; ++at) {
    std::vector<uint8_t> padded(buf.begin(), buf.begin() + n);
    padded[at] = 1;
    sealChecksum(padded);
    CHECK_MSG(decodePacket(padded, p) == DecodeError::kMalformed, "padding byte " + std::to_string(at));
  }
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone);
  // Every strict prefix is rejected, never accepted.
  bool prefixesRejected = true;
  for (size_t k = 0; k < n; ++k) {
    prefixesRejected = prefixesRejected && decodePacket({buf.data(), k}, p) != DecodeError::kNone;
  }
  CHECK(prefixesRejected);
  // Every single-bit flip is caught by the checksum (or the version/type checks before it).
  bool flipsCaught = true;
  for (size_t bit = 0; bit < n * 8; bit += 3) {
    buf[bit / 8] ^= uint8_t(1u << (bit % 8));
    flipsCaught = flipsCaught && decodePacket({buf.data(), n}, p) != DecodeError::kNone;
    buf[bit / 8] ^= uint8_t(1u << (bit % 8));
  }
  CHECK(flipsCaught);
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone);
  // A prefix with a recomputed checksum is truncated, an extension is malformed.
  std::vector<uint8_t> cut(buf.begin(), buf.begin() + n - 1);
  sealChecksum(cut);
  CHECK(decodePacket(cut, p) == DecodeError::kTruncated);
  std::vector<uint8_t> longer(buf.begin(), buf.begin() + n);
  longer.push_back(0);
  sealChecksum(longer);
  CHECK(decodePacket(longer, p) == DecodeError::kMalformed);
  // Version and type.
  std::vector<uint8_t> bad(buf.begin(), buf.begin() + n);
  bad[0] = 1;  // version 1 (before CREDIT) is refused: a mixed pair fails loudly
  sealChecksum(bad);
  CHECK(decodePacket(bad, p) == DecodeError::kBadVersion);
  bad[0] = kWireVersion + 1;
  sealChecksum(bad);
  CHECK(decodePacket(bad, p) == DecodeError::kBadVersion);
  // Which is the peer's own, naming its version, only when the header is intact and names
  // this session and that rank (otherWireVersion): a flipped bit or a stranger's is not.
  const uint64_t token = testHeader().token;
  CHECK(otherWireVersion(bad, token, 3) == std::optional<uint8_t>(kWireVersion + 1));
  CHECK(!otherWireVersion(bad, token + 1, 3) && !otherWireVersion(bad, token, 4));
  bad[0] ^= 0x20;
  CHECK(!otherWireVersion(bad, token, 3));
  CHECK(!otherWireVersion({buf.data(), n}, token, 3));  // this version's
  bad[0] = kWireVersion;
  bad[1] = 9;
  sealChecksum(bad);
  CHECK(decodePacket(bad, p) == DecodeError::kBadType);
  bad[1] = 0;
  sealChecksum(bad);
  CHECK(decodePacket(bad, p) == DecodeError::kBadType);
  // Impossible DATA fields (encoded as is, then checked by the decoder).
  const auto dataVerdict = [&](DataHeader h, size_t carried) {
    std::vector<uint8_t> b(kDataHeaderBytes + carried);
    std::vector<uint8_t> zeros(carried, 0);
    const uint16_t declared = h.fragmentLength;
    h.fragmentLength = static_cast<uint16_t>(carried);
    encodeData(b, testHeader(), 1, h, zeros.data());
    b[56] = uint8_t(declared);  // fragment length field, little-endian
    b[57] = uint8_t(declared >> 8);
    sealChecksum(b);
    return decodePacket(b, p);
  };
  DataHeader h{};
  h.messageLength = 100;
  h.offset = 50;
  h.fragmentLength = 60;
  CHECK(dataVerdict(h, 60) == DecodeError::kMalformed);  // past the message end
  h.offset = ~uint64_t{0} - 10;
  h.fragmentLength = 20;
  CHECK(dataVerdict(h, 20) == DecodeError::kMalformed);  // offset + length overflows
  h.offset = 0;
  h.messageLength = kMaxMessageBytes + 1;
  CHECK(dataVerdict(h, 20) == DecodeError::kMalformed);  // impossible message length
  h.messageLength = 100;
  h.fragmentLength = 30;
  CHECK(dataVerdict(h, 20) == DecodeError::kTruncated);  // declares more than it carries
  CHECK(dataVerdict(h, 40) == DecodeError::kMalformed);  // carries more than it declares
  h.fragmentLength = 20;
  h.messageId = ~uint64_t{0};  // the range sets could not record it (id + 1 wraps)
  CHECK(dataVerdict(h, 20) == DecodeError::kMalformed);
  h.messageId = kMaxMessageId;
  CHECK(dataVerdict(h, 20) == DecodeError::kNone);
  h.messageId = 0;
  h.fragmentLength = 0;
  CHECK(dataVerdict(h, 0) == DecodeError::kMalformed);   // empty fragment of a non-empty message
  h.flags = data_flags::kRendezvousRequest;
  h.fragmentLength = 10;
  CHECK(dataVerdict(h, 10) == DecodeError::kMalformed);  // RTS with payload
  h.flags = data_flags::kRendezvousRequest | data_flags::kRendezvousData;
  h.fragmentLength = 0;
  CHECK(dataVerdict(h, 0) == DecodeError::kMalformed);   // both kinds at once
  h.flags = 0x80;
  h.fragmentLength = 10;
  CHECK(dataVerdict(h, 10) == DecodeError::kMalformed);  // unknown flag
  h.flags = data_flags::kRendezvousRequest;
  h.fragmentLength = 0;
  CHECK(dataVerdict(h, 0) == DecodeError::kNone);        // a proper RTS
  h = {};
  CHECK(dataVerdict(h, 0) == DecodeError::kNone);        // the one fragment of a 0-byte message

  // ACK round trip with several ranges, and its limits.
  AckFrame a;
  a.creditLimit = 123456789;
  a.ackDelayUs = 77;
  a.rangeCount = 3;
  a.ranges[0] = {90, 100};
  a.ranges[1] = {50, 80};
  a.ranges[2] = {0, 10};
  n = encodeAck(buf, testHeader(), a);
  CHECK_EQ(n, ackBytes(3));
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone);
  CHECK(p.header.type == PacketType::kAck && p.ack.rangeCount == 3 &&
        p.ack.creditLimit == 123456789 && p.ack.ackDelayUs == 77);
  CHECK(p.ack.ranges[0].smallest == 90 && p.ack.ranges[0].largest == 100 &&
        p.ack.ranges[1].smallest == 50 && p.ack.ranges[1].largest == 80 &&
        p.ack.ranges[2].smallest == 0 && p.ack.ranges[2].largest == 10);
  // A range reaching below packet number 0 is malformed.
  a.ranges[2] = {0, 10};
  n = encodeAck(buf, testHeader(), a);
  buf[kAckFixedBytes + 8 + 4] = 11;  // third range's length: 11 > its largest (10)
  sealChecksum({buf.data(), n});
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kMalformed);
  // Credit-only ACK.
  AckFrame empty;
  empty.creditLimit = 5;
  n = encodeAck(buf, testHeader(), empty);
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone && p.ack.rangeCount == 0 &&
        p.ack.creditLimit == 5);
  // Too many ranges declared.
  buf[36] = uint8_t(kMaxAckRanges + 1);
  sealChecksum({buf.data(), n});
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kMalformed);

  // CTS and PING.
  const std::vector<MessageId> ids = {1, 5, 1ull << 40};
  n = encodeCts(buf, testHeader(), 77, ids);
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone && p.cts.count == 3 &&
        p.cts.ids[2] == (1ull << 40) && p.packetNumber == 77);
  buf[24] = 0;  // count 0
  sealChecksum({buf.data(), n});
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kMalformed);
  n = encodePing(buf, testHeader(), 5);
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone && p.header.type == PacketType::kPing);
  // CLOSE (version 6): the common header alone; a byte more is malformed.
  n = encodeClose(buf, testHeader());
  CHECK(n == kCloseBytes);
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone &&
        p.header.type == PacketType::kClose && p.header.sourceRank == 3);
  buf[n] = 0;
  sealChecksum({buf.data(), n + 1});
  CHECK(decodePacket({buf.data(), n + 1}, p) == DecodeError::kMalformed);
  CHECK(decodePacket({buf.data(), 3}, p) == DecodeError::kTruncated);
  CHECK(!peekSourceRank(std::span<const uint8_t>(buf.data(), 3)));
  // Encoders refuse buffers that are too small instead of writing past them.
  std::vector<uint8_t> tiny(20);
  CHECK(!thrownMessage([&] { encodePing(tiny, testHeader(), 1); }).empty());
  // Version 5: a 64-byte DATA header and fragments cut at multiples of 8 bytes, so that a
  // payload (at byte 64 of an aligned datagram) and every fragment's offset in its message are
  // 8-aligned for the fold of 8-byte elements. At Ethernet's 1472 (and authenticated, 24 less)
  // the rounding costs nothing; jumbo and loopback datagrams lose at most 7 bytes.
  CHECK_EQ(kDataHeaderBytes, size_t{64});
  CHECK_EQ(maxFragmentBytes(1472), size_t{1408});
  CHECK_EQ(maxFragmentBytes(1472 - 24), size_t{1384});
  CHECK_EQ(maxFragmentBytes(8972), size_t{8904});
  CHECK_EQ(maxFragmentBytes(kMaxDatagramBytes), size_t{65440});
  bool fragmentsAligned = true;
  for (size_t mtu = kMinMtuPayload; mtu <= kMaxDatagramBytes; mtu += 97) {
    const size_t f = maxFragmentBytes(mtu);
    fragmentsAligned = fragmentsAligned && f % 8 == 0 && f + kDataHeaderBytes <= mtu &&
                       f + kDataHeaderBytes + 8 > mtu;
  }
  CHECK(fragmentsAligned);
  CHECK_EQ(maxAckRangesFor(1472), kMaxAckRanges);
  // Receive timestamps (one per path) after the ranges, and room left for them.
  CHECK_EQ(maxAckRangesFor(256, kMaxAckTimestamps), size_t{2});  // 56 + 16 x 12 + 8 bytes
  CHECK_EQ(maxAckRangesFor(256), (256 - kAckFixedBytes) / kAckRangeBytes + 1);
  AckFrame stamped;
  stamped.rangeCount = 2;
  stamped.ranges[0] = {90, 100};
  stamped.ranges[1] = {50, 80};
  stamped.ackTimeUs = 1'000'000'007;
  stamped.timestampCount = 2;
  stamped.timestamps[0] = {100, 3};
  stamped.timestamps[1] = {77, 250};
  n = encodeAck(buf, testHeader(), stamped);
  CHECK_EQ(n, ackBytes(2, 2));
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone);
  CHECK(p.ack.ackTimeUs == 1'000'000'007 && p.ack.timestampCount == 2 &&
        p.ack.timestamps[0].packetNumber == 100 && p.ack.timestamps[0].ageUs == 3 &&
        p.ack.timestamps[1].packetNumber == 77 && p.ack.timestamps[1].ageUs == 250 &&
        p.ack.rangeCount == 2 && p.ack.ranges[1].smallest == 50);
  // Cut short, one byte too many, a timestamp of a packet above the largest acknowledged, one
  // received before the clock began, a reserved field set, too many: each is refused.
  sealChecksum({buf.data(), n - 1});
  CHECK(decodePacket({buf.data(), n - 1}, p) == DecodeError::kTruncated);
  stamped.timestamps[1] = {101, 250};
  n = encodeAck(buf, testHeader(), stamped);
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kMalformed);
  stamped.timestamps[1] = {77, 250};
  stamped.ackTimeUs = 200;
  n = encodeAck(buf, testHeader(), stamped);
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kMalformed);
  stamped.ackTimeUs = 1000;
  n = encodeAck(buf, testHeader(), stamped);
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone);
  buf[54] = 1;
  sealChecksum({buf.data(), n});
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kMalformed);
  stamped.timestampCount = kMaxAckTimestamps + 1;
  CHECK(!thrownMessage([&] { encodeAck(buf, testHeader(), stamped); }).empty());
  // A version-3 peer's datagram is dropped as such, not misread.
  n = encodeAck(buf, testHeader(), empty);
  buf[0] = 3;
  sealChecksum({buf.data(), n});
  CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kBadVersion);
  CHECK(maxCtsIdsFor(256) >= 1);
}

// What the receive timestamps of one path say (one_way_delay.h), by hand: a path of 1 us per
// byte (1000-byte packets, 1 ms each) and 100 us of propagation, the peer's clock 5000 us
// ahead of ours.
void testOneWayDelays() {
  OneWayDelays d;
  constexpr TimeUs kOffset = 5000;
  CHECK(!d.known(0) && d.queueDelayUs(0) == 0 && d.drainUsPerByte(0) == 0);
  // Packets 1-3 sent at once at t=0: they drain 1 ms apart behind the first.
  d.onTimestamp(0, 1000, 0, kOffset + 1100);
  d.onTimestamp(0, 2000, 0, kOffset + 2100);
  d.onTimestamp(0, 3000, 0, kOffset + 3100);
  CHECK(d.known(0));
  CHECK(std::abs(d.drainUsPerByte(0) - 1.0) < 1e-9);
  CHECK_EQ(d.queueDelayUs(0), DurationUs{2000});
  CHECK_EQ(d.lastSentTime(0), TimeUs{0});
  // An idle gap (the later packet did not wait) is no drain-time sample, and the queue is
  // gone; an older packet (a reordered ACK) changes nothing; other paths are apart.
  d.onTimestamp(0, 4000, 10'000, kOffset + 10'100);
  CHECK(std::abs(d.drainUsPerByte(0) - 1.0) < 1e-9);
  CHECK_EQ(d.queueDelayUs(0), DurationUs{0});
  d.onTimestamp(0, 3500, 0, kOffset + 20'000);
  CHECK_EQ(d.lastSentTime(0), TimeUs{10'000});
  CHECK_EQ(d.queueDelayUs(0), DurationUs{0});
  // Two packets back to back at half the rate: the average moves 1/8 of the way.
  d.onTimestamp(0, 5000, 20'000, kOffset + 20'100);
  d.onTimestamp(0, 6000, 20'000, kOffset + 22'100);
  CHECK(std::abs(d.drainUsPerByte(0) - (1.0 + (2.0 - 1.0) / 8)) < 1e-9);
  CHECK_EQ(d.queueDelayUs(0), DurationUs{2000});
  CHECK(!d.known(1) && d.queueDelayUs(1) == 0);
}

void testConfig() {
  const UdpConfig d;
  CHECK_EQ(describe(parseUdpConfig(describe(d))), describe(d));
  CHECK_EQ(d.mtuPayload, size_t{1472});
  const UdpConfig c = parseUdpConfig(
      " mtu_payload = 8972, loss_recovery=go_back_n ,congestion=aimd,rto_min_us=200,"
      "unexpected_bytes=4M,eager_max_bytes=256K,");
  CHECK(c.mtuPayload == 8972 && c.lossRecovery == "go_back_n" && c.congestion == "aimd" &&
        c.rtoMinUs == 200 && c.unexpectedBytes == (4u << 20) && c.eagerMaxBytes == (256u << 10));
  CHECK_EQ(parseUdpConfig("mtu_payload=65507").mtuPayload, size_t{65507});

  const auto err = [](const std::string& text) {
    return thrownMessage([&] { parseUdpConfig(text); });
  };
  std::string e = err("mtu_payload=100");
  CHECK_MSG(contains(e, "mtu_payload") && contains(e, "256") && contains(e, "65507"), e);
  e = err("mtu_payload=70000");
  CHECK_MSG(contains(e, "mtu_payload"), e);
  e = err("loss_recovery=fast");
  CHECK_MSG(contains(e, "loss_recovery") && contains(e, "selective_repeat") &&
                contains(e, "go_back_n") && contains(e, "'fast'"),
            e);
  e = err("congestion=cubic");
  CHECK_MSG(contains(e, "congestion") && contains(e, "none") && contains(e, "aimd"), e);
  e = err("bogus=1");
  CHECK_MSG(contains(e, "unknown key 'bogus'") && contains(e, "mtu_payload"), e);
  e = err("rto_min_us=5000,rto_max_us=1000");
  CHECK_MSG(contains(e, "rto_min_us"), e);
  e = err("eager_max_bytes=2M");
  CHECK_MSG(contains(e, "eager_max_bytes") && contains(e, "unexpected_bytes"), e);
  e = err("rto_min_us=-5");
  CHECK_MSG(contains(e, "rto_min_us") && contains(e, "integer"), e);
  e = err("ack_every=0");
  CHECK_MSG(contains(e, "ack_every"), e);
  e = err("mtu_payload");
  CHECK_MSG(contains(e, "key=value"), e);
  e = err("ack_every=2,ack_every=3");
  CHECK_MSG(contains(e, "twice"), e);
  e = err("send_window_bytes=99999999999999999999999");
  CHECK_MSG(contains(e, "send_window_bytes"), e);
  e = err("mtu_payload=9000,send_window_bytes=4096");
  CHECK_MSG(contains(e, "send_window_bytes") && contains(e, "mtu_payload"), e);

  // The automatic window: half the peer's granted buffer over the ranks that send to it,
  // within [send_window_bytes, send_window_max_bytes] (1 MiB and 8 MiB by default).
  {
    constexpr uint64_t MiB = uint64_t{1} << 20;
    const UdpConfig d;
    CHECK_EQ(sendWindowFor(d, 16 * MiB, 1), 8 * MiB);   // root's 16 MiB, one peer
    CHECK_EQ(sendWindowFor(d, 16 * MiB, 3), 16 * MiB / 6);
    CHECK_EQ(sendWindowFor(d, 64 * MiB, 1), 8 * MiB);   // the ceiling
    CHECK_EQ(sendWindowFor(d, 425984, 1), 1 * MiB);     // the stock cap: the floor (warned)
    CHECK_EQ(sendWindowFor(d, 16 * MiB, 31), 1 * MiB);
    CHECK_EQ(sendWindowFor(d, 16 * MiB, 0), 1 * MiB);
    const UdpConfig fixed = parseUdpConfig("send_window_max_bytes=0");
    CHECK_EQ(sendWindowFor(fixed, 16 * MiB, 1), 1 * MiB);
    const UdpConfig big = parseUdpConfig("send_window_bytes=2M,send_window_max_bytes=32M");
    CHECK_EQ(sendWindowFor(big, 16 * MiB, 1), 8 * MiB);
    CHECK_EQ(sendWindowFor(big, 128 * MiB, 1), 32 * MiB);
    CHECK_EQ(sendWindowFor(big, 2 * MiB, 1), 2 * MiB);
    // A connection holds what it is given, and never less than one datagram.
    PeerConnection c(d, PeerIdentity{});
    CHECK_EQ(c.sendWindowBytes(), 1 * MiB);
    c.setSendWindowBytes(8 * MiB);
    CHECK_EQ(c.sendWindowBytes(), 8 * MiB);
    CHECK_EQ(c.stats().sendWindowBytes, 8 * MiB);
    c.setSendWindowBytes(0);
    CHECK_EQ(c.sendWindowBytes(), uint64_t{d.mtuPayload});
    // And sends up to it: with nothing acknowledged, what goes out of a large message stops
    // within one datagram of the window, whatever send_window_bytes says.
    for (const uint64_t window : {1 * MiB, 4 * MiB}) {
      PeerIdentity ia, ib;
      ia.peerRank = 1;
      ib.localRank = 1;
      PeerConnection a(d, ia), b(d, ib);
      a.setSendWindowBytes(window);
      std::vector<uint8_t> data(16 * MiB, 7), got(16 * MiB);
      b.postReceive(5, ~Tag{0}, got.data(), got.size());
      a.send(5, data.data(), data.size());
      std::vector<uint8_t> wire(d.mtuPayload);
      const TimeUs now = 1000;
      // The RTS one way, the CTS back; then the data, which nobody acknowledges.
      while (const size_t n = a.pollTransmit(now, wire)) b.onDatagram({wire.data(), n}, now);
      while (const size_t n = b.pollTransmit(now, wire)) a.onDatagram({wire.data(), n}, now);
      while (a.pollTransmit(now, wire) != 0) {
      }
      CHECK_MSG(a.bytesInFlight() <= window && a.bytesInFlight() + d.mtuPayload > window,
                std::to_string(a.bytesInFlight()) + " bytes in flight, window " +
                    std::to_string(window));
    }
  }

  const FaultConfig f = parseFaultConfig("drop=0.01,dup=0.001,reorder=0.02,seed=7");
  CHECK(f.drop == 0.01 && f.duplicate == 0.001 && f.reorder == 0.02 && f.seed == 7 &&
        f.delay == 0 && f.corrupt == 0);
  CHECK(parseFaultConfig("").any() == false);
  const FaultConfig g = parseFaultConfig(describe(f));
  CHECK(g.drop == f.drop && g.duplicate == f.duplicate && g.seed == f.seed);
  e = thrownMessage([] { parseFaultConfig("drop=1.5"); });
  CHECK_MSG(contains(e, "drop") && contains(e, "0 to 1"), e);
  e = thrownMessage([] { parseFaultConfig("jitter=0.1"); });
  CHECK_MSG(contains(e, "unknown key 'jitter'") && contains(e, "reorder"), e);
  e = thrownMessage([] { parseFaultConfig("seed=x"); });
  CHECK_MSG(contains(e, "seed"), e);
  e = thrownMessage([] { parseFaultConfig("corrupt=nan"); });
  CHECK_MSG(contains(e, "corrupt"), e);

  // Policies are found by name, and only by the names listed.
  for (const auto& name : lossRecoveryNames()) {
    UdpConfig x;
    x.lossRecovery = name;
    CHECK_EQ(std::string(makeLossRecovery(x)->name()), name);
  }
  for (const auto& name : congestionControlNames()) {
    UdpConfig x;
    x.congestion = name;
    CHECK_EQ(std::string(makeCongestionControl(x)->name()), name);
  }
  UdpConfig x;
  x.congestion = "bbr";
  e = thrownMessage([&] { makeCongestionControl(x); });
  CHECK_MSG(contains(e, "bbr") && contains(e, "aimd"), e);
  e = thrownMessage([&] { PeerConnection conn(x, PeerIdentity{}); });
  CHECK_MSG(contains(e, "congestion"), e);
}

void testFaults() {
  std::vector<uint8_t> dg(1000, 0x42);
  const auto trace = [&](const FaultConfig& c, int count) {
    FaultInjector inj(c);
    std::vector<uint64_t> t;
    std::vector<FaultInjector::Delivery> out;
    for (int i = 0; i < count; ++i) {
      out.clear();
      inj.apply(dg, out);
      uint64_t h = out.size();
      for (const auto& d : out) h = h * 31 + d.extraDelayUs * 7 + crc32c(d.bytes.data(), d.bytes.size());
      t.push_back(h);
    }
    return t;
  };
  FaultConfig c = parseFaultConfig("drop=0.1,dup=0.05,reorder=0.1,delay=0.05,corrupt=0.05,seed=9");
  CHECK(trace(c, 5000) == trace(c, 5000));  // reproducible
  FaultConfig c2 = c;
  c2.seed = 10;
  CHECK(trace(c, 5000) != trace(c2, 5000));
  // Rates.
  FaultInjector inj(c);
  std::vector<FaultInjector::Delivery> out;
  const int n = 100'000;
  uint64_t corruptedButAccepted = 0, corruptedCopies = 0;
  std::vector<uint8_t> valid(kMaxDatagramBytes);
  DataHeader d;
  d.messageLength = 1000;
  d.fragmentLength = 1000;
  const size_t vn = encodeData(valid, testHeader(), 1, d, dg.data());
  valid.resize(vn);
  DecodedPacket p;
  for (int i = 0; i < n; ++i) {
    out.clear();
    inj.apply(valid, out);
    for (const auto& del : out) {
      if (del.bytes != valid) {
        ++corruptedCopies;
        if (decodePacket(del.bytes, p) == DecodeError::kNone) ++corruptedButAccepted;
      }
    }
  }
  const auto& k = inj.counters();
  const auto near = [](uint64_t count, double expect) {
    return std::abs(static_cast<double>(count) - expect) < 0.1 * expect + 50;
  };
  CHECK_MSG(near(k.dropped, 0.1 * n), std::to_string(k.dropped));
  CHECK_MSG(near(k.duplicated, 0.05 * 0.9 * n), std::to_string(k.duplicated));
  CHECK_MSG(near(k.reordered, 0.1 * 0.9 * 1.05 * n), std::to_string(k.reordered));
  CHECK_MSG(near(k.corrupted, 0.05 * 0.9 * 1.05 * n), std::to_string(k.corrupted));
  CHECK(corruptedCopies > 1000);
  // CRC32C detects every 1- to 3-bit error at this length: corruption becomes loss.
  CHECK_EQ(corruptedButAccepted, uint64_t{0});
}

// aimd under path_policy=adaptive: a window per path, OLIA-coupled (congestion_coupled.h).
void testCoupledWindows() {
  CoupledAimdCongestionControl c(4, 32, 2);
  CHECK(c.pathWindows() == &c);
  for (uint32_t p = 0; p < 4; ++p) CHECK_EQ(c.pathWindowPackets(p), uint64_t{8});  // 32 / 4
  CHECK_EQ(c.windowPackets(), uint64_t{32});
  CHECK(c.pathHasRoom(1, 7) && !c.pathHasRoom(1, 8));
  // A loss on path 1 halves path 1's window and no other.
  c.onPathLost(1, 5, 100, 1);
  CHECK_EQ(c.pathWindowPackets(1), uint64_t{4});
  for (uint32_t p : {0u, 2u, 3u}) CHECK_EQ(c.pathWindowPackets(p), uint64_t{8});
  c.onPathLost(1, 50, 110, 2);  // sent before the cut: the same round, no second cut
  CHECK_EQ(c.pathWindowPackets(1), uint64_t{4});
  // Every loss of that cut shown late (acknowledged after all): the cut is undone.
  c.onPathSpuriousLoss(1);
  c.onPathSpuriousLoss(1);
  CHECK_EQ(c.pathWindowPackets(1), uint64_t{4});
  c.onPathSpuriousLoss(1);
  CHECK_EQ(c.pathWindowPackets(1), uint64_t{8});
  // Congestion avoidance on four equal paths of 5 packets: OLIA adds 1/80 per ACK
  // ((w / rtt^2) / (sum w / rtt)^2 = 5 / 20^2; every path has the largest window, so none
  // takes window from another), so 400 ACKs (twenty round trips) grow the total by 4 to 5
  // packets, as one Reno window on one of the paths would grow in 20 of its round trips;
  // four uncoupled Reno windows would grow each path to about 15 (60 in all).
  CoupledAimdCongestionControl d(4, 40, 2);
  for (uint32_t p = 0; p < 4; ++p) {
    d.setPathRtt(p, 100);
    d.onPathLost(p, 1, 1, 1);  // each at 5: out of slow start
  }
  for (int i = 0; i < 100; ++i) {
    for (uint32_t p = 0; p < 4; ++p) d.onPathAcked(p, 2, 3);
  }
  CHECK_MSG(d.windowPackets() == 24, std::to_string(d.windowPackets()));
  // OLIA moves window to a path whose losses are further apart: path 1 (30 packets between
  // its cuts, about 6 after the second) against path 0 (10, no packet acknowledged since its
  // cut). Per ACK on path 1: 5.x / 100^2 / (15.x / 100)^2 + (1 / 2) / 5.x, about 0.12, so 30
  // ACKs add about 3 packets (LIA: max_j(w_j / rtt_j^2) / (sum_j w_j / rtt_j)^2, about 0.04,
  // 1.2 packets). Path 0, of the largest window, gives: 10 / 100^2 / (15.x / 100)^2 - (1 / 2)
  // / 10 < 0 per ACK.
  CoupledAimdCongestionControl e(2, 40, 2);
  for (uint32_t p = 0; p < 2; ++p) {
    e.setPathRtt(p, 100);
    e.onPathLost(p, 1, 1, 1);  // each at 10: out of slow start
  }
  for (int i = 0; i < 30; ++i) e.onPathAcked(1, 2, 3);
  e.onPathLost(1, 4, 5, 1);
  const uint64_t before = e.pathWindowPackets(1);
  CHECK_MSG(before >= 5 && before <= 6, std::to_string(before));
  for (int i = 0; i < 30; ++i) {
    e.onPathAcked(1, 6, 7);
    e.onPathAcked(0, 6, 7);
  }
  CHECK_MSG(e.pathWindowPackets(1) >= before + 2, std::to_string(e.pathWindowPackets(1)));
  CHECK_MSG(e.pathWindowPackets(0) <= 9, std::to_string(e.pathWindowPackets(0)));
  // A timeout blames no path: every window to the floor.
  d.onRetransmissionTimeout(10);
  for (uint32_t p = 0; p < 4; ++p) CHECK_EQ(d.pathWindowPackets(p), uint64_t{2});
  // A standing queue halves the path's window, once per round, and never below the floor it
  // is given (the path's bandwidth-delay product, which a window fills without a queue).
  CoupledAimdCongestionControl q(2, 40, 2);  // 20 per path
  CHECK(q.onPathQueue(0, 5, 10, 6.0));
  CHECK_EQ(q.pathWindowPackets(0), uint64_t{10});
  CHECK(!q.onPathQueue(0, 8, 12, 6.0));  // sent before that cut: the same round
  CHECK(q.onPathQueue(0, 20, 30, 6.0));
  CHECK_EQ(q.pathWindowPackets(0), uint64_t{6});  // half would be 5
  CHECK(!q.onPathQueue(0, 40, 50, 6.0));          // at the floor: no cut
  CHECK_EQ(q.pathWindowPackets(0), uint64_t{6});
  CHECK_EQ(q.pathWindowPackets(1), uint64_t{20});
  CHECK(q.onPathQueue(1, 40, 50));  // no floor given: the windows' own
  CHECK_EQ(q.pathWindowPackets(1), uint64_t{10});
}

void testRttAndCongestion() {
  RttEstimator r(1000);
  CHECK(!r.hasSample());
  CHECK_EQ(r.smoothed(), DurationUs{1000});
  r.onSample(100, 0, 100);
  CHECK(r.smoothed() == 100 && r.min() == 100 && r.variation() == 50);
  for (int i = 0; i < 50; ++i) r.onSample(100, 0, 100);
  CHECK(r.smoothed() == 100 && r.variation() < 5);
  // The RTO floor is in microseconds and honoured; so is the cap.
  CHECK_EQ(r.retransmissionTimeout(0, 300, 1'000'000), DurationUs{300});
  CHECK_EQ(r.retransmissionTimeout(0, 1, 1'000'000), DurationUs{100 + std::max<DurationUs>(4 * r.variation(), 1)});
  CHECK_EQ(r.retransmissionTimeout(0, 1, 50), DurationUs{50});
  // ACK delay is subtracted, but never below min RTT.
  r.onSample(300, 150, 1000);
  CHECK(r.latest() == 300 && r.min() == 100);
  RttEstimator q(1000);
  q.onSample(100, 0, 1000);
  q.onSample(120, 500, 1000);  // 120 < 100 + 500: the delay is not believed
  CHECK(q.smoothed() >= 100);

  AimdCongestionControl a(10, 2);
  CHECK_EQ(a.windowPackets(), uint64_t{10});
  for (int i = 0; i < 10; ++i) a.onPacketAcked(1, 2);
  CHECK_EQ(a.windowPackets(), uint64_t{20});  // slow start: +1 per ACK
  a.onPacketsLost(5, 100);
  CHECK_EQ(a.windowPackets(), uint64_t{10});  // halved
  a.onPacketsLost(50, 110);                   // sent before the reduction: same round
  CHECK_EQ(a.windowPackets(), uint64_t{10});
  for (int i = 0; i < 10; ++i) a.onPacketAcked(120, 130);
  CHECK_EQ(a.windowPackets(), uint64_t{11});  // congestion avoidance: +1 per window of ACKs
  a.onRetransmissionTimeout(200);
  CHECK_EQ(a.windowPackets(), uint64_t{2});
  NoCongestionControl none;
  none.onPacketsLost(1, 2);
  CHECK(none.windowPackets() > 1'000'000);
  testCoupledWindows();
}

void testLossless() {
  for (const std::string& policy : kPolicies) {
    for (const std::string mtu : {"1472", "8972", "65507"}) {
      TransferPlan plan;
      plan.config = configWith("loss_recovery=" + policy + ",mtu_payload=" + mtu);
      plan.label = "lossless " + policy + " mtu " + mtu;
      plan.flows = {{0, 1, boundarySizes(plan.config)}};
      // Many small messages as well, in both directions.
      plan.flows.push_back({1, 0, std::vector<uint64_t>(300, 100)});
      const TransferOutcome o = runTransfer(plan);
      const Totals& t = o.totals;
      CHECK_MSG(t.retransmittedPackets == 0 && t.declaredLost == 0 && t.rtoExpiries == 0 &&
                    t.duplicateFragments == 0 && t.duplicatePackets == 0 && t.lateAcks == 0,
                plan.label + ": retx=" + std::to_string(t.retransmittedPackets) + " lost=" +
                    std::to_string(t.declaredLost) + " rto=" + std::to_string(t.rtoExpiries));
      CHECK(t.checksumDrops == 0 && t.otherDrops == 0);
      CHECK(t.rendezvous > 0 && t.eager > 0);
      CHECK(t.rttSamples > 0 && t.rttMinUs >= 100);  // two 50 us one-way delays at least
      CHECK(t.goodputBps > 1e8 && t.goodputBps < 10e9);
    }
  }
  // Packets on the wire for one large message: exactly its fragments, plus an RTS.
  TransferPlan plan;
  plan.label = "lossless packet count";
  plan.flows = {{0, 1, {1u << 20}}};
  const TransferOutcome o = runTransfer(plan);
  const uint64_t frag = maxFragmentBytes(plan.config.mtuPayload);
  CHECK_EQ(o.totals.dataPacketsSent, ((1u << 20) + frag - 1) / frag + 1);
}

void testLoss() {
  for (const std::string& policy : kPolicies) {
    for (const double drop : {0.01, 0.10, 0.30}) {
      TransferPlan plan;
      plan.config = configWith("loss_recovery=" + policy);
      plan.label = "drop " + std::to_string(drop).substr(0, 4) + " " + policy;
      FaultConfig f;
      f.drop = drop;
      f.seed = 17;
      plan.forwardFaults = f;
      plan.reverseFaults = f;
      plan.flows = {{0, 1, boundarySizes(plan.config)}, {1, 0, std::vector<uint64_t>(100, 3000)}};
      plan.verbose = true;
      const TransferOutcome o = runTransfer(plan);
      CHECK_MSG(o.totals.retransmittedPackets > 0, plan.label);
      CHECK(o.totals.declaredLost > 0);
    }
  }
}

// go-back-N's receive window of one, packet by packet: what the kInOrder and kRestart flags
// make the receiver keep, whatever its own policy is.
void testGoBackNReceiver() {
  for (const std::string& own : kPolicies) {
    PeerIdentity id;
    id.localRank = 1;
    id.peerRank = 0;
    id.sessionToken = 0x5eed;
    PeerConnection rx(configWith("loss_recovery=" + own), id);
    PacketHeader h;
    h.sourceRank = 0;
    h.token = 0x5eed;
    const std::vector<uint8_t> payload(100, 0x5a);
    MessageId nextMessage = 0;
    const auto data = [&](PacketNumber pn, uint8_t flags) {
      std::vector<uint8_t> b(kDataHeaderBytes + payload.size());
      DataHeader d;
      d.tag = 7;
      d.messageId = nextMessage++;
      d.messageLength = payload.size();
      d.fragmentLength = static_cast<uint16_t>(payload.size());
      d.flags = flags;
      b.resize(encodeData(b, h, pn, d, payload.data()));
      const Stats before = rx.stats();
      rx.onDatagram(b, 1000 + pn);
      const Stats after = rx.stats();
      CHECK_EQ(after.datagramsReceived, before.datagramsReceived + 1);
      return after.dropped(DropReason::kAfterGap) == before.dropped(DropReason::kAfterGap) + 1;
    };
    const auto ping = [&](PacketNumber pn) {
      std::vector<uint8_t> b(kPingBytes);
      b.resize(encodePing(b, h, pn));
      rx.onDatagram(b, 1000 + pn);
    };
    using namespace data_flags;
    const std::string who = "receiver configured " + own;
    CHECK_MSG(!data(0, kInOrder | kRestart), who);  // the first packet starts the run
    CHECK_MSG(data(2, kInOrder), who);              // 1 is missing: discarded
    CHECK_MSG(!data(1, kInOrder), who);             // the gap filled
    CHECK_MSG(!data(2, kInOrder), who);             // now in its turn (it was never kept)
    ping(4);                                        // control packets are always kept...
    CHECK_MSG(data(5, kInOrder), who);              // ...but 3 is still missing
    ping(3);                                        // 3 arrives: the run reaches past 4
    CHECK_MSG(!data(5, kInOrder), who);
    CHECK_MSG(data(9, kInOrder), who);
    CHECK_MSG(!data(10, kInOrder | kRestart), who);  // the sender went back: a new run
    CHECK_MSG(data(8, kInOrder | kRestart), who);    // a restart of an abandoned run
    CHECK_MSG(!data(11, kInOrder), who);
    CHECK_MSG(!data(20, 0), who);  // selective repeat's DATA: kept whatever the gap
    const Stats s = rx.stats();
    CHECK_EQ(s.dropped(DropReason::kAfterGap), uint64_t{4});
    CHECK_EQ(s.datagramsAccepted + s.datagramsDropped, s.datagramsReceived);
    CHECK_EQ(s.payloadBytesReceived, 7 * payload.size());  // packets 0 1 2 5 10 11 20
  }
  // A restart without the in-order flag means nothing: malformed.
  std::vector<uint8_t> b(kDataHeaderBytes);
  DataHeader d;
  d.flags = data_flags::kRestart;
  b.resize(encodeData(b, PacketHeader{}, 0, d, nullptr));
  DecodedPacket p;
  CHECK(decodePacket(b, p) == DecodeError::kMalformed);

  // The same transfer, same losses: go-back-N must pay for its discards, in resends and in
  // time, or it is not go-back-N.
  TransferOutcome by[2];
  for (size_t i = 0; i < kPolicies.size(); ++i) {
    TransferPlan plan;
    plan.config = configWith("loss_recovery=" + kPolicies[i]);
    plan.label = "drop 5% 1 MiB one way " + kPolicies[i];
    plan.forwardFaults = parseFaultConfig("drop=0.05,seed=23");
    plan.flows = {{0, 1, {1u << 20, 1u << 20}}};
    plan.verbose = true;
    by[i] = runTransfer(plan);
  }
  const Totals& sr = by[0].totals;
  const Totals& gbn = by[1].totals;
  CHECK_EQ(sr.afterGapDrops, uint64_t{0});
  CHECK(gbn.afterGapDrops > 100);
  CHECK_MSG(gbn.retransmittedPackets > 3 * sr.retransmittedPackets,
            std::to_string(gbn.retransmittedPackets) + " vs " +
                std::to_string(sr.retransmittedPackets));
  CHECK_MSG(by[1].doneNs > 2 * by[0].doneNs,
            std::to_string(by[1].doneNs) + " vs " + std::to_string(by[0].doneNs));

  // A path whose RTT (40 ms) is far above the RTO assumed before the first sample (3 ms):
  // the first ACKs all come after their packets were given up on. Those late ACKs reset the
  // timeouts (the peer is alive), and yet the RTO must catch up with the path, not livelock.
  for (const std::string& policy : kPolicies) {
    TransferPlan plan;
    plan.config = configWith("loss_recovery=" + policy + ",peer_timeout_us=0");
    plan.label = "40 ms RTT " + policy;
    plan.link.oneWayDelayNs = 20'000'000;
    plan.flows = {{0, 1, {1u << 20}}, {1, 0, {1000}}};
    plan.verbose = true;
    const TransferOutcome o = runTransfer(plan);
    CHECK_MSG(o.completed, plan.label);
    CHECK_MSG(o.totals.rttSmoothedUs >= 40'000, std::to_string(o.totals.rttSmoothedUs));
    CHECK_MSG(o.doneNs < 2'000'000'000, std::to_string(o.doneNs));
  }
}

// Tail losses (the last packet of a burst, with nothing after it to reveal the gap): the
// tail-loss probe finds them in a few RTTs, where the RTO alone waits rto_min_us each time.
void testTailLossProbes() {
  // One single-packet message per run, its data dropped with probability 0.3: whenever it is,
  // nothing follows it, and only a probe or the RTO can find the loss.
  Totals sum[2];
  uint64_t doneNs[2] = {0, 0};
  for (const int probes : {0, 2}) {
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      TransferPlan plan;
      // initial_rtt_us: a path known to be short, as after a first exchange; the RTO's
      // 1 ms floor still applies, the probe's does not.
      plan.config = configWith("initial_rtt_us=100,tail_probes=" + std::to_string(probes));
      plan.label = "tail loss, tail_probes=" + std::to_string(probes);
      plan.forwardFaults = parseFaultConfig("drop=0.3,seed=" + std::to_string(seed));
      plan.flows = {{0, 1, {1000}}};
      const TransferOutcome o = runTransfer(plan);
      CHECK_MSG(o.completed, plan.label);
      Totals& t = sum[probes != 0];
      t.tailProbes += o.totals.tailProbes;
      t.rtoExpiries += o.totals.rtoExpiries;
      t.retransmittedPackets += o.totals.retransmittedPackets;
      doneNs[probes != 0] += o.doneNs;
    }
  }
  std::printf("  tail_probes=0: rto=%llu retx=%llu %.2f ms; tail_probes=2: probes=%llu rto=%llu "
              "retx=%llu %.2f ms (sim, 40 runs)\n",
              (unsigned long long)sum[0].rtoExpiries, (unsigned long long)sum[0].retransmittedPackets,
              doneNs[0] / 1e6, (unsigned long long)sum[1].tailProbes,
              (unsigned long long)sum[1].rtoExpiries, (unsigned long long)sum[1].retransmittedPackets,
              doneNs[1] / 1e6);
  CHECK(sum[0].retransmittedPackets > 5);  // there were tail losses to find
  CHECK_EQ(sum[0].tailProbes, uint64_t{0});
  CHECK(sum[1].tailProbes > 0);
  CHECK_MSG(sum[1].rtoExpiries * 2 < sum[0].rtoExpiries,
            std::to_string(sum[1].rtoExpiries) + " vs " + std::to_string(sum[0].rtoExpiries));
  CHECK_MSG(doneNs[1] * 5 < doneNs[0] * 4,
            std::to_string(doneNs[1]) + " vs " + std::to_string(doneNs[0]));
}

void testImmediateAcks() {
  // ack_every=4 and a long ACK delay: only the two exceptions below may answer at once.
  PeerIdentity id;
  id.localRank = 1;
  id.peerRank = 0;
  id.sessionToken = 0x5eed;
  PeerConnection rx(configWith("ack_every=4,max_ack_delay_us=20000"), id);
  PacketHeader h;
  h.sourceRank = 0;
  h.token = 0x5eed;
  const std::vector<uint8_t> payload(100, 0x5a);
  std::vector<uint8_t> out(1472);
  const auto answersWithAck = [&](TimeUs now) {
    const size_t n = rx.pollTransmit(now, out);
    DecodedPacket p;
    return n > 0 && decodePacket({out.data(), n}, p) == DecodeError::kNone &&
           p.header.type == PacketType::kAck;
  };
  const auto data = [&](PacketNumber pn, MessageId message, uint64_t length, uint64_t offset) {
    std::vector<uint8_t> b(kDataHeaderBytes + payload.size());
    DataHeader d;
    d.tag = 7;
    d.messageId = message;
    d.messageLength = length;
    d.offset = offset;
    d.fragmentLength = static_cast<uint16_t>(payload.size());
    b.resize(encodeData(b, h, pn, d, payload.data()));
    rx.onDatagram(b, 1000);
  };
  data(0, 0, 200, 0);  // half of a two-fragment message: the ACK may wait
  CHECK_MSG(!answersWithAck(1000), "an ACK for a packet that neither completes nor probes");
  std::vector<uint8_t> ping(kPingBytes);
  ping.resize(encodePing(ping, h, 1));
  rx.onDatagram(ping, 1000);
  CHECK_MSG(answersWithAck(1000), "a PING must be answered at once");
  data(2, 0, 200, 100);  // completes message 0: its sender finishes on this ACK
  CHECK_MSG(answersWithAck(1000), "the packet completing a message must be acknowledged at once");
  data(3, 1, 100, 0);  // a one-packet message
  CHECK_MSG(answersWithAck(1000), "a one-packet message must be acknowledged at once");
  data(3, 1, 100, 0);  // the same packet again: a duplicate, acknowledged at once as before
  CHECK(answersWithAck(1000));
  data(4, 1, 100, 0);  // the same bytes under a new number: a resend the sender expects answered
  CHECK_MSG(answersWithAck(1000), "a resent last fragment of a finished message must be "
                                  "acknowledged at once");

  // End to end: whatever a message's packet count, its send completes about one RTT after its
  // last packet leaves, not after the receiver's ACK delay (20 ms here, RTT ~0.1 ms).
  for (const uint64_t size : {uint64_t{1000}, uint64_t{2900}, uint64_t{4300}, uint64_t{100'000},
                              uint64_t{101'500}}) {
    TransferPlan plan;
    plan.config = configWith("ack_every=2,max_ack_delay_us=20000");
    plan.label = "immediate ACK of a completing packet, " + std::to_string(size) + " B";
    plan.flows = {{0, 1, {size}}};
    const TransferOutcome o = runTransfer(plan);
    // A few round trips (~0.1 ms each, plus ~0.1 ms on the wire for 100 kB), and no tail
    // probe: a late last ACK would be found by one (~0.5 ms), not by the 20 ms timer.
    CHECK_MSG(o.completed && o.doneNs < 450'000,
              plan.label + ": done after " + std::to_string(o.doneNs) + " ns");
    CHECK_MSG(o.totals.tailProbes == 0, plan.label + ": " + std::to_string(o.totals.tailProbes) +
                                            " tail probes");
  }

  // The probe timeout leaves the ACK delay out only after a packet the peer acknowledges at
  // once: a two-fragment message, the first fragment sent, then the last.
  {
    PeerIdentity txId;
    txId.localRank = 0;
    txId.peerRank = 1;
    txId.sessionToken = 0x5eed;
    PeerConnection tx(configWith("max_ack_delay_us=500,initial_rtt_us=100,rto_min_us=5000"),
                      txId);
    const std::vector<uint8_t> message(2000, 0x11);  // 1408 + 592 bytes at mtu_payload 1472
    tx.send(7, message.data(), message.size());
    CHECK(tx.pollTransmit(1000, out) > 0);
    const auto afterFirst = tx.nextTimeout();
    CHECK(tx.pollTransmit(1000, out) > 0);
    const auto afterLast = tx.nextTimeout();
    CHECK(afterFirst && afterLast);
    if (afterFirst && afterLast) {
      CHECK_MSG(*afterFirst - *afterLast == 500,
                "probe after a middle fragment at +" + std::to_string(*afterFirst - 1000) +
                    " us, after the last at +" + std::to_string(*afterLast - 1000) +
                    " us: only the latter may skip the 500 us ACK delay");
    }
  }

  // A lost last packet: the packet a tail probe asks about ends a message, so the peer would
  // have acknowledged it at once, and the probe need not wait out the 5 ms ACK delay.
  uint64_t doneNs = 0, resent = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    TransferPlan plan;
    plan.config = configWith("ack_every=2,max_ack_delay_us=5000,initial_rtt_us=100");
    plan.label = "tail probe without the ACK delay";
    plan.forwardFaults = parseFaultConfig("drop=0.3,seed=" + std::to_string(seed));
    plan.flows = {{0, 1, {1000}}};
    const TransferOutcome o = runTransfer(plan);
    CHECK_MSG(o.completed, plan.label);
    doneNs += o.doneNs;
    resent += o.totals.retransmittedPackets;
  }
  std::printf("  tail probe, max_ack_delay_us=5000: %llu resends, %.2f ms in all (sim, 20 runs)\n",
              (unsigned long long)resent, doneNs / 1e6);
  CHECK(resent >= 3);  // there were tail losses to find
  CHECK_MSG(doneNs < resent * 2'000'000, std::to_string(doneNs) + " ns for " +
                                             std::to_string(resent) + " resends");
}

void testDuplication() {
  for (const std::string& policy : kPolicies) {
    TransferPlan plan;
    plan.config = configWith("loss_recovery=" + policy);
    plan.label = "duplicate 20% " + policy;
    plan.forwardFaults = parseFaultConfig("dup=0.2,seed=3");
    plan.reverseFaults = parseFaultConfig("dup=0.2,seed=4");
    plan.flows = {{0, 1, boundarySizes(plan.config)}, {1, 0, std::vector<uint64_t>(50, 0)}};
    plan.verbose = true;
    const TransferOutcome o = runTransfer(plan);
    CHECK(o.totals.duplicatePackets > 100);
    CHECK_EQ(o.totals.retransmittedPackets, uint64_t{0});  // duplicates are not losses
  }
}

void testReordering() {
  for (const std::string& policy : kPolicies) {
    TransferPlan plan;
    plan.config = configWith("loss_recovery=" + policy);
    plan.label = "reorder 20% " + policy;
    plan.forwardFaults = parseFaultConfig("reorder=0.2,reorder_us=30,seed=5");
    plan.reverseFaults = parseFaultConfig("reorder=0.2,reorder_us=30,seed=6");
    plan.flows = {{0, 1, boundarySizes(plan.config)}, {1, 0, std::vector<uint64_t>(50, 5000)}};
    plan.verbose = true;
    const TransferOutcome o = runTransfer(plan);
    if (policy == "go_back_n") {
      // Its receiver keeps nothing that overtook a packet: it discards and waits.
      CHECK_MSG(o.totals.afterGapDrops > 100, std::to_string(o.totals.afterGapDrops));
    } else {
      CHECK(o.totals.outOfOrder > 100);
      CHECK_EQ(o.totals.afterGapDrops, uint64_t{0});
    }
  }
  // A larger reordering threshold absorbs most of the same reordering: only the time
  // threshold (9/8 RTT; the reordering here reaches 30 us of a ~110 us RTT) still fires now
  // and then.
  uint64_t resent[2] = {0, 0};
  for (const int threshold : {3, 64}) {
    TransferPlan plan;
    plan.config = configWith("reorder_threshold=" + std::to_string(threshold));
    plan.label = "reorder 20% threshold " + std::to_string(threshold) + ", one way";
    plan.forwardFaults = parseFaultConfig("reorder=0.2,reorder_us=30,seed=5");
    plan.flows = {{0, 1, {1u << 20}}};
    plan.verbose = true;
    const TransferOutcome o = runTransfer(plan);
    CHECK(o.totals.outOfOrder > 100);
    resent[threshold == 64] = o.totals.retransmittedPackets;
  }
  CHECK_MSG(resent[1] * 10 < resent[0], std::to_string(resent[1]) + " vs " + std::to_string(resent[0]));
}

void testDelayedAcks() {
  for (const std::string& policy : kPolicies) {
    TransferPlan plan;
    plan.config = configWith("loss_recovery=" + policy + ",ack_every=16,max_ack_delay_us=1000");
    plan.label = "delayed acks " + policy;
    // ACKs are also held up in the network now and then: the sender must not give up on
    // packets whose ACKs are merely late.
    plan.reverseFaults = parseFaultConfig("delay=0.05,delay_us=3000,seed=8");
    plan.flows = {{0, 1, boundarySizes(plan.config)}, {0, 1, std::vector<uint64_t>(33, 1)}};
    plan.verbose = true;
    const TransferOutcome o = runTransfer(plan);
    CHECK(o.totals.rttSamples > 0);
  }
  // Delayed ACKs with loss.
  TransferPlan plan;
  plan.config = configWith("ack_every=8,max_ack_delay_us=500");
  plan.label = "delayed acks + 5% drop";
  plan.forwardFaults = parseFaultConfig("drop=0.05,seed=1");
  plan.reverseFaults = parseFaultConfig("drop=0.05,delay=0.1,delay_us=1000,seed=2");
  plan.flows = {{0, 1, boundarySizes(plan.config)}};
  plan.verbose = true;
  runTransfer(plan);
}

void testCorruption() {
  for (const std::string& policy : kPolicies) {
    TransferPlan plan;
    plan.config = configWith("loss_recovery=" + policy);
    plan.label = "corrupt 5% " + policy;
    plan.forwardFaults = parseFaultConfig("corrupt=0.05,seed=21");
    plan.reverseFaults = parseFaultConfig("corrupt=0.05,seed=22");
    plan.flows = {{0, 1, boundarySizes(plan.config)}, {1, 0, std::vector<uint64_t>(50, 2000)}};
    plan.verbose = true;
    const TransferOutcome o = runTransfer(plan);
    CHECK(o.totals.checksumDrops > 20);
    CHECK(o.totals.retransmittedPackets > 0);  // corruption became loss, and was repaired
  }
}

void testMixed() {
  // Everything at once, three nodes all-to-all, both policies, both congestion controllers.
  for (const std::string& policy : kPolicies) {
    for (const std::string cc : {"none", "aimd"}) {
      TransferPlan plan;
      plan.nodes = 3;
      plan.config = configWith("loss_recovery=" + policy + ",congestion=" + cc);
      plan.label = "mixed faults 3 nodes " + policy + " " + cc;
      plan.forwardFaults =
          parseFaultConfig("drop=0.05,dup=0.02,reorder=0.05,delay=0.02,corrupt=0.02,seed=31");
      plan.reverseFaults = plan.forwardFaults;
      for (int a = 0; a < 3; ++a) {
        for (int b = 0; b < 3; ++b) {
          if (a != b) plan.flows.push_back({a, b, {0, 1, 1500, 70'000, 300'000, 17}});
        }
      }
      plan.verbose = true;
      runTransfer(plan);
    }
  }
}

void testUnexpected() {
  // Receives posted 30 ms after the sends: everything arrives unexpected. The receiver's
  // budget (256 KiB) is far below what is sent (~1.9 MB eager-sized, ~1.2 MB rendezvous):
  // the sender must wait for credit, and the receiver never holds more than its budget.
  for (const std::string faults : {"", "drop=0.05,seed=4"}) {
    for (const bool reverse : {false, true}) {
      TransferPlan plan;
      plan.config = configWith("unexpected_bytes=256K,eager_max_bytes=16K");
      plan.label = std::string("unexpected, budget 256K") + (faults.empty() ? "" : " + 5% drop") +
                   (reverse ? ", posted in reverse" : "");
      if (!faults.empty()) {
        plan.forwardFaults = parseFaultConfig(faults);
        plan.reverseFaults = parseFaultConfig(faults);
      }
      std::vector<uint64_t> sizes;
      for (int i = 0; i < 150; ++i) sizes.push_back(i % 10 == 0 ? 0 : 12'000 + i);
      for (int i = 0; i < 4; ++i) sizes.push_back(300'000 + i);
      plan.flows = {{0, 1, sizes}};
      plan.postDelayNs = 30'000'000;
      plan.postInReverse = reverse;
      plan.verbose = true;
      const TransferOutcome o = runTransfer(plan);
      CHECK(o.totals.unexpectedHighWater <= plan.config.unexpectedBytes);
      CHECK(o.totals.unexpectedHighWater > plan.config.unexpectedBytes / 2);
      CHECK(o.totals.creditStalls > 0);
      // Blocked with nothing in flight for 30 ms: zero-window probes kept asking for credit.
      CHECK(o.totals.pings > 0);
      CHECK(o.totals.unexpectedMessages > 10);
      // Short messages fell back to rendezvous when the budget ran low.
      CHECK(o.totals.rendezvous > 4);
    }
  }
}

// Runs `sim` until `pred` holds; checks it did.
void runOrFail(Simulator& sim, const std::function<bool()>& pred, const std::string& what,
               uint64_t maxNs = 5'000'000'000ull) {
  const bool ok = sim.runUntil(pred, maxNs);
  CHECK_MSG(ok, what + " (" + sim.stuckReason() + ")");
}

// A receive into a ReceiveSink (the socket loop's folding receive, Transport::recvFolded):
// every byte of the message, up to the posted capacity, reaches the sink exactly once and
// right, whatever the link drops, duplicates and reorders: a sink that folds must never see
// a byte twice. A rendezvous message posted for first, an eager one that arrived before its
// receive (its buffered bytes go to the sink when the receive comes), and a message longer
// than the receive (truncated: nothing past the capacity).
class CountingSink final : public ReceiveSink {
 public:
  CountingSink(uint64_t bytes, uint64_t key) : hits_(bytes, 0), want_(bytes) {
    fillPattern(want_.data(), bytes, key);
  }
  void write(uint64_t offset, const uint8_t* bytes, size_t length) override {
    if (offset > hits_.size() || length > hits_.size() - offset) {
      ++outside_;
      return;
    }
    for (size_t i = 0; i < length; ++i) {
      ++hits_[offset + i];
      wrong_ += bytes[i] != want_[offset + i];
    }
  }
  // Bytes seen other than once, wrong bytes, and writes past the capacity.
  uint64_t notOnce() const {
    uint64_t n = 0;
    for (const uint32_t h : hits_) n += h != 1;
    return n;
  }
  uint64_t wrong() const { return wrong_; }
  uint64_t outside() const { return outside_; }

 private:
  std::vector<uint32_t> hits_;
  std::vector<uint8_t> want_;  // the sender's pattern
  uint64_t wrong_ = 0;
  uint64_t outside_ = 0;
};

void testReceiveSink() {
  for (const std::string faults : {"", "drop=0.1,dup=0.1,reorder=0.1,seed=21"}) {
    Simulator sim(2, configWith("mtu_payload=1472,eager_max_bytes=16K"), LinkConfig{});
    if (!faults.empty()) {
      sim.setFaults(0, 1, parseFaultConfig(faults));
      sim.setFaults(1, 0, parseFaultConfig(faults + "1"));
    }
    uint64_t received = 0, failed = 0;
    sim.setEventHandler([&](const SimEvent& e) {
      if (e.node != 1) return;
      received += e.event.kind == EventKind::kMessageReceived;
      failed += e.event.kind == EventKind::kReceiveFailed;
    });
    PeerConnection& tx = sim.connection(0, 1);
    PeerConnection& rx = sim.connection(1, 0);
    const std::string label = "receive sink" + (faults.empty() ? "" : " under " + faults);
    const uint64_t big = 300'007, eager = 10'001, longer = 5'000;
    std::vector<uint8_t> a(big), b(eager), c(longer);
    fillPattern(a.data(), big, 71);
    fillPattern(b.data(), eager, 72);
    fillPattern(c.data(), longer, 73);
    CountingSink sinkA(big, 71), sinkB(eager, 72), sinkC(4'000, 73);
    rx.postReceive(1, ~Tag{0}, nullptr, big, &sinkA);
    tx.send(1, a.data(), big);
    tx.send(2, b.data(), eager);
    tx.send(3, c.data(), longer);
    // The eager message arrives whole before its receive.
    sim.runUntil([] { return false; }, 20'000'000);
    CHECK_MSG(rx.unexpectedBytesInUse() > 0, label + ": the eager message was not buffered");
    rx.postReceive(2, ~Tag{0}, nullptr, eager, &sinkB);
    rx.postReceive(3, ~Tag{0}, nullptr, 4'000, &sinkC);
    runOrFail(sim, [&] { return received + failed == 3; }, label);
    for (const CountingSink* s : {&sinkA, &sinkB, &sinkC}) {
      CHECK_MSG(s->notOnce() == 0, label + ": " + std::to_string(s->notOnce()) +
                                       " bytes reached the sink other than once");
      CHECK_EQ(s->wrong(), uint64_t{0});
      CHECK_EQ(s->outside(), uint64_t{0});
    }
    if (!faults.empty()) CHECK(rx.stats().duplicatePackets > 0);
  }
}

void testMatching() {
  // 1. Same tag for every message, 10% loss: receive k must get message k (non-overtaking).
  for (const std::string& policy : kPolicies) {
    TransferPlan plan;
    plan.config = configWith("loss_recovery=" + policy);
    plan.label = "same tag, in order, 10% drop " + policy;
    plan.sameTag = true;
    plan.forwardFaults = parseFaultConfig("drop=0.1,reorder=0.1,seed=12");
    plan.reverseFaults = parseFaultConfig("drop=0.1,seed=13");
    std::vector<uint64_t> sizes;
    for (int i = 0; i < 200; ++i) sizes.push_back((i * 7919) % 5000);
    sizes.push_back(200'000);
    sizes.push_back(0);
    plan.flows = {{0, 1, sizes}};
    runTransfer(plan);
    plan.label += ", posted late";
    plan.postDelayNs = 5'000'000;
    runTransfer(plan);
  }

  std::vector<SimEvent> events;
  const auto eventsOf = [&](EventKind k) {
    std::vector<SimEvent> out;
    for (const auto& e : events) {
      if (e.event.kind == k) out.push_back(e);
    }
    return out;
  };

  // 2. Masks: receives that ignore the low 16 bits (the source rank field of transports/tag.h)
  // take messages in order, and report the sender's full tag.
  {
    Simulator sim(2, UdpConfig{}, LinkConfig{});
    events.clear();
    sim.setEventHandler([&](const SimEvent& e) { events.push_back(e); });
    const Tag base = 0x7000000000000000ull;
    const Tag mask = ~Tag{0xffff};
    std::vector<GuardedBuffer> bufs;
    for (int i = 0; i < 3; ++i) bufs.emplace_back(100);
    std::vector<std::vector<uint8_t>> data(4, std::vector<uint8_t>(100));
    for (int i = 0; i < 4; ++i) fillPattern(data[i].data(), 100, 500 + i);
    PeerConnection& rx = sim.connection(1, 0);
    PeerConnection& tx = sim.connection(0, 1);
    // A message with another tag first: it must not match and stays unexpected.
    tx.send(0x1234, data[3].data(), 100);
    for (int i = 0; i < 3; ++i) tx.send(base | Tag(10 + i), data[i].data(), 100);
    std::vector<ReceiveId> rids;
    for (int i = 0; i < 3; ++i) rids.push_back(rx.postReceive(base, mask, bufs[i].data(), 100));
    runOrFail(sim, [&] { return eventsOf(EventKind::kMessageReceived).size() == 3; }, "masked receives");
    const auto got = eventsOf(EventKind::kMessageReceived);
    for (int i = 0; i < 3 && i < int(got.size()); ++i) {
      CHECK_EQ(got[i].event.id, rids[i]);
      CHECK_EQ(got[i].event.tag, base | Tag(10 + i));
      CHECK_EQ(firstPatternMismatch(bufs[i].data(), 100, 500 + i), uint64_t{100});
    }
    CHECK(rx.unexpectedBytesInUse() > 0);  // the 0x1234 message waits
    GuardedBuffer last(100);
    const ReceiveId r4 = rx.postReceive(0x1234, ~Tag{0}, last.data(), 100);
    runOrFail(sim, [&] { return eventsOf(EventKind::kMessageReceived).size() == 4; }, "late match");
    CHECK_EQ(eventsOf(EventKind::kMessageReceived).back().event.id, r4);
    CHECK_EQ(firstPatternMismatch(last.data(), 100, 503), uint64_t{100});
    CHECK_EQ(rx.unexpectedBytesInUse(), uint64_t{0});
  }

  // 3. Truncation: eager matched, eager unexpected, rendezvous. Never a byte past capacity.
  for (const bool late : {false, true}) {
    for (const uint64_t size : {uint64_t{5000}, uint64_t{300'000}}) {
      Simulator sim(2, UdpConfig{}, LinkConfig{});
      events.clear();
      sim.setEventHandler([&](const SimEvent& e) { events.push_back(e); });
      std::vector<uint8_t> data(size);
      fillPattern(data.data(), size, 9);
      GuardedBuffer buf(1000);
      PeerConnection& rx = sim.connection(1, 0);
      if (!late) rx.postReceive(7, ~Tag{0}, buf.data(), 1000);
      sim.connection(0, 1).send(7, data.data(), size);
      if (late) {
        sim.runUntil([] { return false; }, 2'000'000);
        rx.postReceive(7, ~Tag{0}, buf.data(), 1000);
      }
      runOrFail(sim, [&] { return eventsOf(EventKind::kMessageReceived).size() == 1 &&
                                  eventsOf(EventKind::kSendCompleted).size() == 1; },
                "truncated receive");
      const auto got = eventsOf(EventKind::kMessageReceived);
      if (!got.empty()) {
        CHECK(got[0].event.truncated);
        CHECK_EQ(got[0].event.bytes, size);
      }
      CHECK_EQ(firstPatternMismatch(buf.data(), 1000, 9), uint64_t{1000});
      CHECK(buf.guardsIntact());
    }
  }

  // 4. Cancelling a posted receive, and one half-way through a rendezvous message, which is
  // refused: dropping the rest completed the sender's send for a message nobody received, and
  // a retried receive took the next message in its place (until 2026-11-28).
  {
    Simulator sim(2, UdpConfig{}, LinkConfig{});
    events.clear();
    sim.setEventHandler([&](const SimEvent& e) { events.push_back(e); });
    PeerConnection& rx = sim.connection(1, 0);
    PeerConnection& tx = sim.connection(0, 1);
    GuardedBuffer cancelled(100), second(100);
    const ReceiveId r1 = rx.postReceive(5, ~Tag{0}, cancelled.data(), 100);
    CHECK(rx.cancelReceive(r1));
    CHECK(!rx.cancelReceive(r1));
    std::vector<uint8_t> data(100);
    fillPattern(data.data(), 100, 1);
    tx.send(5, data.data(), 100);
    sim.runUntil([] { return false; }, 1'000'000);
    CHECK(eventsOf(EventKind::kReceiveCancelled).size() == 1);
    CHECK(eventsOf(EventKind::kMessageReceived).empty());
    CHECK(allBytes(cancelled.bytes.data(), cancelled.bytes.size(), kGuardByte));
    const ReceiveId r2 = rx.postReceive(5, ~Tag{0}, second.data(), 100);
    runOrFail(sim, [&] { return eventsOf(EventKind::kMessageReceived).size() == 1; }, "after cancel");
    CHECK_EQ(eventsOf(EventKind::kMessageReceived)[0].event.id, r2);

    const uint64_t big = 4u << 20;
    std::vector<uint8_t> bigData(big);
    fillPattern(bigData.data(), big, 2);
    GuardedBuffer bigBuf(big);
    const ReceiveId r3 = rx.postReceive(6, ~Tag{0}, bigBuf.data(), big);
    tx.send(6, bigData.data(), big);
    runOrFail(sim, [&] { return rx.stats().payloadBytesReceived > 100 + big / 4; }, "part of it");
    CHECK(!rx.cancelReceive(r3));  // its owner cuts the peer off instead
    runOrFail(sim, [&] { return eventsOf(EventKind::kSendCompleted).size() == 2 &&
                                eventsOf(EventKind::kMessageReceived).size() == 2; },
              "the refused cancel leaves the receive to complete");
    CHECK(eventsOf(EventKind::kReceiveCancelled).size() == 1);
    CHECK_EQ(eventsOf(EventKind::kMessageReceived)[1].event.id, r3);
    CHECK_EQ(firstPatternMismatch(bigBuf.data(), big, 2), big);
    sim.runUntilQuiet(1'000'000'000);
    CHECK_EQ(rx.unexpectedBytesInUse(), uint64_t{0});
  }
}

// A CTS naming a rendezvous message whose RTS has not gone out yet: no honest receiver can send
// one (it learns of the message from the RTS). Until 2026-11-28 the sender took it as the
// message's clearance, sent the RTS and then ignored the receiver's real CTS as a repeat, and
// the send waited forever; now it is dropped as a protocol violation, like a CTS for a message
// never sent, and the exchange completes.
void testCtsBeforeRts() {
  UdpConfig c;
  c.eagerMaxBytes = 1000;  // both messages go by rendezvous
  const uint64_t token = 0x5151;
  PeerConnection tx(c, PeerIdentity{0, 1, token});
  PeerConnection rx(c, PeerIdentity{1, 0, token});
  std::vector<uint8_t> first(5000), second(5000);
  fillPattern(first.data(), first.size(), 41);
  fillPattern(second.data(), second.size(), 42);
  GuardedBuffer in1(5000), in2(5000);
  rx.postReceive(1, ~Tag{0}, in1.data(), in1.cap);
  rx.postReceive(2, ~Tag{0}, in2.data(), in2.cap);
  tx.send(1, first.data(), first.size());
  tx.send(2, second.data(), second.size());
  std::vector<uint8_t> out(c.mtuPayload);
  // The first RTS goes out (and is held back); the second message is admitted, its RTS not sent.
  std::vector<uint8_t> heldRts(out.begin(),
                               out.begin() + static_cast<std::ptrdiff_t>(tx.pollTransmit(0, out)));
  PacketHeader h;
  h.sourceRank = 1;
  h.token = token;
  const MessageId early = 1;
  std::vector<uint8_t> cts(ctsBytes(1));
  encodeCts(cts, h, 1000, std::span<const MessageId>(&early, 1));
  const Stats before = tx.stats();
  tx.onDatagram(cts, 0);
  CHECK_EQ(tx.stats().dropped(DropReason::kProtocol) - before.dropped(DropReason::kProtocol),
           uint64_t{1});
  CHECK_EQ(tx.stats().datagramsAccepted, before.datagramsAccepted);
  // Then the honest exchange runs by hand: both sends and both receives complete.
  rx.onDatagram(heldRts, 0);
  int sent = 0, received = 0;
  TimeUs now = 0;
  for (int round = 0; round < 10'000 && (sent < 2 || received < 2); ++round, now += 50) {
    for (PeerConnection* from : {&tx, &rx}) {
      PeerConnection* to = from == &tx ? &rx : &tx;
      if (const auto t = from->nextTimeout(); t && *t <= now) from->onTimeout(now);
      while (const size_t n = from->pollTransmit(now, out)) {
        to->onDatagram(std::span<const uint8_t>(out.data(), n), now);
      }
    }
    while (const auto e = tx.pollEvent()) sent += e->kind == EventKind::kSendCompleted;
    while (const auto e = rx.pollEvent()) received += e->kind == EventKind::kMessageReceived;
  }
  CHECK_EQ(sent, 2);
  CHECK_EQ(received, 2);
  CHECK_EQ(firstPatternMismatch(in1.data(), 5000, 41), uint64_t{5000});
  CHECK_EQ(firstPatternMismatch(in2.data(), 5000, 42), uint64_t{5000});
  CHECK(in1.guardsIntact() && in2.guardsIntact());
}

void testSecurity() {
  // Captures real traffic, then replays tampered copies of it to the receiving side.
  Simulator sim(2, UdpConfig{}, LinkConfig{}, /*token=*/0xabcdef);
  std::vector<std::vector<uint8_t>> fromSender, fromReceiver;
  sim.setTap([&](int from, int, std::span<const uint8_t> b) {
    (from == 0 ? fromSender : fromReceiver).emplace_back(b.begin(), b.end());
  });
  std::vector<SimEvent> events;
  sim.setEventHandler([&](const SimEvent& e) { events.push_back(e); });
  std::vector<uint8_t> data(10'000);
  fillPattern(data.data(), data.size(), 3);
  GuardedBuffer buf(10'000);
  PeerConnection& rx = sim.connection(1, 0);
  PeerConnection& tx = sim.connection(0, 1);
  rx.postReceive(1, ~Tag{0}, buf.data(), buf.cap);
  tx.send(1, data.data(), data.size());
  runOrFail(sim, [&] { return events.size() == 2; }, "baseline transfer");
  sim.runUntilQuiet(1'000'000'000);
  CHECK(!fromSender.empty() && !fromReceiver.empty());
  const std::vector<uint8_t> dataPacket = fromSender.front();

  const Stats before = rx.stats();
  const auto deliver = [&](std::vector<uint8_t> b, bool reseal) {
    if (reseal) sealChecksum(b);
    rx.onDatagram(b, sim.nowUs());
  };
  auto wrongToken = dataPacket;
  wrongToken[8] ^= 1;
  deliver(wrongToken, true);
  auto wrongPeer = dataPacket;
  wrongPeer[2] = 9;
  deliver(wrongPeer, true);
  // The checksum is checked before any length: a cut datagram is a checksum failure, unless
  // it was resealed (then its lengths give it away).
  deliver(std::vector<uint8_t>(dataPacket.begin(), dataPacket.begin() + 30), false);
  deliver(std::vector<uint8_t>(dataPacket.begin(), dataPacket.begin() + 30), true);
  deliver({}, false);
  // A version byte flipped on the way (an intact datagram of another version is the peer's
  // own, another release's, and fails the connection: udp_endpoint_test wire_version).
  auto badVersion = dataPacket;
  badVersion[0] = 7;
  deliver(badVersion, false);
  auto badCrc = dataPacket;
  badCrc[100] ^= 0x10;
  deliver(badCrc, false);
  // An ACK for packets never sent: valid format, impossible content.
  std::vector<uint8_t> ackBuf(200);
  AckFrame forged;
  forged.rangeCount = 1;
  forged.ranges[0] = {0, 1'000'000};
  PacketHeader h;
  h.sourceRank = 0;
  h.token = 0xabcdef;
  ackBuf.resize(encodeAck(ackBuf, h, forged));
  deliver(ackBuf, false);
  // An eager message longer than eager_max_bytes (would make us buffer beyond our promise).
  std::vector<uint8_t> dbuf(2000);
  DataHeader d;
  d.tag = 99;
  d.messageId = 5;
  d.messageLength = 10u << 20;
  d.fragmentLength = 100;
  dbuf.resize(encodeData(dbuf, h, 1000, d, data.data()));
  deliver(dbuf, false);
  // Rendezvous data for a message never announced.
  d.messageLength = 100;
  d.flags = data_flags::kRendezvousData;
  std::vector<uint8_t> rbuf(2000);
  rbuf.resize(encodeData(rbuf, h, 1001, d, data.data()));
  deliver(rbuf, false);
  // A packet number far beyond anything plausible.
  std::vector<uint8_t> pbuf(100);
  pbuf.resize(encodePing(pbuf, h, PacketNumber{1} << 40));
  deliver(pbuf, false);

  const Stats after = rx.stats();
  const auto delta = [&](DropReason r) { return after.dropped(r) - before.dropped(r); };
  CHECK_EQ(delta(DropReason::kBadToken), uint64_t{1});
  CHECK_EQ(delta(DropReason::kWrongPeer), uint64_t{1});
  CHECK_EQ(delta(DropReason::kTruncated), uint64_t{2});
  CHECK_EQ(delta(DropReason::kBadVersion), uint64_t{1});
  CHECK_EQ(delta(DropReason::kBadChecksum), uint64_t{2});
  CHECK_EQ(delta(DropReason::kProtocol), uint64_t{4});
  CHECK_EQ(after.datagramsDropped - before.datagramsDropped, uint64_t{11});
  CHECK_EQ(after.datagramsAccepted, before.datagramsAccepted);
  CHECK(buf.guardsIntact());
  // The session still works.
  events.clear();
  GuardedBuffer buf2(10'000);
  rx.postReceive(2, ~Tag{0}, buf2.data(), buf2.cap);
  tx.send(2, data.data(), data.size());
  runOrFail(sim, [&] { return events.size() == 2; }, "transfer after attacks");
  CHECK_EQ(firstPatternMismatch(buf2.data(), 10'000, 3), uint64_t{10'000});
  // A connection with another token ignores the whole session's traffic.
  PeerIdentity other;
  other.localRank = 1;
  other.peerRank = 0;
  other.sessionToken = 0xabcdee;
  PeerConnection stranger(UdpConfig{}, other);
  for (const auto& b : fromSender) stranger.onDatagram(b, 1);
  CHECK_EQ(stranger.stats().dropped(DropReason::kBadToken), uint64_t(fromSender.size()));
  CHECK_EQ(stranger.stats().datagramsAccepted, uint64_t{0});
  testCtsBeforeRts();
}

void testFuzz() {
  // A corpus of real datagrams of every kind: eager, rendezvous, 0-byte, ACK, CTS, PING.
  UdpConfig config = configWith("unexpected_bytes=64K,eager_max_bytes=8K,mtu_payload=1472");
  Simulator sim(2, config, LinkConfig{}, /*token=*/77);
  std::vector<std::vector<uint8_t>> corpus;
  sim.setTap([&](int, int, std::span<const uint8_t> b) {
    if (corpus.size() < 4000) corpus.emplace_back(b.begin(), b.end());
  });
  sim.setFaults(0, 1, parseFaultConfig("drop=0.05,seed=3"));
  std::vector<std::vector<uint8_t>> payloads;
  for (int i = 0; i < 40; ++i) {
    payloads.emplace_back(i % 8 == 0 ? 0 : (i * 3001) % 40'000);
    fillPattern(payloads.back().data(), payloads.back().size(), i);
    sim.connection(0, 1).send(Tag(i), payloads.back().data(), payloads.back().size());
  }
  sim.runUntil([] { return false; }, 20'000'000);  // unexpected: credit stalls and probes
  std::vector<std::unique_ptr<GuardedBuffer>> sinks;
  for (int i = 0; i < 40; ++i) {
    sinks.push_back(std::make_unique<GuardedBuffer>(payloads[i].size()));
    sim.connection(1, 0).postReceive(Tag(i), ~Tag{0}, sinks.back()->data(), sinks.back()->cap);
  }
  sim.runUntilQuiet(2'000'000'000);
  CHECK(corpus.size() > 100);
  std::map<int, int> kinds;
  for (const auto& c : corpus) ++kinds[c.size() > 1 ? c[1] : 0];
  CHECK(kinds[1] > 0 && kinds[2] > 0 && kinds[3] > 0);

  // The target: a fresh receiving connection with receives posted for the corpus' tags, some
  // with less room than the messages (truncation paths), all guarded.
  PeerIdentity id;
  id.localRank = 1;
  id.peerRank = 0;
  id.sessionToken = 77;
  PeerConnection target(config, id);
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  for (int i = 0; i < 40; ++i) {
    bufs.push_back(std::make_unique<GuardedBuffer>(i % 3 == 0 ? 500 : 40'000));
    target.postReceive(Tag(i), ~Tag{0}, bufs.back()->data(), bufs.back()->cap);
  }
  // And a standalone second sender state: its ACK handling sees mutated ACKs.
  PeerIdentity sid;
  sid.localRank = 1;
  sid.peerRank = 0;
  sid.sessionToken = 77;
  PeerConnection sender(config, sid);
  std::vector<uint8_t> scratch(65536);
  for (int i = 0; i < 200; ++i) {
    sender.send(Tag(i % 40), payloads[i % 40].data(), payloads[i % 40].size());
  }
  while (sender.pollTransmit(0, scratch) > 0) {
  }

  const uint64_t iterations = 200'000;
  Rng rng(2024);
  DecodedPacket p;
  uint64_t decodedOk = 0;
  TimeUs now = 1;
  std::vector<uint8_t> m;
  for (uint64_t i = 0; i < iterations; ++i) {
    const auto& base = corpus[rng.below(corpus.size())];
    m = base;
    const uint64_t strategy = rng.below(9);
    bool reseal = false;
    switch (strategy) {
      case 0:  // random bytes
        m.resize(rng.below(1600));
        for (auto& b : m) b = static_cast<uint8_t>(rng.next());
        if (m.size() >= 2 && rng.chance(0.5)) {
          m[0] = kWireVersion;
          m[1] = static_cast<uint8_t>(1 + rng.below(4));
          reseal = true;
        }
        break;
      case 1:  // bit flips, checksum left stale
      case 2:  // bit flips, checksum recomputed: the deeper checks must hold
        for (uint64_t k = 1 + rng.below(8); k > 0 && !m.empty(); --k) {
          m[rng.below(m.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
        }
        reseal = strategy == 2;
        break;
      case 3:  // truncation
        m.resize(rng.below(m.size() + 1));
        reseal = rng.chance(0.7);
        break;
      case 4: {  // one header field replaced with an interesting value
        static const uint64_t interesting[] = {0,          1,          2,
                                               0xff,       0xffff,     0x10000,
                                               0xffffffff, 1ull << 32, (1ull << 48) + 1,
                                               1ull << 62, ~0ull,      ~0ull - 1};
        const uint64_t v = rng.chance(0.7) ? interesting[rng.below(std::size(interesting))] : rng.next();
        const size_t width = size_t{1} << rng.below(4);  // 1, 2, 4 or 8 bytes
        if (m.size() >= width) {
          const size_t at = rng.below(std::min<size_t>(m.size(), 64) - width + 1);
          for (size_t k = 0; k < width; ++k) m[at + k] = static_cast<uint8_t>(v >> (8 * k));
        }
        reseal = true;
        break;
      }
      case 5:  // extension
        for (uint64_t k = 1 + rng.below(64); k > 0; --k) m.push_back(static_cast<uint8_t>(rng.next()));
        reseal = rng.chance(0.7);
        break;
      case 6:  // two datagrams spliced
      {
        const auto& other = corpus[rng.below(corpus.size())];
        m.resize(rng.below(m.size() + 1));
        m.insert(m.end(), other.begin() + rng.below(other.size()), other.end());
        reseal = true;
        break;
      }
      case 7:  // replay as is (duplicates, late packets)
        break;
      default:  // token or source rank changed
        if (m.size() >= 16) m[rng.chance(0.5) ? 2 : 8 + rng.below(8)] ^= 0x40;
        reseal = true;
        break;
    }
    // A resealed datagram keeps this version: one of another version whose header is intact
    // is a peer of another release and fails the connection (udp_endpoint_test
    // wire_version), which would end the deeper checks. Strategies 0 and 1 still bring other
    // versions, with checksums that fail.
    if (reseal && !m.empty()) m[0] = kWireVersion;
    if (reseal) sealChecksum(m);
    if (decodePacket(m, p) == DecodeError::kNone) ++decodedOk;
    target.onDatagram(m, now);
    if (strategy == 7 || rng.chance(0.3)) sender.onDatagram(m, now);
    now += rng.below(20);
    if (i % 64 == 0) {
      // Let timers and transmissions run too, as a socket loop would.
      if (auto t = target.nextTimeout(); t && *t <= now) target.onTimeout(now);
      if (auto t = sender.nextTimeout(); t && *t <= now) sender.onTimeout(now);
      while (target.pollTransmit(now, scratch) > 0) {
      }
      while (sender.pollTransmit(now, scratch) > 0) {
      }
      while (target.pollEvent()) {
      }
      while (sender.pollEvent()) {
      }
    }
  }
  bool guards = true;
  for (const auto& b : bufs) guards = guards && b->guardsIntact();
  CHECK(guards);
  const Stats s = target.stats();
  CHECK_EQ(s.datagramsReceived, iterations);
  // Every datagram is accounted for: accepted, or dropped with a reason.
  uint64_t byReason = 0;
  for (uint64_t r : s.droppedBy) byReason += r;
  CHECK_EQ(byReason, s.datagramsDropped);
  CHECK_EQ(s.datagramsAccepted + s.datagramsDropped, iterations);
  for (const DropReason r : {DropReason::kTruncated, DropReason::kBadChecksum,
                             DropReason::kMalformed, DropReason::kBadToken,
                             DropReason::kWrongPeer, DropReason::kProtocol,
                             DropReason::kBadVersion, DropReason::kBadType}) {
    CHECK_MSG(s.dropped(r) > 0, std::string("no datagram dropped as ") + dropReasonName(r));
  }
  CHECK(s.datagramsDropped > iterations / 2);
  CHECK(!target.failed());  // every datagram met the checks, none the closed connection's drop
  CHECK(target.unexpectedBytesInUse() <= config.unexpectedBytes);
  const Stats ss = sender.stats();
  CHECK_EQ(ss.datagramsAccepted + ss.datagramsDropped, ss.datagramsReceived);
  std::printf("  fuzz: %llu datagrams, %llu decoded, target accepted %llu dropped %llu\n",
              (unsigned long long)iterations, (unsigned long long)decodedOk,
              (unsigned long long)s.datagramsAccepted, (unsigned long long)s.datagramsDropped);
  std::string reasons;
  for (size_t r = 0; r < s.droppedBy.size(); ++r) {
    reasons += std::string(" ") + dropReasonName(static_cast<DropReason>(r)) + "=" +
               std::to_string(s.droppedBy[r]);
  }
  std::printf("  fuzz drops:%s\n", reasons.c_str());

  // Pure noise never gets past the decoder.
  PeerConnection noiseTarget(config, id);
  uint64_t noiseAccepted = 0;
  for (int i = 0; i < 20'000; ++i) {
    m.resize(rng.below(2000));
    for (auto& b : m) b = static_cast<uint8_t>(rng.next());
    noiseTarget.onDatagram(m, 1);
  }
  noiseAccepted = noiseTarget.stats().datagramsAccepted;
  CHECK_EQ(noiseAccepted, uint64_t{0});
}

void testPeerFailure() {
  struct Case {
    std::string config;
    uint64_t minNs, maxNs;  // when the failure may be declared, after the cut
    bool countOnly;         // peer_timeout_us=0: exactly max_rto_expiries expiries
  };
  // 1 + 2 + 4 + 8 ms of doubling timeouts after a first one of about 1.1 ms; then with a
  // 200 us floor and a 400 us cap (the floor really is in microseconds). With a peer timeout
  // the count is not enough: timeouts go on (at the 400 us cap) until 50 ms have passed
  // without anything new acknowledged.
  const std::vector<Case> cases = {
      {"loss_recovery=selective_repeat,max_rto_expiries=5,peer_timeout_us=0", 15'000'000,
       200'000'000, true},
      {"loss_recovery=go_back_n,max_rto_expiries=5,peer_timeout_us=0", 15'000'000, 200'000'000,
       true},
      {"max_rto_expiries=5,rto_min_us=200,rto_max_us=400,initial_rtt_us=100,peer_timeout_us=0",
       800'000, 3'000'000, true},
      {"max_rto_expiries=5,rto_min_us=200,rto_max_us=400,initial_rtt_us=100,"
       "peer_timeout_us=50000",
       49'000'000, 52'000'000, false},
  };
  for (const Case& c : cases) {
    const std::string policy = c.config;
    UdpConfig config = configWith(c.config);
    Simulator sim(2, config, LinkConfig{});
    std::vector<SimEvent> events;
    sim.setEventHandler([&](const SimEvent& e) { events.push_back(e); });
    const uint64_t size = 8u << 20;
    std::vector<uint8_t> data(size, 1);
    GuardedBuffer buf(size);
    sim.connection(1, 0).postReceive(1, ~Tag{0}, buf.data(), size);
    sim.connection(0, 1).send(1, data.data(), size);
    sim.connection(0, 1).send(2, data.data(), 100);
    sim.runUntil([&] { return sim.connection(1, 0).stats().payloadBytesReceived > size / 8; },
                 1'000'000'000);
    // The peer vanishes: nothing gets through any more, either way.
    sim.setLinkUp(0, 1, false);
    sim.setLinkUp(1, 0, false);
    const uint64_t cutAt = sim.nowNs();
    const auto failedAt = [&]() -> std::optional<uint64_t> {
      for (const auto& e : events) {
        if (e.node == 0 && e.event.kind == EventKind::kPeerFailed) return e.timeNs;
      }
      return std::nullopt;
    };
    runOrFail(sim, [&] { return failedAt().has_value(); }, "peer failure " + policy);
    PeerConnection& tx = sim.connection(0, 1);
    CHECK(tx.failed());
    if (c.countOnly) {
      CHECK_EQ(tx.stats().rtoExpiries, uint64_t{5});
      CHECK_MSG(contains(tx.failure(), "5 retransmission timeouts"), tx.failure());
    } else {
      CHECK_MSG(tx.stats().rtoExpiries > 100, std::to_string(tx.stats().rtoExpiries));
      CHECK_MSG(contains(tx.failure(), "for at least 50 ms"), tx.failure());
    }
    const uint64_t took = failedAt().value_or(0) - cutAt;
    CHECK_MSG(took >= c.minNs && took <= c.maxNs, c.config + ": " + std::to_string(took) + " ns");
    // The short message went out eagerly while the long one waited for its CTS: it completed
    // before the cut. The long one fails.
    std::vector<MessageId> failedSends, completedSends;
    for (const auto& e : events) {
      if (e.node != 0) continue;
      if (e.event.kind == EventKind::kSendFailed) failedSends.push_back(e.event.id);
      if (e.event.kind == EventKind::kSendCompleted) completedSends.push_back(e.event.id);
    }
    CHECK(failedSends == std::vector<MessageId>{0});
    CHECK(completedSends == std::vector<MessageId>{1});
    CHECK(!failedSends.empty() && contains(events.back().event.error, "retransmission timeouts"));
    // After the failure: new sends fail at once, nothing is sent, no timer is left.
    tx.send(3, data.data(), 10);
    uint64_t failedNow = 0;
    while (auto e = tx.pollEvent()) failedNow += e->kind == EventKind::kSendFailed;
    CHECK_EQ(failedNow, uint64_t{1});
    std::vector<uint8_t> scratch(65536);
    CHECK_EQ(tx.pollTransmit(sim.nowUs(), scratch), size_t{0});
    CHECK(!tx.nextTimeout().has_value());
    CHECK(buf.guardsIntact());
    std::printf("  peer failure (%s) declared %.2f ms after the link went down\n", policy.c_str(),
                took / 1e6);
  }
  // A receiver that loses its peer has nothing in flight, so it does not notice by itself:
  // the socket layer's keepalive (issue #4, next step) will. Its receive can be failed by
  // hand, as abortPeer() would.
  Simulator sim(2, UdpConfig{}, LinkConfig{});
  GuardedBuffer buf(100);
  PeerConnection& rx = sim.connection(1, 0);
  rx.postReceive(1, ~Tag{0}, buf.data(), 100);
  rx.fail("aborted by the test");
  int peerFailed = 0, receiveFailed = 0;
  while (auto e = rx.pollEvent()) {
    peerFailed += e->kind == EventKind::kPeerFailed;
    receiveFailed += e->kind == EventKind::kReceiveFailed;
  }
  CHECK(peerFailed == 1 && receiveFailed == 1);
}

// Random plans: configuration, faults, sizes, node count and posting time all drawn from a
// seed, every byte checked as everywhere else. Finds the interleavings nobody wrote a test
// for; a failure names its seed, and reruns identically.
// UDP_SOAK_SEEDS=N runs N seeds instead of 60 (UDP_SOAK_FIRST: the first one).
void testSoak() {
  const char* count = std::getenv("UDP_SOAK_SEEDS");
  const char* first = std::getenv("UDP_SOAK_FIRST");
  const uint64_t begin = first ? std::strtoull(first, nullptr, 10) : 1;
  const uint64_t end = begin + (count ? std::strtoull(count, nullptr, 10) : 60);
  for (uint64_t seed = begin; seed < end; ++seed) {
    Rng rng(seed * 7919);
    const auto pick = [&](std::initializer_list<const char*> options) {
      return std::string(*(options.begin() + rng.below(options.size())));
    };
    const std::string config =
        "loss_recovery=" + pick({"selective_repeat", "go_back_n"}) +
        ",congestion=" + pick({"none", "aimd"}) +
        ",mtu_payload=" + pick({"256", "1472", "1472", "8972"}) +
        ",ack_every=" + pick({"1", "2", "5"}) +
        ",max_ack_delay_us=" + pick({"0", "100", "700"}) +
        ",reorder_threshold=" + pick({"1", "3", "10"}) +
        ",send_window_bytes=" + pick({"16K", "512K"}) +
        ",unexpected_bytes=" + pick({"64K", "1M"}) + ",eager_max_bytes=" + pick({"0", "4K", "32K"}) +
        ",rto_min_us=" + pick({"200", "1000"}) + ",max_rto_expiries=30";
    TransferPlan plan;
    plan.label = "soak seed " + std::to_string(seed) + " [" + config + "]";
    plan.config = configWith(config);
    plan.nodes = 2 + static_cast<int>(rng.below(2));
    const double drop = rng.chance(0.3) ? 0.0 : 0.02 + rng.uniform() * 0.2;
    FaultConfig f;
    f.drop = drop;
    f.duplicate = rng.chance(0.5) ? rng.uniform() * 0.1 : 0;
    f.reorder = rng.chance(0.5) ? rng.uniform() * 0.2 : 0;
    f.delay = rng.chance(0.3) ? rng.uniform() * 0.05 : 0;
    f.corrupt = rng.chance(0.3) ? rng.uniform() * 0.05 : 0;
    f.seed = seed;
    plan.forwardFaults = f;
    f.seed = seed + 1000;
    plan.reverseFaults = f;
    for (int a = 0; a < plan.nodes; ++a) {
      for (int b = 0; b < plan.nodes; ++b) {
        if (a == b || rng.chance(0.3)) continue;
        Flow flow{a, b, {}};
        for (uint64_t k = rng.below(12); k > 0; --k) {
          const uint64_t kind = rng.below(4);
          flow.sizes.push_back(kind == 0 ? rng.below(3) : kind == 1 ? rng.below(3000)
                               : kind == 2 ? rng.below(70'000) : rng.below(600'000));
        }
        plan.flows.push_back(flow);
      }
    }
    plan.sameTag = rng.chance(0.3);
    plan.postDelayNs = rng.chance(0.4) ? rng.below(20'000'000) + 1 : 0;
    // With one tag, receives match messages in posting order: reversing it would pair them
    // differently from what the harness checks.
    plan.postInReverse = !plan.sameTag && rng.chance(0.5);
    runTransfer(plan);
  }
}

// ---------------------------------------------------------------------------------------------
// Measurements (printed, not checked)

// ---------------------------------------------------------------------------------------------
// The protocol lab: the emulated bottleneck, and the congestion and loss-recovery policies
// under it (issue #22).

const std::vector<std::string> kCongestionPolicies = {"none", "aimd", "delay", "ecn", "bdp",
                                                      "credit"};
const std::vector<std::string> kLossPolicies = {"selective_repeat", "go_back_n", "rack"};

std::vector<uint8_t> dataDatagram(size_t payloadBytes, PacketNumber pn = 1) {
  std::vector<uint8_t> payload(payloadBytes, 7), out(kMaxDatagramBytes);
  DataHeader d;
  d.messageLength = payloadBytes;
  d.fragmentLength = static_cast<uint16_t>(payloadBytes);
  out.resize(encodeData(out, testHeader(), pn, d, payload.data()));
  return out;
}

uint8_t dataFlagsOf(const std::vector<uint8_t>& datagram) {
  DecodedPacket p;
  CHECK(decodePacket(datagram, p) == DecodeError::kNone);
  return p.data.flags;
}

void testBottleneck() {
  using Delivery = FaultInjector::Delivery;
  const std::vector<uint8_t> data = dataDatagram(1000);  // 1064 bytes, 1130 on the wire
  const double serializationUs = (1064.0 + kFramingOverheadBytes) * 8 / 1000;  // at 1 Gbit/s

  // A burst of 20 into a queue of 8: drop-tail, the queue's own pace, marks above 4 only.
  {
    FaultInjector inj(parseFaultConfig("rate_mbps=1000,queue=8,mark_above=4,seed=3"));
    std::vector<Delivery> out;
    for (int i = 0; i < 20; ++i) inj.apply(data, 100, out);
    const auto k = inj.counters();
    CHECK_EQ(out.size(), size_t{8});
    CHECK_EQ(k.queueDropped, uint64_t{12});
    CHECK_EQ(k.queueHighWater, uint64_t{8});
    CHECK_EQ(k.marked, uint64_t{4});
    for (size_t i = 0; i < out.size(); ++i) {
      CHECK_EQ(out[i].extraDelayUs,
               static_cast<DurationUs>(std::ceil((i + 1) * serializationUs)));
      const bool marked = dataFlagsOf(out[i].bytes) & data_flags::kCongestionExperienced;
      CHECK_MSG(marked == (i >= 4), "packet " + std::to_string(i) + " found " +
                                        std::to_string(i) + " queued; mark_above=4");
    }
  }
  // Offered at 1.8x the rate for 2000 packets: the departures keep the rate, the queue stays
  // within its size, and what does not fit is dropped.
  {
    FaultInjector inj(parseFaultConfig("rate_mbps=1000,queue=16"));
    std::vector<Delivery> out;
    std::vector<double> arrivals;
    for (int i = 0; i < 2000; ++i) {
      out.clear();
      const TimeUs now = 1000 + static_cast<TimeUs>(i * serializationUs / 1.8);
      inj.apply(data, now, out);
      for (const auto& d : out) arrivals.push_back(static_cast<double>(now + d.extraDelayUs));
    }
    const auto k = inj.counters();
    CHECK(k.queueHighWater <= 16);
    CHECK(k.queueDropped > 800);
    const double spanUs = arrivals.back() - arrivals.front();
    const double mbps = (arrivals.size() - 1) * (1064.0 + kFramingOverheadBytes) * 8 / spanUs;
    CHECK_MSG(mbps <= 1000 * 1.01 && mbps >= 1000 * 0.97, std::to_string(mbps) + " Mbit/s");
  }
  // Trimming: above 4 queued, DATA loses its payload and overtakes the queue; ACKs (and
  // anything not DATA) are never marked or trimmed, only queued or dropped.
  {
    FaultInjector inj(parseFaultConfig("rate_mbps=1000,queue=8,trim_above=4,mark_above=2"));
    std::vector<Delivery> out;
    for (int i = 0; i < 20; ++i) inj.apply(data, 100, out);
    const auto k = inj.counters();
    CHECK_EQ(k.trimmed, uint64_t{16});
    CHECK_EQ(k.queueDropped, uint64_t{0});
    CHECK_EQ(k.queueHighWater, uint64_t{4});
    size_t trimmed = 0;
    for (const auto& d : out) {
      DecodedPacket p;
      CHECK(decodePacket(d.bytes, p) == DecodeError::kNone);
      if (!(p.data.flags & data_flags::kTrimmed)) continue;
      ++trimmed;
      CHECK(d.bytes.size() == kDataHeaderBytes && p.payload.empty() &&
            p.data.fragmentLength == 1000 && d.extraDelayUs == 0);
    }
    CHECK_EQ(trimmed, size_t{16});
    AckFrame a;
    a.rangeCount = 1;
    a.ranges[0] = {0, 5};
    std::vector<uint8_t> ack(kMaxDatagramBytes);
    ack.resize(encodeAck(ack, testHeader(), a));
    FaultInjector acks(parseFaultConfig("rate_mbps=1000,queue=8,trim_above=4,mark_above=2"));
    out.clear();
    for (int i = 0; i < 20; ++i) acks.apply(ack, 100, out);
    CHECK(out.size() == 8 && acks.counters().trimmed == 0 && acks.counters().marked == 0);
    for (const auto& d : out) CHECK(d.bytes == ack);
  }
  // Gilbert-Elliott: the stationary loss rate enter / (enter + leave), in bursts.
  {
    FaultInjector inj(parseFaultConfig("ge_enter=0.01,ge_leave=0.1,seed=5"));
    std::vector<Delivery> out;
    uint64_t lost = 0, runs = 0;
    bool inRun = false;
    const int n = 200'000;
    for (int i = 0; i < n; ++i) {
      out.clear();
      inj.apply(data, out);
      const bool l = out.empty();
      lost += l;
      if (l && !inRun) ++runs;
      inRun = l;
    }
    const double rate = static_cast<double>(lost) / n;
    CHECK_MSG(std::abs(rate - 0.01 / 0.11) < 0.015, std::to_string(rate));
    CHECK_EQ(inj.counters().burstDropped, lost);
    const double meanRun = static_cast<double>(lost) / static_cast<double>(runs);
    CHECK_MSG(meanRun > 7 && meanRun < 13, std::to_string(meanRun));  // 1 / leave = 10
  }
  // Paths: sections after the first start from it and have their own seed and state.
  {
    const auto paths = parseFaultPaths("rate_mbps=1000,queue=8,seed=4;drop=1;queue=2");
    CHECK_EQ(paths.size(), size_t{3});
    CHECK(paths[1].rateMbps == 1000 && paths[1].drop == 1.0 && paths[1].seed != paths[0].seed);
    CHECK(paths[2].queue == 2 && paths[2].seed != paths[1].seed);
    FaultInjector inj(paths);
    std::vector<Delivery> out;
    for (int i = 0; i < 5; ++i) inj.apply(data, 100, out, 0);
    CHECK_EQ(out.size(), size_t{5});
    out.clear();
    for (int i = 0; i < 5; ++i) inj.apply(data, 100, out, 1);
    CHECK(out.empty() && inj.pathCounters(1).dropped == 5);
    for (int i = 0; i < 5; ++i) inj.apply(data, 100, out, 2);
    CHECK(out.size() == 2 && inj.pathCounters(2).queueDropped == 3);
    CHECK(inj.counters().seen == 15);
    CHECK(contains(thrownMessage([] { parseFaultConfig("drop=0.1;drop=0.2"); }), "paths"));
  }
  // Reproducible: the same seed gives the same decisions, delays and bytes.
  {
    const auto trace = [&](const std::string& spec) {
      FaultInjector inj(parseFaultConfig(spec));
      std::vector<Delivery> out;
      uint64_t h = 0;
      for (int i = 0; i < 5000; ++i) {
        out.clear();
        inj.apply(data, static_cast<TimeUs>(i * 4), out);
        for (const auto& d : out) {
          h = mix64(h ^ d.extraDelayUs) ^ crc32c(d.bytes.data(), d.bytes.size());
        }
        h = mix64(h + out.size());
      }
      return h;
    };
    const std::string spec =
        "rate_mbps=1000,queue=32,mark_above=8,trim_above=24,ge_enter=0.01,ge_leave=0.2,"
        "dup=0.05,reorder=0.1,corrupt=0.02,seed=";
    CHECK_EQ(trace(spec + "7"), trace(spec + "7"));
    CHECK(trace(spec + "7") != trace(spec + "8"));
  }
}

void testLabPolicies() {
  // delay: +1 packet per window of ACKs below the target; above it, a cut in proportion to
  // the excess, at most half, at most once per round trip.
  {
    DelayCongestionControl c(10, 2, 50, 0.8);
    AckSignal a;
    a.minRttUs = 100;
    a.smoothedRttUs = 100;
    a.rttSampleUs = 140;
    a.ackedPackets = 10;
    a.now = 1000;
    c.onAck(a);
    CHECK_EQ(c.windowPackets(), uint64_t{11});
    a.rttSampleUs = 100 + 250;  // excess 200 of 250: 1 - 0.8 * 0.8 = 0.36, capped at 0.5
    a.now = 2000;
    c.onAck(a);
    CHECK_EQ(c.windowPackets(), uint64_t{5});
    a.now = 2050;  // within the round trip: no second cut
    c.onAck(a);
    CHECK_EQ(c.windowPackets(), uint64_t{5});
    a.rttSampleUs = 100 + 100;  // excess 50 of 100: x 0.6
    a.now = 2200;
    c.onAck(a);
    CHECK_EQ(c.windowPackets(), uint64_t{3});
    c.onRetransmissionTimeout(3000);
    CHECK_EQ(c.windowPackets(), uint64_t{2});
  }
  // ecn: slow start until the first mark; alpha falls while nothing is marked; a marked
  // round costs alpha / 2 of the window.
  {
    EcnCongestionControl c(10, 2, 1.0 / 16);
    AckSignal a;
    a.smoothedRttUs = 100;
    a.ackedPackets = 10;
    a.now = 1000;
    c.onAck(a);
    CHECK_EQ(c.windowPackets(), uint64_t{20});
    CHECK(c.alpha() < 1.0);
    const double alpha = c.alpha();
    a.markedPackets = 10;
    a.now = 2000;
    c.onAck(a);
    CHECK(c.windowPackets() >= 9 && c.windowPackets() <= 11);  // 20 x (1 - alpha / 2)
    CHECK(c.alpha() >= alpha || c.alpha() > 0.9);
    a.markedPackets = 0;
    a.now = 2300;
    for (int i = 0; i < 10; ++i) c.onAck(a);
    CHECK(c.windowPackets() < 25);  // after a mark: +1 per window, not slow start
  }
  // bdp: initial window until an RTT sample, then link rate x min RTT in packets, plus one;
  // losses do not move it.
  {
    BdpCapCongestionControl c(32, 2, 1000, 1472);
    CHECK_EQ(c.windowPackets(), uint64_t{32});
    AckSignal a;
    a.minRttUs = 100;
    a.ackedPackets = 1;
    c.onAck(a);
    CHECK_EQ(c.windowPackets(), uint64_t{12500 / 1472 + 1});
    c.onPacketsLost(1, 2);
    c.onRetransmissionTimeout(3);
    CHECK_EQ(c.windowPackets(), uint64_t{12500 / 1472 + 1});
  }
  // rack: time only, a window of min RTT / 4 that grows with spurious retransmissions.
  {
    Rack r;
    RttEstimator rtt(1000);
    rtt.onSample(100, 0, 0);
    rtt.onSample(120, 0, 0);
    CHECK_EQ(r.reorderThreshold(3), UINT32_MAX);
    CHECK_EQ(r.lossDelay(rtt), DurationUs{120 + 25});
    r.onSpuriousRetransmission();
    CHECK_EQ(r.lossDelay(rtt), DurationUs{120 + 50});
    for (int i = 0; i < 16; ++i) r.onLossDeclared();
    CHECK_EQ(r.lossDelay(rtt), DurationUs{120 + 25});
    for (int i = 0; i < 100; ++i) r.onSpuriousRetransmission();
    CHECK(r.lossDelay(rtt) <= 120 + rtt.smoothed());
  }
  for (const std::string& cc : kCongestionPolicies) {
    CHECK_EQ(std::string(makeCongestionControl(configWith("congestion=" + cc))->name()), cc);
  }
}

// The bottleneck every lab transfer goes through: a 2 Gbit/s port with a 64-packet queue
// that marks above 16 and trims above 48, in front of the receiver of a 10 Gbit/s link.
const std::string kLabBottleneck = "rate_mbps=2000,queue=64,mark_above=16,trim_above=48";

void testLabFaultMatrix() {
  // Every policy pair delivers every byte exactly once (runTransfer checks each) under each
  // fault of the matrix at 30%, behind the bottleneck, faults on the ACKs too.
  const std::vector<std::string> faults = {"drop=0.3", "dup=0.3", "reorder=0.3", "corrupt=0.3",
                                           "ge_enter=0.05,ge_leave=0.3"};
  // UCXB_CHECK_DIAGONAL=1 (the sanitizer run, tests/test_udp_core.py) runs only the diagonal:
  // every policy and every fault once, not every triple. The sanitizers look for memory and
  // UB errors on code paths, which the diagonal reaches; the plain run checks every triple.
  // Under them the whole matrix was a fifth of the suite's longest test.
  const char* diagonalEnv = std::getenv("UCXB_CHECK_DIAGONAL");
  const bool diagonal = diagonalEnv != nullptr && std::string(diagonalEnv) == "1";
  for (size_t c = 0; c < kCongestionPolicies.size(); ++c) {
    for (size_t l = 0; l < kLossPolicies.size(); ++l) {
      for (size_t k = 0; k < faults.size(); ++k) {
        if (diagonal && (l != c % kLossPolicies.size() || k != c % faults.size())) continue;
        const std::string& cc = kCongestionPolicies[c];
        const std::string& lr = kLossPolicies[l];
        const std::string& f = faults[k];
        TransferPlan plan;
        plan.config = configWith("loss_recovery=" + lr + ",congestion=" + cc);
        plan.label = "lab " + cc + " " + lr + " " + f;
        plan.forwardFaults = parseFaultConfig(kLabBottleneck + "," + f + ",seed=41");
        plan.reverseFaults = parseFaultConfig(f + ",seed=43");
        plan.flows = {{0, 1, {1, 1500, 70'000, 300'000}}, {1, 0, {20'000}}};
        runTransfer(plan);
      }
    }
  }
}

TransferOutcome labFlow(const std::string& config, const std::string& bottleneck,
                        uint64_t bytes, double linkBitsPerSecond = 10e9) {
  TransferPlan plan;
  plan.link.bitsPerSecond = linkBitsPerSecond;
  plan.config = configWith(config);
  plan.label = config + " behind " + bottleneck;
  plan.forwardFaults = parseFaultConfig(bottleneck);
  plan.flows = {{0, 1, {bytes}}};
  return runTransfer(plan);
}

void testLabBottleneckFlow() {
  // One 4 MiB flow into the 2 Gbit/s port: nobody beats the rate, the queue never holds
  // more than its size, and the policies that read the queue (delay, ecn, bdp) keep it from
  // overflowing where none and aimd fill it.
  const uint64_t bytes = 4u << 20;
  std::map<std::string, TransferOutcome> byPolicy;
  for (const std::string& cc : kCongestionPolicies) {
    const TransferOutcome o =
        labFlow("congestion=" + cc + ",cc_link_mbps=2000", kLabBottleneck, bytes);
    const double gbps = o.totals.goodputBps / 1e9;
    std::printf("  %-5s %5.2f ms  goodput %.2f Gb/s  queue max %llu drops %llu marks %llu "
                "trims %llu  retx %llu nacked %llu ce_echoed %llu\n",
                cc.c_str(), o.doneNs / 1e6, gbps, (unsigned long long)o.faults.queueHighWater,
                (unsigned long long)o.faults.queueDropped, (unsigned long long)o.faults.marked,
                (unsigned long long)o.faults.trimmed,
                (unsigned long long)o.totals.retransmittedPackets,
                (unsigned long long)o.totals.packetsNacked,
                (unsigned long long)o.totals.ceEchoed);
    CHECK_MSG(gbps <= 2.0, cc + ": " + std::to_string(gbps) + " Gb/s through a 2 Gb/s port");
    CHECK(o.faults.queueHighWater <= 64);
    // Every mark and trim reached the receiver and came back to the sender.
    CHECK_EQ(o.totals.ceReceived, o.faults.marked);
    CHECK_EQ(o.totals.ceEchoed, o.faults.marked);
    CHECK_EQ(o.totals.trimmedReceived, o.faults.trimmed);
    byPolicy[cc] = o;
  }
  for (const std::string cc : {"delay", "ecn", "bdp"}) {
    const TransferOutcome& o = byPolicy[cc];
    CHECK_MSG(o.totals.goodputBps >= 0.8 * 2e9 * 1408 / 1538,
              cc + ": " + std::to_string(o.totals.goodputBps / 1e9) + " Gb/s");
    CHECK_MSG(o.faults.trimmed + o.faults.queueDropped <
                  byPolicy["none"].faults.trimmed + byPolicy["none"].faults.queueDropped,
              cc + " overflowed the queue as much as none");
  }
}

void testTrimNack() {
  // A congested trimming queue: a 64 KiB message sent at once (congestion=none) from a
  // 100 Gbit/s link into a 2 Gbit/s port that trims above 16 queued. Most of the burst is
  // trimmed, and the trimmed packets are its later ones, so no later packet's ACK reveals
  // them to SACK: it waits for tail probes, where NACK-on-trim resends each at once. In
  // simulated time (deterministic): NACK-on-trim completes the op in 0.39 ms, SACK alone in
  // 1.43 ms (3.6x; 2026-11-26).
  const uint64_t bytes = 64u << 10;
  const std::string bottleneck = "rate_mbps=2000,queue=32,trim_above=16";
  const TransferOutcome nack = labFlow("trim_nack=1", bottleneck, bytes, 100e9);
  const TransferOutcome sack = labFlow("trim_nack=0", bottleneck, bytes, 100e9);
  std::printf("  64 KiB into a trimming queue: NACK-on-trim %.3f ms (%llu nacked), SACK alone "
              "%.3f ms (%llu declared lost, %llu tail probes, %llu rto): %.2fx\n",
              nack.doneNs / 1e6, (unsigned long long)nack.totals.packetsNacked,
              sack.doneNs / 1e6, (unsigned long long)sack.totals.declaredLost,
              (unsigned long long)sack.totals.tailProbes,
              (unsigned long long)sack.totals.rtoExpiries,
              static_cast<double>(sack.doneNs) / static_cast<double>(nack.doneNs));
  CHECK(nack.faults.trimmed > 10 && sack.faults.trimmed > 10);
  CHECK_EQ(nack.totals.packetsNacked, nack.faults.trimmed);
  CHECK_EQ(nack.totals.trimmedReceived, nack.faults.trimmed);
  CHECK(nack.totals.nacksSent > 0);
  CHECK_EQ(sack.totals.nacksSent, uint64_t{0});
  CHECK_EQ(sack.totals.packetsNacked, uint64_t{0});
  CHECK_MSG(2 * nack.doneNs <= sack.doneNs, "NACK-on-trim was not 2x faster than SACK alone");
}

// The issue's incast: nodes 1-3 send `each` bytes at once to node 0, whose 2 Gbit/s downlink
// has a 64-packet queue marking above 16 (links 10 Gbit/s).
TransferPlan incastPlan(const std::string& config, uint64_t each) {
  TransferPlan plan;
  plan.nodes = 4;
  plan.config = configWith(config);
  plan.label = "incast 3 to 1, " + config;
  plan.downlinkFaults = parseFaultConfig("rate_mbps=2000,queue=64,mark_above=16,seed=3");
  plan.flows = {{1, 0, {each}}, {2, 0, {each}}, {3, 0, {each}}};
  return plan;
}

void testIncast() {
  // Three nodes send 2 MiB each to a fourth at once, whose 2 Gbit/s downlink has a 64-packet
  // queue marking above 16 (the issue's incast, in the simulator where time is exact and no
  // host noise blurs it; links 10 Gbit/s). The downlink's rate bounds everyone; what differs
  // is how much each policy overflows the queue and must resend. Three initial windows must
  // fit the queue, or the first round overflows whatever the policy: with the default 32,
  // delay resent 23 packets and ecn 36 (aimd 110). With 16 (2026-11-26): none 50246, aimd
  // 115, bdp 24, delay and ecn 0, every policy at 0.90-0.91x the downlink's 2 Gbit/s (the
  // most the payload can have of it is 1408/1538 = 0.92x).
  const uint64_t each = 2u << 20;
  std::map<std::string, TransferOutcome> by;
  for (const std::string& cc : kCongestionPolicies) {
    const TransferOutcome o = runTransfer(
        incastPlan("congestion=" + cc + ",cc_link_mbps=2000,initial_cwnd_packets=16", each));
    // Goodput at the receiver: every byte of the three flows over the op's time.
    const double gbps = 3.0 * each * 8 / static_cast<double>(o.doneNs);
    std::printf("  incast %-5s %6.2f ms  %.2f Gb/s (%.2fx the downlink)  retx %llu  queue drops "
                "%llu  max %llu  marks %llu  rto %llu\n",
                cc.c_str(), o.doneNs / 1e6, gbps, gbps / 2.0,
                (unsigned long long)o.totals.retransmittedPackets,
                (unsigned long long)o.faults.queueDropped,
                (unsigned long long)o.faults.queueHighWater, (unsigned long long)o.faults.marked,
                (unsigned long long)o.totals.rtoExpiries);
    CHECK(o.faults.queueHighWater <= 64);
    CHECK(gbps <= 2.0);
    by[cc] = o;
  }
  const auto retx = [&](const std::string& cc) { return by[cc].totals.retransmittedPackets; };
  CHECK_MSG(retx("aimd") <= retx("none"), "aimd resent more than none");
  for (const std::string cc : {"delay", "ecn", "credit"}) {
    CHECK_MSG(5 * retx(cc) <= retx("aimd"), cc + " did not resend 5x less than aimd");
    // They read the queue (its delay, its marks), or pace what enters it (credit), and keep
    // it from filling at all.
    CHECK_MSG(by[cc].faults.queueDropped == 0 && by[cc].faults.queueHighWater < 64,
              cc + " filled the queue");
    const double gbps = 3.0 * each * 8 / static_cast<double>(by[cc].doneNs);
    CHECK_MSG(gbps >= 0.95 * 2.0 * 1408 / 1538, cc + ": " + std::to_string(gbps) + " Gb/s");
  }
}

void testRackReordering() {
  // Reordering deeper than three packets (as spraying over paths of unequal delay makes):
  // SACK's packet threshold resends what was only late, and says so (spurious
  // retransmissions: declared lost, then acknowledged); RACK's time window tolerates it.
  const auto run = [](const std::string& lr) {
    TransferPlan plan;
    plan.config = configWith("loss_recovery=" + lr);
    plan.label = "reordering " + lr;
    plan.forwardFaults = parseFaultConfig("reorder=0.2,reorder_us=40,seed=17");
    plan.flows = {{0, 1, {4u << 20}}};
    return runTransfer(plan);
  };
  const TransferOutcome sr = run("selective_repeat"), rack = run("rack");
  std::printf("  20%% reordered by up to 40 us: selective_repeat %llu spurious of %llu "
              "retransmitted, rack %llu of %llu\n",
              (unsigned long long)sr.totals.spurious,
              (unsigned long long)sr.totals.retransmittedPackets,
              (unsigned long long)rack.totals.spurious,
              (unsigned long long)rack.totals.retransmittedPackets);
  CHECK(sr.totals.spurious > 100);
  // Nothing is lost here: every retransmission was spurious, and the receiver saw each twice.
  CHECK_EQ(sr.totals.spurious, sr.totals.retransmittedPackets);
  CHECK_EQ(sr.totals.duplicateFragments, sr.totals.retransmittedPackets);
  CHECK_EQ(rack.totals.spurious, rack.totals.retransmittedPackets);
  CHECK_MSG(10 * rack.totals.spurious < sr.totals.spurious, "rack resent as much as SACK");
}

void testLabDeterminism() {
  // Same seed, same trace: every datagram at the same time with the same bytes.
  const auto run = [](uint64_t seed) {
    TransferPlan plan;
    plan.config = configWith("congestion=ecn,loss_recovery=rack");
    plan.label = "determinism seed " + std::to_string(seed);
    plan.forwardFaults = parseFaultConfig(kLabBottleneck +
                                          ",ge_enter=0.01,ge_leave=0.2,dup=0.05,reorder=0.1,"
                                          "corrupt=0.02,seed=" + std::to_string(seed));
    plan.reverseFaults = parseFaultConfig("drop=0.05,seed=" + std::to_string(seed));
    plan.flows = {{0, 1, {1'000'000, 3000}}, {1, 0, {200'000}}};
    return runTransfer(plan);
  };
  const TransferOutcome a = run(5), b = run(5), c = run(6);
  CHECK_EQ(a.traceHash, b.traceHash);
  CHECK_EQ(a.doneNs, b.doneNs);
  CHECK(a.traceHash != c.traceHash);
}

// UDP_MEASURE_MIB=N sends N MiB instead of 16 (tests/test_udp_core.py runs it smaller: it
// checks that every run completes with every byte intact, not the figures).
void measure() {
  const char* mib = std::getenv("UDP_MEASURE_MIB");
  const uint64_t size = (mib ? std::strtoull(mib, nullptr, 10) : 16) << 20;
  std::printf("  %llu MiB message, mtu_payload 1472, link 10 Gbit/s, 50 us one-way, 66 B/packet "
              "framing; drop applied to both directions (data and ACKs)\n",
              (unsigned long long)(size >> 20));
  std::printf("  time: send() to the last ACK; goodput: the receiver's Stats (first DATA to "
              "delivery); wall: CPU time of the simulation\n");
  std::printf("  %-17s %-5s %5s %9s %10s %8s %7s %8s %6s %8s %6s\n", "loss_recovery", "cc",
              "drop", "time_ms", "goodput", "data_pk", "retx", "retx_%", "rto", "dup_frag",
              "wall");
  for (const std::string cc : {"none", "aimd"}) {
    for (const double drop : {0.0, 0.01, 0.05, 0.10}) {
      for (const std::string& policy : kPolicies) {
        TransferPlan plan;
        plan.config = configWith("loss_recovery=" + policy + ",congestion=" + cc);
        plan.label = "measure";
        if (drop > 0) {
          FaultConfig f;
          f.drop = drop;
          f.seed = 99;
          plan.forwardFaults = f;
          plan.reverseFaults = f;
        }
        plan.flows = {{0, 1, {size}}};
        const TransferOutcome o = runTransfer(plan);
        const Totals& t = o.totals;
        std::printf("  %-17s %-5s %4.0f%% %9.2f %5.2f Gb/s %8llu %7llu %7.1f%% %6llu %8llu %4.0fms\n",
                    policy.c_str(), cc.c_str(), drop * 100, o.doneNs / 1e6,
                    t.goodputBps / 1e9,
                    (unsigned long long)t.dataPacketsSent,
                    (unsigned long long)t.retransmittedPackets,
                    100.0 * t.retransmittedPackets / std::max<uint64_t>(1, t.dataPacketsSent),
                    (unsigned long long)t.rtoExpiries, (unsigned long long)t.duplicateFragments,
                    o.wallMs);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// congestion=credit: the receiver-driven policy (congestion_credit.h, credit_scheduler.h).

void testCredit() {
  std::vector<uint8_t> buf(kMaxDatagramBytes);
  DecodedPacket p;
  // The CREDIT packet: round trip, every prefix refused, flags and reserved bits checked.
  {
    CreditFrame f;
    f.granted = 0x0102030405060708ull;
    f.wanted = 77;
    f.flags = credit_flags::kRequest;
    const size_t n = encodeCredit(buf, testHeader(), f);
    CHECK_EQ(n, kCreditBytes);
    CHECK(decodePacket({buf.data(), n}, p) == DecodeError::kNone);
    CHECK(p.header.type == PacketType::kCredit && p.header.sourceRank == 3);
    CHECK(p.credit.granted == f.granted && p.credit.wanted == 77 &&
          p.credit.flags == credit_flags::kRequest);
    for (size_t k = 0; k < n; ++k) CHECK(decodePacket({buf.data(), k}, p) != DecodeError::kNone);
    std::vector<uint8_t> bad(buf.begin(), buf.begin() + n);
    bad[32] = 0x04;  // an unknown flag
    sealChecksum(bad);
    CHECK(decodePacket(bad, p) == DecodeError::kMalformed);
    bad[32] = 0x01;
    bad[35] = 1;  // reserved
    sealChecksum(bad);
    CHECK(decodePacket(bad, p) == DecodeError::kMalformed);
    bad[35] = 0;
    bad.push_back(0);
    sealChecksum(bad);
    CHECK(decodePacket(bad, p) == DecodeError::kMalformed);
  }
  // The scheduler: nothing before anyone wants credit; then grants at the rate, one quantum
  // at a time, round-robin among those wanting; each sender up to its demand plus one
  // unsolicited window; a late call makes up for at most 300 us, and nothing is kept while
  // nobody wants any.
  {
    CreditScheduler s(800, 1000, 100);  // 800 Mbit/s = 100 bytes/us
    CHECK_EQ(s.catchUpUs(), kPortCatchUpUs);
    s.setEmulatedDownlinkMbps(800);  // its queue is run as the rank reads: 300 us only
    CHECK_EQ(s.catchUpUs(), kEmulatedCatchUpUs);
    const size_t a = s.join(), b = s.join(), c = s.join();
    CHECK_EQ(s.granted(a), uint64_t{1000});
    CHECK(!s.nextGrantTime());
    s.advance(50);
    CHECK_EQ(s.granted(a), uint64_t{1000});
    s.onWanted(a, 1'000'000, 100);
    s.onWanted(b, 1'000'000, 100);
    CHECK_EQ(s.nextGrantTime().value_or(0), TimeUs{101});
    s.advance(110);  // 1000 bytes earned, 5 quanta each
    CHECK_EQ(s.granted(a) + s.granted(b), uint64_t{3000});
    CHECK_EQ(s.granted(a), s.granted(b));
    CHECK_EQ(s.granted(c), uint64_t{1000});
    s.advance(410);  // 300 us late: made up for
    CHECK_EQ(s.granted(a) + s.granted(b), uint64_t{33'000});
    s.advance(3110);  // 2.7 ms late: only 300 us of it made up for
    CHECK_EQ(s.granted(a) + s.granted(b), uint64_t{63'000});
    // Other traffic on the downlink (ACKs, CREDITs) is taken from the credit first.
    s.onOtherArrival(500);
    s.advance(3115);
    CHECK_EQ(s.granted(a) + s.granted(b), uint64_t{63'000});
    s.advance(3120);
    CHECK_EQ(s.granted(a) + s.granted(b), uint64_t{63'500});
    s.advance(3125);
    CHECK_EQ(s.granted(a) + s.granted(b), uint64_t{64'000});
    // A small demand is met up to its window and then gets nothing more.
    s.onWanted(c, 1150, 3125);
    for (TimeUs t = 3126; t <= 3175; ++t) s.advance(t);  // 50 quanta, 12 of them c's
    CHECK_EQ(s.granted(c), uint64_t{2150});
    CHECK(s.satisfied(c) && !s.satisfied(a));
    CHECK(s.granted(a) >= 32'000 + 1800 && s.granted(b) >= 32'000 + 1800);
    // Paced over a long run: within one quantum of the rate.
    const uint64_t before = s.granted(a) + s.granted(b) + s.granted(c);
    for (TimeUs t = 3176; t <= 3675; ++t) s.advance(t);
    const uint64_t granted = s.granted(a) + s.granted(b) + s.granted(c) - before;
    CHECK_MSG(granted >= 500 * 100 - 100 && granted <= 500 * 100 + 100, std::to_string(granted));
    CHECK_EQ(s.wanted(c), uint64_t{1150});
  }
  // A real port's scheduler (no emulated queue; the kernel's socket buffer takes a burst)
  // makes up for a stall of up to kPortCatchUpUs: 4 ms late, all of it.
  {
    CreditScheduler s(800, 1000, 100);
    const size_t a = s.join();
    s.onWanted(a, 10'000'000, 100);
    s.advance(100 + kPortCatchUpUs);
    CHECK_EQ(s.granted(a), uint64_t{1000 + kPortCatchUpUs * 100});
    s.advance(100 + 3 * kPortCatchUpUs);  // 8 ms late: only 4 ms of it
    CHECK_EQ(s.granted(a), uint64_t{1000 + 2 * kPortCatchUpUs * 100});
  }
  // A demand near 2^64 (a hostile or corrupt CREDIT that passed authentication) must not
  // wrap the slot's target: the slot stays active and a later genuine demand still counts.
  {
    CreditScheduler s(800, 1000, 100);
    const size_t a = s.join(), b = s.join();
    s.onWanted(a, UINT64_MAX - 10, 100);
    s.onWanted(b, 10'000, 100);
    s.advance(120);  // 2000 bytes earned, shared round-robin
    CHECK_EQ(s.granted(a), uint64_t{2000});
    CHECK_EQ(s.granted(b), uint64_t{2000});
    CHECK(!s.satisfied(a));
  }
  // The sender: the unsolicited window, then only against grants; the demand reported as
  // it grows; a request again after the timeout while waiting with a backlog.
  {
    CreditCongestionControl c(1000, 500, 2000);
    CHECK_EQ(c.windowPackets(), UINT64_MAX);
    CHECK(c.credits() == &c);
    c.setBacklog(3000);
    bool timedOut = false;
    CHECK(c.requestDue(0, true, timedOut) && !timedOut);
    c.onRequestSent(0);
    CHECK(!c.requestDue(1, true, timedOut));
    CHECK(c.maySend());
    c.onDataSent(600);
    CHECK(c.maySend());
    c.onDataSent(600);  // overshoots the window by 200: spent, so owed
    CHECK(!c.maySend() && c.wanted() == 3000);
    CHECK_EQ(c.nextRequestTime().value_or(0), TimeUs{500});
    // Not while the receiver is silent with data in flight (descheduled, not lost).
    CHECK(!c.requestDue(500, false, timedOut) && !timedOut);
    CHECK(c.requestDue(500, true, timedOut) && timedOut);
    c.onRequestSent(500);
    c.onGrant(1100, 600);  // older than what it has: no news
    CHECK(!c.maySend());
    c.onGrant(2400, 700);
    CHECK(c.maySend() && !c.nextRequestTime());
    // A catch-up grant (the receiver making up for a stall of its own) is kept whole.
    c.onGrant(6000, 750, /*catchUp=*/true);
    CHECK_EQ(c.spent(), uint64_t{1200});
    CHECK_EQ(c.granted() - c.spent(), uint64_t{4800});
    // Grants that piled up beyond 2000 unused (a descheduled sender) are forfeited: spent,
    // so the demand grows by them and a request asks for them again; what is left of the
    // catch-up (2800 beyond the 2000) is kept on top until spent.
    c.onGrant(10'000, 800);
    CHECK_EQ(c.spent(), uint64_t{10'000 - 2000 - 2800});
    CHECK_EQ(c.wanted(), uint64_t{5200 + 1800});
    c.onDataSent(2800);  // the catch-up spent: the next pile-up is cut to 2000
    c.onGrant(20'000, 850);
    CHECK_EQ(c.spent(), uint64_t{18'000});
    CHECK(c.requestDue(800, true, timedOut) && !timedOut);
    c.onRetransmissionTimeout(800);
    c.onPacketsLost(700, 800);
    CHECK(c.maySend());
    CHECK_EQ(std::string(makeCongestionControl(configWith("congestion=credit"))->name()),
             std::string("credit"));
  }
}

// The issue's incast (incastPlan) with 4 MiB per sender, jumbo datagrams as in the bench.
// Deterministic, so the counts are exact.
TransferOutcome creditIncast(const std::string& config,
                             std::function<bool(int, int, std::span<const uint8_t>)> drop = {}) {
  const uint64_t each = 4u << 20;
  TransferPlan plan = incastPlan(config, each);
  plan.dropFilter = std::move(drop);
  const TransferOutcome o = runTransfer(plan);
  const double gbps = 3.0 * each * 8 / static_cast<double>(o.doneNs);
  const std::string counts = "retx " + std::to_string(o.totals.retransmittedPackets) +
                             "  queue drops " + std::to_string(o.faults.queueDropped) + " max " +
                             std::to_string(o.faults.queueHighWater) + "  credit packets " +
                             std::to_string(o.totals.creditPacketsSent) + " timeouts " +
                             std::to_string(o.totals.creditTimeouts);
  std::printf("  %-56s %6.2f ms  %.3f Gb/s (%.3fx the downlink)  %s\n", config.c_str(),
              o.doneNs / 1e6, gbps, gbps / 2.0, counts.c_str());
  return o;
}

double incastGoodputGbps(const TransferOutcome& o) {
  return static_cast<double>(o.bytes) * 8 / static_cast<double>(o.doneNs);
}

void testCreditIncast() {
  const std::string common = "mtu_payload=8972,loss_recovery=rack,";
  const TransferOutcome aimd = creditIncast(common + "congestion=aimd");
  const TransferOutcome credit = creditIncast(common + "congestion=credit");
  // The receiver paces the senders at its downlink's rate: the port stays busy, its queue
  // never overflows, nothing is resent. aimd overflows it and resends.
  CHECK_MSG(incastGoodputGbps(credit) >= 0.9 * 2.0,
            std::to_string(incastGoodputGbps(credit)) + " Gb/s of the downlink's 2");
  CHECK(incastGoodputGbps(credit) <= 2.0);
  CHECK(aimd.totals.retransmittedPackets > 0);
  CHECK_MSG(5 * credit.totals.retransmittedPackets <= aimd.totals.retransmittedPackets,
            "credit resent " + std::to_string(credit.totals.retransmittedPackets) +
                ", aimd " + std::to_string(aimd.totals.retransmittedPackets));
  CHECK_EQ(credit.faults.queueDropped, uint64_t{0});
  CHECK(credit.faults.queueHighWater < 64);
  CHECK(credit.totals.creditPacketsSent > 0);
}

void testCreditGrantLoss() {
  // Every sender's first two requests are lost (the demand of its RTS, then of the message
  // the CTS cleared), so the receiver learns of no demand until the sender asks again; and the receiver's (node 0's) first 30 grants are all lost, then
  // every other one. The senders stall once their unsolicited window is spent, ask again
  // after cc_credit_timeout_us, and the op still completes with every byte delivered once
  // (runTransfer checks each message). Grants are cumulative, so a lost one is superseded
  // by the next; without the timeout a lost request would stall its sender for good.
  const std::string config = "mtu_payload=8972,loss_recovery=rack,congestion=credit";
  uint64_t grants = 0, dropped = 0;
  std::vector<int> requestsLost(4, 0);
  const auto drop = [&](int from, int, std::span<const uint8_t> bytes) {
    DecodedPacket p;
    if (decodePacket(bytes, p) != DecodeError::kNone || p.header.type != PacketType::kCredit) {
      return false;
    }
    bool lost = false;
    if (from != 0 && (p.credit.flags & credit_flags::kRequest) && requestsLost[from] < 2) {
      ++requestsLost[from];
      lost = true;
    } else if (from == 0 && p.credit.granted > 0) {
      lost = ++grants <= 30 || grants % 2 == 0;
    }
    dropped += lost;
    return lost;
  };
  const TransferOutcome o = creditIncast(config, drop);
  CHECK(o.completed);
  CHECK(dropped >= 36);
  CHECK_MSG(o.totals.creditTimeouts >= 3, "the senders did not ask again");
  const TransferOutcome clean = creditIncast(config);
  CHECK(clean.completed && clean.totals.creditTimeouts == 0);
  CHECK(o.doneNs > clean.doneNs);
}


// A rank descheduled for longer than the RTO (issue #23's rig: two ranks and their progress
// threads on a loaded 2-core host) loses nothing; its ACKs come late, all at once. Both ranks
// send 16 MiB to each other (a 2-rank all_reduce) and rank 1 stalls for 5 ms, five times the
// RTO's floor, in the middle. Rank 0's timeouts must resend no more than one packet each
// (not the 1 MiB window), and the ACK that ends the stall must leave its congestion window
// where it was (PeerConnection::judgeTimeouts).
void testStalledReceiver() {
  constexpr size_t kBytes = size_t{16} << 20;
  constexpr uint64_t kStallAtNs = 2'000'000, kStallNs = 5'000'000;
  for (const std::string cc : {"none", "aimd"}) {
    const std::string label = "stalled receiver, congestion=" + cc;
    Simulator sim(2, configWith("congestion=" + cc), LinkConfig{});
    std::vector<uint8_t> out[2], in[2];
    int done = 0;
    sim.setEventHandler([&](const SimEvent& e) {
      CHECK_MSG(e.event.kind == EventKind::kSendCompleted ||
                    e.event.kind == EventKind::kMessageReceived,
                label + ": " + eventKindName(e.event.kind) + " " + e.event.error);
      ++done;
    });
    for (int n = 0; n < 2; ++n) {
      out[n].resize(kBytes);
      fillPattern(out[n].data(), kBytes, 7 + n);
      in[n].assign(kBytes, 0);
      sim.connection(n, 1 - n).postReceive(5, ~Tag{0}, in[n].data(), kBytes);
    }
    for (int n = 0; n < 2; ++n) sim.connection(n, 1 - n).send(5, out[n].data(), kBytes);
    PeerConnection& sender = sim.connection(0, 1);
    runOrFail(sim, [&] { return sim.nowNs() >= kStallAtNs; }, label + ": before the stall");
    CHECK_MSG(done == 0 && sender.packetsInFlight() > 100, label + ": not mid-transfer");
    const uint64_t windowBefore = sender.congestionWindow();
    uint64_t smallestWindow = windowBefore;
    sim.stall(1, sim.nowNs() + kStallNs);
    runOrFail(sim, [&] {
      smallestWindow = std::min(smallestWindow, sender.congestionWindow());
      return done == 4;
    }, label);
    CHECK_MSG(out[0] == in[1] && out[1] == in[0], label + ": data differ");
    const Stats st = sender.stats();
    std::printf("  %s: rto=%llu spurious_rtos=%llu retx=%llu cwnd %llu -> min %llu, %.2f ms\n",
                label.c_str(), (unsigned long long)st.rtoExpiries,
                (unsigned long long)st.spuriousRtos, (unsigned long long)st.retransmittedPackets,
                (unsigned long long)windowBefore, (unsigned long long)smallestWindow,
                sim.nowNs() / 1e6);
    CHECK_MSG(st.rtoExpiries >= 2, label + ": the stall did not outlast the RTO");
    CHECK_MSG(st.retransmittedPackets <= st.rtoExpiries,
              label + ": " + std::to_string(st.retransmittedPackets) + " packets resent for " +
                  std::to_string(st.rtoExpiries) + " timeouts");
    // The stall's expiries form one run, judged early; a deeper window may add runs of its
    // own (queueing at the link), each judged as well.
    CHECK_MSG(st.spuriousRtos >= 1 && st.spuriousRtos <= st.rtoExpiries,
              label + ": " + std::to_string(st.spuriousRtos) + " runs judged early");
    CHECK_MSG(smallestWindow >= windowBefore, label + ": the congestion window collapsed");
  }
}

const ucxb::check::Group kGroups[] = {
    {"crc32c", testCrc32c, true},
    {"range_set", testRangeSet, true},
    {"wire_format", testWireFormat, true},
    {"one_way_delay", testOneWayDelays, true},
    {"config", testConfig, true},
    {"faults", testFaults, true},
    {"rtt_congestion", testRttAndCongestion, true},
    {"lossless", testLossless, true},
    {"loss", testLoss, true},
    {"go_back_n", testGoBackNReceiver, true},
    {"tail_loss_probe", testTailLossProbes, true},
    {"immediate_acks", testImmediateAcks, true},
    {"duplication", testDuplication, true},
    {"reordering", testReordering, true},
    {"delayed_acks", testDelayedAcks, true},
    {"corruption", testCorruption, true},
    {"mixed", testMixed, true},
    {"unexpected", testUnexpected, true},
    {"matching", testMatching, true},
    {"receive_sink", testReceiveSink, true},
    {"security", testSecurity, true},
    {"fuzz", testFuzz, true},
    {"peer_failure", testPeerFailure, true},
    {"soak", testSoak, true},
    {"bottleneck", testBottleneck, true},
    {"lab_policies", testLabPolicies, true},
    {"lab_fault_matrix", testLabFaultMatrix, true},
    {"lab_bottleneck_flow", testLabBottleneckFlow, true},
    {"trim_nack", testTrimNack, true},
    {"incast", testIncast, true},
    {"rack_reordering", testRackReordering, true},
    {"lab_determinism", testLabDeterminism, true},
    {"credit", testCredit, true},
    {"credit_incast", testCreditIncast, true},
    {"credit_grant_loss", testCreditGrantLoss, true},
    {"stalled_receiver", testStalledReceiver, true},
    {"measure", measure, false},
};

}  // namespace

int main(int argc, char** argv) {
  return ucxb::check::runGroups("udp_core_test", kGroups, argc, argv);
}
