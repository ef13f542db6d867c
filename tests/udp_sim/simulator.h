// A deterministic network simulator for the UDP transport's core: N nodes, a PeerConnection
// for every ordered pair, and for every direction a link with a fixed bandwidth, propagation
// delay and queue, plus seeded fault injection (transports/udp/faults.h). Time is virtual
// (nanoseconds; the connections see microseconds), so a run depends only on its inputs and
// seeds: the same test fails the same way every time, and seconds of simulated traffic take
// milliseconds of CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <span>
#include <string>
#include <vector>

#include "transports/udp/faults.h"
#include "transports/udp/reliability.h"

namespace ucxb::udp::sim {

struct LinkConfig {
  double bitsPerSecond = 10e9;
  uint64_t oneWayDelayNs = 50'000;
  // Bytes on the wire per datagram beyond the UDP payload (faults.h).
  uint64_t perPacketOverheadBytes = kFramingOverheadBytes;
  // Datagrams arriving at a fuller queue are dropped (a switch buffer).
  uint64_t queueLimitBytes = uint64_t{16} << 20;
};

struct LinkCounters {
  uint64_t datagrams = 0;     // handed to the link
  uint64_t queueDrops = 0;    // tail drops at the queue limit
  uint64_t downDrops = 0;     // dropped while the link was down
  uint64_t filterDrops = 0;   // dropped by the drop filter
  uint64_t delivered = 0;     // copies that reached the other end
};

struct SimEvent {
  int node = 0;  // whose connection reported it
  int peer = 0;  // the connection's peer
  Event event;
  uint64_t timeNs = 0;
};

class Simulator {
 public:
  // `token` is the session token of every connection.
  Simulator(int nodes, const UdpConfig& config, const LinkConfig& link, uint64_t token = 0x5eed);

  int nodes() const { return nodes_; }
  PeerConnection& connection(int node, int peer) { return *conns_[index(node, peer)]; }

  void setFaults(int from, int to, const FaultConfig& faults);
  // Faults (a bottleneck, typically) in front of `node` that every link into it shares: its
  // downlink, the port an incast fights over. Applied when a datagram reaches the node, after
  // the link's own faults.
  void setDownlink(int node, const FaultConfig& faults);
  const FaultInjector* downlink(int node) const { return downlinks_[static_cast<size_t>(node)].get(); }
  // A down link swallows everything (a dead or partitioned peer).
  void setLinkUp(int from, int to, bool up);
  // Sees every datagram a connection sends, before the link and faults.
  void setTap(std::function<void(int from, int to, std::span<const uint8_t>)> tap) {
    tap_ = std::move(tap);
  }
  // Drops what `drop` returns true for, after the tap and before the link (a test's aim at
  // one kind of packet, e.g. congestion=credit's grants).
  void setDropFilter(std::function<bool(int from, int to, std::span<const uint8_t>)> drop) {
    dropFilter_ = std::move(drop);
  }
  void setEventHandler(std::function<void(const SimEvent&)> handler) {
    eventHandler_ = std::move(handler);
  }
  // The node's process is descheduled (a loaded host's scheduler) from now until `untilNs`:
  // datagrams reaching it wait in its socket buffer, its timers do not fire and it sends
  // nothing. At `untilNs` it reads what arrived, in order, before its timers fire, as
  // UdpTransport::progress() does.
  void stall(int node, uint64_t untilNs) { stalledUntilNs_[static_cast<size_t>(node)] = untilNs; }
  // Delivers `bytes` to `to`'s connection for `from` after `delayNs`, bypassing the link.
  void inject(int from, int to, std::vector<uint8_t> bytes, uint64_t delayNs = 0);

  uint64_t nowNs() const { return nowNs_; }
  TimeUs nowUs() const { return nowNs_ / 1000; }

  // Runs until done() holds (checked after every step; returns true), nothing is left to
  // happen, or the simulated time passes `nowNs() + maxNs` (returns false).
  bool runUntil(const std::function<bool()>& done, uint64_t maxNs);
  // Runs until no datagram is in the network and no connection has a timer pending (or
  // `maxNs` passes). Returns true if it got quiet.
  bool runUntilQuiet(uint64_t maxNs);

  const LinkCounters& linkCounters(int from, int to) const { return links_[index(from, to)].counters; }
  const FaultInjector* faults(int from, int to) const { return links_[index(from, to)].faults.get(); }
  // A diagnostic of the last run that stopped for a reason other than its condition.
  const std::string& stuckReason() const { return stuck_; }

 private:
  struct Link {
    bool up = true;
    double freeAtNs = 0;  // when the transmitter finishes the datagrams queued so far
    std::unique_ptr<FaultInjector> faults;
    LinkCounters counters;
  };
  struct Arrival {
    uint64_t timeNs;
    uint64_t sequence;  // ties broken by send order: deterministic
    int from;
    int to;
    std::vector<uint8_t> bytes;
    bool pastDownlink = false;
    bool operator>(const Arrival& o) const {
      return timeNs != o.timeNs ? timeNs > o.timeNs : sequence > o.sequence;
    }
  };

  size_t index(int node, int peer) const { return static_cast<size_t>(node * nodes_ + peer); }
  uint64_t stalledUntil(int node) const { return stalledUntilNs_[static_cast<size_t>(node)]; }
  bool stalled(int node) const { return nowNs_ < stalledUntil(node); }
  void transmit(int from, int to, std::span<const uint8_t> bytes);
  // Lets every connection send what it can and reports their events.
  void pump();
  void drainEvents();
  // Advances to the next arrival or timer and processes everything due then. False if
  // nothing is left to happen or the next thing is beyond `limitNs`.
  bool step(uint64_t limitNs);
  std::optional<uint64_t> nextTimerNs() const;

  const int nodes_;
  const LinkConfig link_;
  // Each node's congestion=credit scheduler, shared by its connections like its downlink.
  std::vector<std::unique_ptr<CreditScheduler>> credits_;
  std::vector<std::unique_ptr<PeerConnection>> conns_;  // [node * nodes + peer], null on the diagonal
  std::vector<Link> links_;                             // [from * nodes + to]
  std::vector<std::unique_ptr<FaultInjector>> downlinks_;  // [node], null: none
  std::vector<uint64_t> stalledUntilNs_;                   // [node] (stall())
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals_;
  uint64_t nowNs_ = 0;
  uint64_t sequence_ = 0;
  std::vector<uint8_t> buffer_;
  std::vector<FaultInjector::Delivery> deliveries_;
  std::function<void(int, int, std::span<const uint8_t>)> tap_;
  std::function<bool(int, int, std::span<const uint8_t>)> dropFilter_;
  std::function<void(const SimEvent&)> eventHandler_;
  std::string stuck_;
};

}  // namespace ucxb::udp::sim
