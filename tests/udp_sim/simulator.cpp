#include "tests/udp_sim/simulator.h"

#include <algorithm>
#include <stdexcept>

namespace ucxb::udp::sim {
namespace {

// Steps at one instant without time advancing, beyond which a connection must be asking for
// a timeout it never clears: a bug worth stopping for rather than spinning.
constexpr uint64_t kMaxStepsWithoutProgress = 1'000'000;

}  // namespace

Simulator::Simulator(int nodes, const UdpConfig& config, const LinkConfig& link, uint64_t token)
    : nodes_(nodes), link_(link), buffer_(kMaxDatagramBytes) {
  conns_.resize(static_cast<size_t>(nodes * nodes));
  downlinks_.resize(static_cast<size_t>(nodes));
  stalledUntilNs_.resize(static_cast<size_t>(nodes));
  links_.resize(static_cast<size_t>(nodes * nodes));
  for (int n = 0; n < nodes; ++n) credits_.push_back(makeCreditScheduler(config));
  for (int n = 0; n < nodes; ++n) {
    for (int p = 0; p < nodes; ++p) {
      if (n == p) continue;
      PeerIdentity id;
      id.localRank = static_cast<uint16_t>(n);
      id.peerRank = static_cast<uint16_t>(p);
      id.sessionToken = token;
      conns_[index(n, p)] =
          std::make_unique<PeerConnection>(config, id, credits_[static_cast<size_t>(n)].get());
    }
  }
}

void Simulator::setFaults(int from, int to, const FaultConfig& faults) {
  links_[index(from, to)].faults = std::make_unique<FaultInjector>(faults);
}

void Simulator::setDownlink(int node, const FaultConfig& faults) {
  downlinks_[static_cast<size_t>(node)] = std::make_unique<FaultInjector>(faults);
  if (faults.bottleneck()) credits_[static_cast<size_t>(node)]->setEmulatedDownlinkMbps(faults.rateMbps);
}

void Simulator::setLinkUp(int from, int to, bool up) { links_[index(from, to)].up = up; }

void Simulator::inject(int from, int to, std::vector<uint8_t> bytes, uint64_t delayNs) {
  arrivals_.push(Arrival{nowNs_ + delayNs, sequence_++, from, to, std::move(bytes)});
}

void Simulator::transmit(int from, int to, std::span<const uint8_t> bytes) {
  if (tap_) tap_(from, to, bytes);
  Link& link = links_[index(from, to)];
  ++link.counters.datagrams;
  if (dropFilter_ && dropFilter_(from, to, bytes)) {
    ++link.counters.filterDrops;
    return;
  }
  if (!link.up) {
    ++link.counters.downDrops;
    return;
  }
  const double now = static_cast<double>(nowNs_);
  const double backlogNs = std::max(0.0, link.freeAtNs - now);
  if (backlogNs * link_.bitsPerSecond / 8e9 > static_cast<double>(link_.queueLimitBytes)) {
    ++link.counters.queueDrops;
    return;
  }
  const double wireBits = 8.0 * static_cast<double>(bytes.size() + link_.perPacketOverheadBytes);
  link.freeAtNs = std::max(link.freeAtNs, now) + wireBits * 1e9 / link_.bitsPerSecond;
  const uint64_t arrivesNs = static_cast<uint64_t>(link.freeAtNs) + link_.oneWayDelayNs;
  deliveries_.clear();
  if (link.faults) {
    // The bottleneck (if the faults have one) sits at the far end of the link: the datagram
    // reaches it when it arrives.
    link.faults->apply(bytes, arrivesNs / 1000, deliveries_);
  } else {
    deliveries_.push_back({std::vector<uint8_t>(bytes.begin(), bytes.end()), 0});
  }
  for (auto& d : deliveries_) {
    arrivals_.push(Arrival{arrivesNs + d.extraDelayUs * 1000, sequence_++, from, to,
                           std::move(d.bytes)});
  }
}

void Simulator::drainEvents() {
  for (int n = 0; n < nodes_; ++n) {
    for (int p = 0; p < nodes_; ++p) {
      if (n == p) continue;
      PeerConnection& c = connection(n, p);
      while (auto e = c.pollEvent()) {
        if (eventHandler_) eventHandler_(SimEvent{n, p, std::move(*e), nowNs_});
      }
    }
  }
}

void Simulator::pump() {
  for (int n = 0; n < nodes_; ++n) {
    if (stalled(n)) continue;
    for (int p = 0; p < nodes_; ++p) {
      if (n == p) continue;
      PeerConnection& c = connection(n, p);
      while (const size_t len = c.pollTransmit(nowUs(), buffer_)) {
        transmit(n, p, std::span<const uint8_t>(buffer_.data(), len));
      }
    }
  }
  drainEvents();
}

std::optional<uint64_t> Simulator::nextTimerNs() const {
  std::optional<uint64_t> next;
  for (size_t i = 0; i < conns_.size(); ++i) {
    const auto& c = conns_[i];
    if (!c) continue;
    if (const auto t = c->nextTimeout()) {
      // A stalled node's timers wait for it to run again.
      const uint64_t ns = std::max(*t * 1000, stalledUntil(static_cast<int>(i) / nodes_));
      if (!next || ns < *next) next = ns;
    }
  }
  return next;
}

bool Simulator::step(uint64_t limitNs) {
  std::optional<uint64_t> next = nextTimerNs();
  if (!arrivals_.empty() && (!next || arrivals_.top().timeNs < *next)) next = arrivals_.top().timeNs;
  if (!next) return false;
  if (*next > limitNs) return false;
  nowNs_ = std::max(nowNs_, *next);
  while (!arrivals_.empty() && arrivals_.top().timeNs <= nowNs_) {
    Arrival a = arrivals_.top();
    arrivals_.pop();
    if (FaultInjector* downlink = downlinks_[static_cast<size_t>(a.to)].get();
        downlink != nullptr && !a.pastDownlink) {
      deliveries_.clear();
      downlink->apply(a.bytes, nowUs(), deliveries_);
      for (auto& d : deliveries_) {
        arrivals_.push(Arrival{nowNs_ + d.extraDelayUs * 1000, sequence_++, a.from, a.to,
                               std::move(d.bytes), /*pastDownlink=*/true});
      }
      continue;
    }
    if (stalled(a.to)) {
      // Waits in the socket buffer; taken in arrival order (a fresh sequence, in pop order).
      a.timeNs = stalledUntil(a.to);
      a.sequence = sequence_++;
      arrivals_.push(std::move(a));
      continue;
    }
    ++links_[index(a.from, a.to)].counters.delivered;
    connection(a.to, a.from).onDatagram(a.bytes, nowUs());
  }
  for (size_t i = 0; i < conns_.size(); ++i) {
    auto& c = conns_[i];
    if (!c || stalled(static_cast<int>(i) / nodes_)) continue;
    if (const auto t = c->nextTimeout(); t && *t <= nowUs()) c->onTimeout(nowUs());
  }
  pump();
  return true;
}

bool Simulator::runUntil(const std::function<bool()>& done, uint64_t maxNs) {
  const uint64_t limit = nowNs_ + maxNs;
  stuck_.clear();
  pump();
  uint64_t lastNs = nowNs_;
  uint64_t stepsHere = 0;
  while (!done()) {
    if (!step(limit)) {
      stuck_ = arrivals_.empty() && !nextTimerNs() ? "nothing left to happen"
                                                   : "simulated time limit reached";
      return done();
    }
    stepsHere = nowNs_ == lastNs ? stepsHere + 1 : 0;
    lastNs = nowNs_;
    if (stepsHere > kMaxStepsWithoutProgress) {
      stuck_ = "time stopped advancing (a timer that is never cleared)";
      return false;
    }
  }
  return true;
}

bool Simulator::runUntilQuiet(uint64_t maxNs) {
  runUntil([] { return false; }, maxNs);
  return stuck_ == "nothing left to happen";
}

}  // namespace ucxb::udp::sim
