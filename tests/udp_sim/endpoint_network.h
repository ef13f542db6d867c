// EndpointNetwork: several udp Endpoints (transports/udp/endpoint.h) on one simulated network,
// in virtual time, so that the multi-peer logic above the connections (routing by address,
// any-source receives, cancellation, peer failure, linger) runs deterministically without a
// socket. Where Simulator (simulator.h) joins bare PeerConnections pair by pair, this joins
// whole ranks: each node is an Endpoint at its own address, connected to every node (itself
// included, as the backend does), and a datagram goes wherever the endpoint addressed it.
//
// The links are simple on purpose: a fixed one-way delay, a switch to take a link down, and
// optional seeded faults per link; the endpoints' own fault injection works on top as usual.
// A node can also be frozen (a stopped process: its socket still takes datagrams, nothing
// is read or sent until it is thawed) or destroyed with its port refusing (a killed process:
// each datagram to it comes back as an ICMP port unreachable, as a kernel answers).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "transports/udp/endpoint.h"
#include "transports/udp/faults.h"

namespace ucxb::udp::sim {

class EndpointNetwork {
 public:
  EndpointNetwork(int nodes, const EndpointOptions& options, DurationUs oneWayDelayUs = 50);

  int nodes() const { return static_cast<int>(nodes_.size()); }
  // Null once the node is gone (its linger ended, or destroy()).
  Endpoint* endpoint(int node) { return nodes_[static_cast<size_t>(node)].endpoint.get(); }
  const SocketAddress& address(int node) const { return nodes_[static_cast<size_t>(node)].address; }

  void setLinkUp(int from, int to, bool up);
  void setFaults(int from, int to, const FaultConfig& faults);
  // Delivers `bytes` to `to` as if sent from `from` (any address, a stranger's too) after
  // `delayUs`.
  void inject(const SocketAddress& from, int to, std::vector<uint8_t> bytes, DurationUs delayUs = 0);

  // Starts the node's linger (Endpoint::close); the network drives it like any other node
  // and removes it when lingerDone says so.
  void close(int node);
  // The node vanishes at once (a crashed process): its endpoint is destroyed, and datagrams
  // to it are lost.
  void destroy(int node);
  // Like destroy(), but the node's host answers each datagram to it with an ICMP port
  // unreachable (Endpoint::handlePortUnreachable at the sender, one delay later).
  void kill(int node);
  // A stopped process (SIGSTOP): the node's endpoint is not driven and the datagrams that
  // reach it wait (its socket buffer) until thaw().
  void freeze(int node);
  void thaw(int node);
  uint64_t refusals() const { return refusals_; }
  bool gone(int node) const { return endpoint(node) == nullptr; }
  // When a closed node's linger ended (0 while it has not).
  TimeUs lingerEndedUs(int node) const { return nodes_[static_cast<size_t>(node)].lingerEndedUs; }

  TimeUs nowUs() const { return nowUs_; }
  // Runs until done() holds (checked after every round; returns true), nothing is left to
  // happen, or `maxUs` of simulated time pass (returns false).
  bool runUntil(const std::function<bool()>& done, DurationUs maxUs);
  // Datagrams the network could not deliver: to an address no node has, or to a gone node.
  uint64_t undeliverable() const { return undeliverable_; }
  const std::string& stuckReason() const { return stuck_; }

 private:
  struct Node {
    std::unique_ptr<Endpoint> endpoint;
    SocketAddress address;  // of path 0
    std::vector<SocketAddress> paths;  // one per path (udp_config paths)
    TimeUs lingerEndedUs = 0;
    bool refuses = false;  // gone, and its port answers with ICMP port unreachable
    bool frozen = false;
    std::vector<std::pair<SocketAddress, std::vector<uint8_t>>> held;  // arrived while frozen
  };
  struct Link {
    bool up = true;
    std::unique_ptr<FaultInjector> faults;
  };
  struct Arrival {
    TimeUs timeUs;
    uint64_t sequence;  // ties broken by send order: deterministic
    SocketAddress from;
    int to;
    std::vector<uint8_t> bytes;
    bool refusal = false;  // an ICMP port unreachable for a datagram `to` sent to `from`
    uint32_t path = 0;     // the path it took: the receiving node's socket of that index
    bool operator>(const Arrival& o) const {
      return timeUs != o.timeUs ? timeUs > o.timeUs : sequence > o.sequence;
    }
  };

  const Endpoint* endpoint(int node) const { return nodes_[static_cast<size_t>(node)].endpoint.get(); }
  Link& link(int from, int to) { return links_[static_cast<size_t>(from * nodes() + to)]; }
  int nodeAt(const SocketAddress& address) const;
  std::optional<TimeUs> nextEventUs() const;
  // One round at nowUs_: arrivals, timers, transmissions, completions, lingers.
  void round();

  std::vector<Node> nodes_;
  std::vector<Link> links_;  // [from * nodes + to]
  const DurationUs delayUs_;
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals_;
  TimeUs nowUs_ = 1;
  uint64_t sequence_ = 0;
  uint64_t undeliverable_ = 0;
  uint64_t refusals_ = 0;
  std::vector<uint8_t> buffer_;
  std::vector<FaultInjector::Delivery> deliveries_;
  std::string stuck_;
};

}  // namespace ucxb::udp::sim
