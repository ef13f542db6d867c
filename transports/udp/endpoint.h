// Endpoint: one rank's end of the UDP transport without the I/O. It owns a PeerConnection per
// rank of the group and everything between them and the user: routing datagrams by source
// address, the requests handed out by send()/recv(), any-source receives, cancellation, fault
// injection and the linger after close. Like PeerConnection (reliability.h), and like
// quinn-proto's Endpoint one level above its Connection, it never reads a clock, touches a
// socket or sleeps: datagrams (with their source) and the time go in; datagrams (with their
// destination), the next deadline and completions come out. UdpTransport (udp_transport.h)
// drives it from an epoll loop; the simulator (tests/udp_sim/endpoint_network.h) and the fuzzer
// drive it with virtual time.
//
// Call order, all on one thread (the Transport threading contract):
//   1. connect(peer, address) for every rank, before posting anything to it;
//   2. the user's calls, at any time: send(), recv() (from one rank or kAnySource),
//      Request::cancel(), abortPeer();
//   3. each round of driving, with `now` from one monotonic clock:
//        handleDatagram(now, from, bytes) for every datagram that arrived;
//        handleTimeout(now) (it does only what is due; calling it early is harmless);
//        pollTransmit(now, buffer, to) until it returns 0, sending each datagram to `to`;
//        completeRequests(): requests complete here (Request::state(), onComplete callbacks),
//          and failed peers show in peerError() and pollPeerFailure();
//   4. sleep until nextTimeout() or the next datagram, whichever comes first;
//   closing: close(now), then keep driving rounds (3 and 4) until lingerDone(now) says no
//   peer needs an answer any more; the destructor fails whatever is still pending.
//
// A request completes only inside completeRequests(), never inside the call that posted or
// cancelled it, so a completion callback never runs under the caller's feet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "transports/transport.h"
#include "transports/udp/datagram_auth.h"
#include "transports/udp/faults.h"
#include "transports/udp/reliability.h"
#include "transports/udp/socket_address.h"
#include "transports/udp/trace_recorder.h"
#include "transports/udp/udp_config.h"

namespace ucxb::udp {

struct EndpointOptions {
  UdpConfig config;
  FaultConfig faults;  // applied to every datagram this rank receives, on every path
  // Several paths (config.paths > 1, faults "...;...", parseFaultPaths): path p's faults are
  // pathFaults[p], or `faults` for a path beyond them. Empty: `faults` on every path.
  std::vector<FaultConfig> pathFaults;
  uint64_t sessionToken = 0;  // the same on every rank of the group instance
  // The authenticated mode (datagram_auth.h): the group instance's key (auth_keys.h), from
  // which each direction's key is derived. With it every datagram is sealed on its way out
  // and opened before a connection sees it; without it (nullopt) anyone who can reach the
  // socket and knows the token can inject traffic (docs/failure-model.md#security).
  std::optional<AuthKey> groupKey;
  // After the group is closed, keep answering the peers (acknowledging their retransmissions)
  // until every peer's CLOSE says it needs nothing more (lingerDone), or else until nothing
  // has arrived for this long (for rto_max_us once a peer has retransmitted during the
  // linger: our ACK was lost and its timer may be backing off), so that a peer whose last
  // ACK from us was lost still completes its send (TCP's TIME-WAIT, in short). Bounded by
  // lingerMaxUs.
  DurationUs lingerQuietUs = 100'000;
  DurationUs lingerMaxUs = 5'000'000;
  // The group's op timeout (0: none). A peer that is only silent may be stopped, not dead (a
  // SIGSTOP, a long GC pause, a swapped-out process), and must not be failed by this layer
  // before the op waiting on it times out: the connections' peer_timeout_us is raised to at
  // least this. A peer whose port is closed is failed at once (handlePortUnreachable).
  DurationUs opTimeoutUs = 0;
};

// A peer given up on: its connection failed (timeouts, abortPeer, close) for `error`.
struct PeerFailure {
  int peer = 0;
  std::string error;
};

class Endpoint {
 public:
  Endpoint(int rank, int size, EndpointOptions options);
  // Fails every request still pending (the user's buffers are about to go).
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const EndpointOptions& options() const { return options_; }

  // Datagrams from `address` belong to `peer` from now on. Throws TransportError for a rank
  // outside the group or an address another rank already has.
  void connect(int peer, const SocketAddress& address);
  // Multipath: the peer's socket of each path, in path order (as many as config.paths, or
  // one, which then serves every path). A datagram from addresses[p] arrived over path p.
  // `receiveBufferBytes`: what the peer's kernel granted its sockets (its address says), from
  // which the send window towards it is sized (sendWindowFor); unknown: send_window_bytes.
  void connect(int peer, std::span<const SocketAddress> addresses,
               std::optional<uint64_t> receiveBufferBytes = std::nullopt);

  // The Transport calls (transport.h), host memory only. Throw TransportError for a rank
  // outside the group or not connected yet; to a failed peer they return a failed request.
  RequestPtr send(int peer, Tag tag, const void* data, size_t bytes);
  RequestPtr recv(int peer, Tag tag, Tag mask, void* data, size_t bytes);
  // A receive from one peer whose bytes go to `sink` (MessageReceiver::postReceive), which the
  // caller keeps alive as long as the request.
  RequestPtr recv(int peer, Tag tag, Tag mask, size_t bytes, ReceiveSink& sink);
  // Fails the connection and, right away, every request to or from `peer` (their buffers may
  // go as soon as this returns).
  void abortPeer(int peer, const std::string& why);
  std::string peerError(int peer) const;  // empty while the peer is healthy
  // The peer whose message matching (tag, mask) has arrived and waits for a receive; -1 if
  // none (Transport::probe). Posts nothing.
  int probe(Tag tag, Tag mask) const;
  // The next peer failure not yet polled, once each.
  std::optional<PeerFailure> pollPeerFailure();

  // One datagram from `from`, or with segmentSize set a train of datagrams of that size cut
  // back apart (UDP GRO). Datagrams from an address no peer has are counted and dropped;
  // returns whether `from` was a peer's.
  bool handleDatagram(TimeUs now, const SocketAddress& from, std::span<const uint8_t> bytes,
                      size_t segmentSize = 0);
  // The network says that a datagram to `to` found no socket there (an ICMP port unreachable:
  // the process behind it is gone, since a stopped one keeps its socket). If `to` is a peer's
  // and requests to or from it are pending, its connection fails now and they fail with an
  // error saying so; with nothing pending it is only counted (a late ACK to a peer that
  // closed the group after its last op is no failure). Returns whether a connection failed.
  // In the authenticated mode the report is not trusted on its own (ICMP carries no tag, and
  // anyone who can spoof packets can forge one): the peer is sent a PING and fails only if
  // nothing authenticated comes from it within unreachableGraceUs() (handleTimeout).
  bool handlePortUnreachable(TimeUs now, const SocketAddress& to);
  uint64_t portUnreachableReports() const { return portUnreachable_; }

  // Delivers the datagrams fault injection held back, fires the connections' due timers and,
  // while lingering, repeats the ACKs and the CLOSEs. Returns whether a held-back datagram was delivered.
  bool handleTimeout(TimeUs now);
  // Writes the next datagram to send into `out` (at least mtu_payload bytes), sets `to`, and
  // returns its length; 0 when nothing may be sent now. Peers take turns, up to kPeerBurst
  // datagrams each, so that no peer's backlog starves the others; consecutive datagrams to one
  // peer come out together (a GSO train).
  size_t pollTransmit(TimeUs now, std::span<uint8_t> out, SocketAddress& to);
  // The same, also saying which path (socket) it must leave from (0 .. config.paths-1).
  size_t pollTransmit(TimeUs now, std::span<uint8_t> out, SocketAddress& to, uint32_t& path);
  static constexpr size_t kPeerBurst = 64;
  // Turns the connections' events into request completions and peer failures, and binds
  // any-source receives to the first peer holding a matching message. Returns whether
  // anything happened.
  bool completeRequests();
  // When handleTimeout() (or completeRequests(), for a cancelled receive) must next run:
  // possibly already past; nullopt for nothing scheduled.
  std::optional<TimeUs> nextTimeout() const;

  // Closes the group: connections with requests still pending are cut off and every pending
  // request fails, any-source receives included (their buffers are about to go), then the
  // linger starts.
  void close(TimeUs now);
  bool closing() const { return linger_.has_value(); }
  // Call after each round of driving while closing: notes what arrived since the last call;
  // true once every live peer's CLOSE has come and ours has gone with nothing of ours
  // unacknowledged, or else once the peers have had long enough to hear our last ACKs.
  bool lingerDone(TimeUs now);

  // Counters.
  Stats peerStats(int peer) const;
  uint64_t unknownSourceDrops() const { return unknownSource_; }
  const FaultInjector* faults() const { return faults_.get(); }
  // Time series (udp_config trace_samples; null when off): what was sampled since the last
  // call, oldest first, appended to the two vectors.
  const TraceRecorder* trace() const { return trace_.get(); }
  void drainTrace(std::vector<ConnectionSample>& connections, std::vector<QueueSample>& queues) {
    if (trace_) trace_->drain(connections, queues);
  }
  // Samples every connected peer now, due or not (the end of an op).
  void sampleTraceNow(TimeUs now);

 private:
  // recv() with an optional sink.
  RequestPtr postReceive(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                         ReceiveSink* sink);
  class EndpointRequest;
  using EndpointRequestPtr = std::shared_ptr<EndpointRequest>;

  struct Peer {
    std::unique_ptr<PeerConnection> connection;
    std::unique_ptr<DatagramSealer> sealer;  // authenticated mode only
    std::unique_ptr<DatagramOpener> opener;
    uint64_t authDroppedBytes = 0;  // what the opener refused (its counters count datagrams)
    // Authenticated mode: when an ICMP port unreachable named this peer's port, while nothing
    // authenticated has come from it since (handlePortUnreachable).
    std::optional<TimeUs> unreachableSince;
    // The paths (bit p: path p) whose port an ICMP port unreachable named since a datagram
    // last came over them: what a failure's message reports per path (pathReport).
    uint32_t refusedPaths = 0;
    std::vector<SocketAddress> addresses;  // one per path (or one for all)
    bool connected = false;
    std::string error;  // why the connection failed (empty while healthy)
    std::unordered_map<MessageId, EndpointRequestPtr> sends;
    std::unordered_map<ReceiveId, EndpointRequestPtr> receives;
  };

  // A datagram held back by fault injection until `dueUs`.
  struct Delayed {
    TimeUs dueUs;
    uint64_t order;  // FIFO among equal due times
    int peer;
    uint32_t path;
    std::vector<uint8_t> bytes;
    bool operator>(const Delayed& o) const {
      return dueUs != o.dueUs ? dueUs > o.dueUs : order > o.order;
    }
  };

  // What the linger watches: what a peer still waiting on us sends (anything but ACKs: two
  // lingering peers repeat their ACKs to each other, and that alone must not keep either of
  // them here), and duplicates (our ACK was lost).
  struct Heard {
    uint64_t heard = 0, duplicates = 0;
  };
  struct Linger {
    TimeUs start = 0;
    TimeUs lastHeard = 0;
    std::optional<TimeUs> lastAckRepeat;
    DurationUs quiet = 0;
    Heard seen;
  };

  Peer& peerAt(int peer, const char* what);
  void deliver(int peer, uint32_t path, std::span<const uint8_t> bytes, TimeUs now);
  void cancelRequest(EndpointRequest& request);
  void failPeer(int peer, const std::string& why);
  // Authenticated mode: fails the peers whose closed port no authenticated datagram
  // contradicted within unreachableGraceUs(); returns whether one failed.
  bool failUnreachable(TimeUs now);
  // The ports of `peer` that an ICMP port unreachable named, with the verb ("port A is",
  // "ports A and B are"); path 0's if none did.
  std::string refusedPorts(const Peer& peer) const;
  // Several paths: what each path to `peer` met, appended to a failure's message, so that it
  // names every path and why it failed, not the first only ("" with one path).
  std::string pathReport(const Peer& peer) const;
  DurationUs unreachableGraceUs() const;
  bool handleEvents();
  // Binds any-source receives to the first peer holding a matching message; fails them once
  // a peer they could come from has failed (docs/failure-model.md: a dead peer fails the op).
  bool matchAnySource();
  // Keeps the keepalive running towards every peer while an any-source receive is pending
  // (PeerConnection::setAnySourcePending): otherwise nothing goes to a peer that died quietly
  // and its closed port is never found, and the receive waits out the group's timeout.
  void watchAnySource();
  bool completeCancelled();
  Heard heard() const;
  bool allIdle() const;
  // Every live connection: the peer's CLOSE came, ours went, nothing of ours unacknowledged.
  bool allClosedAndSettled() const;

  const int rank_;
  const int size_;
  const EndpointOptions options_;
  std::vector<Peer> peers_;
  struct Route {
    int peer = 0;
    uint32_t path = 0;
  };
  std::unordered_map<SocketAddress, Route, SocketAddressHash> peerByAddress_;
  std::unique_ptr<FaultInjector> faults_;
  // congestion=credit's receiving side: this rank's downlink, shared by its connections.
  std::unique_ptr<CreditScheduler> credits_;
  std::unique_ptr<TraceRecorder> trace_;
  std::priority_queue<Delayed, std::vector<Delayed>, std::greater<>> delayed_;
  uint64_t delayedOrder_ = 0;
  std::vector<FaultInjector::Delivery> faultOut_;
  // Any-source receives not yet bound to a peer, in post order.
  std::deque<EndpointRequestPtr> anySource_;
  // Requests whose cancellation completes in the next completeRequests().
  std::vector<EndpointRequestPtr> cancelled_;
  std::deque<PeerFailure> failures_;
  uint64_t unknownSource_ = 0;
  uint64_t portUnreachable_ = 0;
  // pollTransmit's turn: whose it is and how many datagrams that peer has had in it.
  int transmitTurn_ = 0;
  size_t turnBurst_ = 0;
  std::optional<Linger> linger_;
};

}  // namespace ucxb::udp
