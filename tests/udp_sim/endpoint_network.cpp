#include "tests/udp_sim/endpoint_network.h"

#include <algorithm>

namespace ucxb::udp::sim {
namespace {

// Rounds at one instant without time advancing, beyond which an endpoint must be asking for
// a timeout it never clears: a bug worth stopping for rather than spinning.
constexpr uint64_t kMaxRoundsWithoutProgress = 100'000;

}  // namespace

EndpointNetwork::EndpointNetwork(int nodes, const EndpointOptions& options,
                                 DurationUs oneWayDelayUs)
    : nodes_(static_cast<size_t>(nodes)),
      links_(static_cast<size_t>(nodes * nodes)),
      delayUs_(oneWayDelayUs),
      buffer_(options.config.mtuPayload) {
  for (int n = 0; n < nodes; ++n) {
    Node& node = nodes_[static_cast<size_t>(n)];
    // One socket per path (udp_config paths), as the real transport opens them.
    for (uint32_t p = 0; p < options.config.paths; ++p) {
      node.paths.push_back(SocketAddress::parse("10.0.0." + std::to_string(n + 1),
                                                static_cast<uint16_t>(7000 + p)));
    }
    node.address = node.paths.front();
    node.endpoint = std::make_unique<Endpoint>(n, nodes, options);
  }
  for (auto& node : nodes_) {
    for (int p = 0; p < nodes; ++p) {
      node.endpoint->connect(p, std::span<const SocketAddress>(nodes_[static_cast<size_t>(p)].paths));
    }
  }
}

void EndpointNetwork::setLinkUp(int from, int to, bool up) { link(from, to).up = up; }

void EndpointNetwork::setFaults(int from, int to, const FaultConfig& faults) {
  link(from, to).faults = std::make_unique<FaultInjector>(faults);
}

void EndpointNetwork::inject(const SocketAddress& from, int to, std::vector<uint8_t> bytes,
                             DurationUs delayUs) {
  arrivals_.push(Arrival{nowUs_ + delayUs, sequence_++, from, to, std::move(bytes)});
}

void EndpointNetwork::close(int node) {
  if (Endpoint* e = endpoint(node)) e->close(nowUs_);
}

void EndpointNetwork::destroy(int node) { nodes_[static_cast<size_t>(node)].endpoint.reset(); }

void EndpointNetwork::kill(int node) {
  destroy(node);
  nodes_[static_cast<size_t>(node)].refuses = true;
}

void EndpointNetwork::freeze(int node) { nodes_[static_cast<size_t>(node)].frozen = true; }

void EndpointNetwork::thaw(int node) {
  Node& n = nodes_[static_cast<size_t>(node)];
  n.frozen = false;
  // What queued in its socket buffer is read at once.
  for (auto& [from, bytes] : n.held) {
    arrivals_.push(Arrival{nowUs_, sequence_++, from, node, std::move(bytes)});
  }
  n.held.clear();
}

int EndpointNetwork::nodeAt(const SocketAddress& address) const {
  for (int n = 0; n < nodes(); ++n) {
    for (const SocketAddress& a : nodes_[static_cast<size_t>(n)].paths) {
      if (a == address) return n;
    }
  }
  return -1;
}

std::optional<TimeUs> EndpointNetwork::nextEventUs() const {
  std::optional<TimeUs> next;
  if (!arrivals_.empty()) next = arrivals_.top().timeUs;
  for (const auto& node : nodes_) {
    if (!node.endpoint || node.frozen) continue;
    if (const auto t = node.endpoint->nextTimeout(); t && (!next || *t < *next)) next = *t;
  }
  return next;
}

void EndpointNetwork::round() {
  while (!arrivals_.empty() && arrivals_.top().timeUs <= nowUs_) {
    Arrival a = arrivals_.top();
    arrivals_.pop();
    Node& to = nodes_[static_cast<size_t>(a.to)];
    if (a.refusal) {
      // `from` is the address the refused datagram was sent to.
      if (Endpoint* e = endpoint(a.to)) e->handlePortUnreachable(nowUs_, a.from);
    } else if (to.frozen && to.endpoint) {
      to.held.emplace_back(a.from, std::move(a.bytes));
    } else if (Endpoint* e = endpoint(a.to)) {
      e->handleDatagram(nowUs_, a.from, a.bytes);
    } else {
      ++undeliverable_;
      const int sender = nodeAt(a.from);
      if (to.refuses && sender >= 0) {
        ++refusals_;
        // The kernel's report names the port the datagram was sent to: its path's.
        arrivals_.push(Arrival{nowUs_ + delayUs_, sequence_++,
                               to.paths[std::min<size_t>(a.path, to.paths.size() - 1)], sender,
                               {}, true});
      }
    }
  }
  for (int n = 0; n < nodes(); ++n) {
    Endpoint* e = endpoint(n);
    if (e == nullptr || nodes_[static_cast<size_t>(n)].frozen) continue;
    e->handleTimeout(nowUs_);
    SocketAddress to;
    uint32_t path = 0;
    while (const size_t length = e->pollTransmit(nowUs_, buffer_, to, path)) {
      const int dest = nodeAt(to);
      if (dest < 0) {
        ++undeliverable_;
        continue;
      }
      Link& l = link(n, dest);
      if (!l.up) continue;
      const std::span<const uint8_t> bytes(buffer_.data(), length);
      deliveries_.clear();
      if (l.faults) {
        l.faults->apply(bytes, deliveries_);
      } else {
        deliveries_.push_back({std::vector<uint8_t>(bytes.begin(), bytes.end()), 0});
      }
      for (auto& d : deliveries_) {
        arrivals_.push(Arrival{nowUs_ + delayUs_ + d.extraDelayUs, sequence_++,
                               nodes_[static_cast<size_t>(n)].paths[path], dest,
                               std::move(d.bytes), false, path});
      }
    }
    e->completeRequests();
    if (e->closing() && e->lingerDone(nowUs_)) {
      nodes_[static_cast<size_t>(n)].lingerEndedUs = nowUs_;
      destroy(n);
    }
  }
}

bool EndpointNetwork::runUntil(const std::function<bool()>& done, DurationUs maxUs) {
  const TimeUs limit = nowUs_ + maxUs;
  stuck_.clear();
  round();  // what the caller just posted goes out now
  TimeUs lastUs = nowUs_;
  uint64_t roundsHere = 0;
  while (!done()) {
    const auto next = nextEventUs();
    if (!next) {
      stuck_ = "nothing left to happen";
      return false;
    }
    if (*next > limit) {
      stuck_ = "simulated time limit reached";
      return false;
    }
    nowUs_ = std::max(nowUs_, *next);
    round();
    roundsHere = nowUs_ == lastUs ? roundsHere + 1 : 0;
    lastUs = nowUs_;
    if (roundsHere > kMaxRoundsWithoutProgress) {
      stuck_ = "time stopped advancing (a timer that is never cleared)";
      return false;
    }
  }
  return true;
}

}  // namespace ucxb::udp::sim
