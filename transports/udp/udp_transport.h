// UdpTransport: the Transport interface over plain UDP sockets, with the reliability core
// (reliability.h) doing everything a network does not: one PeerConnection per peer, driven by
// a socket loop that is the only part of the UDP transport touching the OS.
//
// The loop, run inside progress() on the owner thread:
//   receive a batch (recvmmsg) -> fault injection, if configured -> route each datagram by its
//   source address to the peer's connection -> fire due timers -> collect every connection's
//   outgoing datagrams and send them in batches (sendmmsg) -> turn the connections' events
//   into request completions -> match any-source receives.
// Sleeping: eventFd() is an epoll set of the socket and a timerfd; arm() sets the timerfd to
// the earliest timeout any connection asked for, so an idle group costs no CPU and a pending
// retransmission still fires on time.
//
// Addresses: each rank binds one socket to the address it was given (the interface chosen in
// Python) and a free port; the blob exchanged through the Store carries that address. A
// datagram from any other address is dropped and counted, as is one with another group
// instance's session token (the core checks the token and the source rank).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "transports/transport.h"
#include "transports/udp/faults.h"
#include "transports/udp/reliability.h"
#include "transports/udp/udp_config.h"
#include "transports/udp/udp_socket.h"

namespace ucxb::udp {

struct UdpTransportOptions {
  UdpConfig config;
  FaultConfig faults;        // applied to every datagram this rank receives
  std::string bindHost = "127.0.0.1";  // numeric IPv4/IPv6 address of the chosen interface
  uint64_t sessionToken = 0;           // the same on every rank of the group instance
  int socketBufferBytes = 8 << 20;     // kernel send/receive buffer to ask for
  // After the group is closed, keep answering the peers (acknowledging their retransmissions)
  // until nothing has arrived for this long (for rto_max_us once a peer has retransmitted
  // during the linger: our ACK was lost and its timer may be backing off), so that a peer
  // whose last ACK from us was lost still completes its send (TCP's TIME-WAIT, in short).
  // Bounded by lingerMaxUs.
  DurationUs lingerQuietUs = 100'000;
  DurationUs lingerMaxUs = 5'000'000;
};

class UdpTransport final : public Transport {
 public:
  UdpTransport(int rank, int size, UdpTransportOptions options);
  ~UdpTransport() override;
  UdpTransport(const UdpTransport&) = delete;
  UdpTransport& operator=(const UdpTransport&) = delete;

  std::string name() const override { return "udp"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<uint8_t> localAddress() const override;
  void connect(int peer, const std::vector<uint8_t>& address) override;

  RequestPtr send(int peer, Tag tag, const void* data, size_t bytes,
                  MemoryType mem = MemoryType::kHost) override;
  RequestPtr recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                  MemoryType mem = MemoryType::kHost) override;

  bool progress() override;
  bool arm() override;
  int eventFd() const override { return epollFd_.get(); }
  std::string peerError(int peer) const override;
  void abortPeer(int peer, const std::string& why) override;

  std::vector<Counters> peerCounters() const override;
  Counters transportCounters() const override;

  const SocketAddress& boundAddress() const { return socket_.localAddress(); }

 private:
  class UdpRequest;
  using UdpRequestPtr = std::shared_ptr<UdpRequest>;

  struct Peer {
    std::unique_ptr<PeerConnection> connection;
    SocketAddress address;
    bool connected = false;
    std::string error;  // why the connection failed (empty while healthy)
    std::unordered_map<MessageId, UdpRequestPtr> sends;
    std::unordered_map<ReceiveId, UdpRequestPtr> receives;
  };

  // A datagram held back by fault injection until `dueUs`.
  struct Delayed {
    TimeUs dueUs;
    uint64_t order;  // FIFO among equal due times
    int peer;
    std::vector<uint8_t> bytes;
    bool operator>(const Delayed& o) const {
      return dueUs != o.dueUs ? dueUs > o.dueUs : order > o.order;
    }
  };

  // Transport-wide counters (the per-peer ones live in each connection's Stats).
  struct Counts {
    uint64_t unknownSource = 0;     // datagrams from an address that is no peer's
    uint64_t truncatedOnReceive = 0;  // longer than the receive buffer
    uint64_t sendBlocked = 0;       // times the socket's send buffer was full
    uint64_t receiveBatches = 0;
    uint64_t sendBatches = 0;
    uint64_t trainsSent = 0;      // GSO sends (several datagrams in one)
    uint64_t trainsReceived = 0;  // GRO receives
  };

  static TimeUs nowUs();
  Peer& peerAt(int peer, const char* what);
  void receiveDatagrams(TimeUs now, bool& active);
  void deliver(int peer, std::span<const uint8_t> bytes, TimeUs now);
  void deliverDelayed(TimeUs now, bool& active);
  void fireTimers(TimeUs now);
  void transmit(TimeUs now, bool& active);
  bool flushOutgoing();
  void buildTrains();
  void handleEvents(bool& active);
  void matchAnySource(bool& active);
  void completeCancelled(bool& active);
  void cancelRequest(UdpRequest& request);
  void failPeer(int peer, const std::string& why);
  void setWantWritable(bool want);
  std::optional<TimeUs> earliestTimeout() const;
  void linger();

  const int rank_;
  const int size_;
  const UdpTransportOptions options_;
  UdpSocket socket_;
  UniqueFd epollFd_;
  UniqueFd timerFd_;
  bool wantWritable_ = false;
  bool sendBacklog_ = false;  // transmit() stopped with datagrams still to send
  std::vector<Peer> peers_;
  std::unordered_map<SocketAddress, int, SocketAddressHash> peerByAddress_;
  std::unique_ptr<FaultInjector> faults_;
  std::priority_queue<Delayed, std::vector<Delayed>, std::greater<>> delayed_;
  uint64_t delayedOrder_ = 0;
  std::vector<FaultInjector::Delivery> faultOut_;
  // Any-source receives not yet bound to a peer, in post order.
  std::deque<UdpRequestPtr> anySource_;
  // Requests whose cancellation completes in the next progress().
  std::vector<UdpRequestPtr> cancelled_;
  Counts counts_;
  int nextPeerToSend_ = 0;  // round-robin start, so no peer's backlog starves the others

  // Receive side: one buffer per batch slot, large enough for any UDP datagram.
  std::vector<uint8_t> receiveArena_;
  std::vector<Datagram> receiveBatch_;
  // Send side: datagrams written by the connections and not yet accepted by the socket.
  std::vector<uint8_t> sendArena_;
  std::vector<Datagram> outgoing_;  // slots [0, outgoingCount_) are filled
  size_t outgoingSent_ = 0;        // of those, already sent (the socket was full)
  size_t outgoingCount_ = 0;
  std::vector<Datagram> trains_;   // the unsent slots grouped for one sendmmsg
  std::vector<size_t> trainSlots_; // how many slots each train covers
};

}  // namespace ucxb::udp
