// UdpTransport: the Transport interface over a plain UDP socket. It is the I/O loop around
// the sans-IO Endpoint (endpoint.h), which does everything else: routing by address, requests,
// any-source matching, cancellation, fault injection, the linger after close, and through its
// PeerConnections (reliability.h) everything a network does not.
//
// The loop, run inside progress() on the owner thread:
//   receive a batch (recvmmsg) and hand each datagram to the endpoint -> let it fire what is
//   due -> collect its outgoing datagrams and send them in batches (sendmmsg), consecutive
//   full-size ones to one peer as one GSO train -> let it complete requests.
// Sleeping: eventFd() is an epoll set of the socket and a timerfd; arm() sets the timerfd to
// the endpoint's next deadline, so an idle group costs no CPU and a pending retransmission
// still fires on time.
//
// Addresses: each rank binds one socket per path (udp_config paths, 1 by default) to the
// address it was given (the interface chosen in Python) and a free port; the blob exchanged
// through the Store carries those addresses in path order. The endpoint says which path each
// datagram takes, and it leaves from that path's socket (multipath: path_selector.h). A
// datagram from any other address is dropped and counted, as is one with another group
// instance's session token (the core checks the token and the source rank). In the
// authenticated mode (secret_file) the endpoint first checks each datagram's tag and counter
// (datagram_auth.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transports/transport.h"
#include "transports/udp/endpoint.h"
#include "transports/udp/udp_socket.h"

namespace ucxb::udp {

struct UdpTransportOptions : EndpointOptions {
  std::string bindHost = "127.0.0.1";  // numeric IPv4/IPv6 address of the chosen interface
};

class UdpTransport final : public Transport {
 public:
  UdpTransport(int rank, int size, UdpTransportOptions options);
  ~UdpTransport() override;
  UdpTransport(const UdpTransport&) = delete;
  UdpTransport& operator=(const UdpTransport&) = delete;

  std::string name() const override { return "udp"; }
  int rank() const override { return endpoint_.rank(); }
  int size() const override { return endpoint_.size(); }

  std::vector<uint8_t> localAddress() const override;
  void connect(int peer, const std::vector<uint8_t>& address) override;

  RequestPtr send(int peer, Tag tag, const void* data, size_t bytes,
                  MemoryType mem = MemoryType::kHost) override;
  RequestPtr recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                  MemoryType mem = MemoryType::kHost) override;
  // Each DATA payload folded into `dst` as it arrives (FoldTarget), from the receive batch
  // where it was just checked, instead of stored in a buffer the caller reads back to reduce.
  // From one peer only (nullptr for any source: the caller then receives and reduces).
  RequestPtr recvFolded(int peer, Tag tag, Tag mask, void* dst, size_t bytes,
                        size_t elementSize, Fold fold) override;

  bool progress() override;
  bool arm() override;
  int eventFd() const override { return epollFd_.get(); }
  int probe(Tag tag, Tag mask) override;
  std::string peerError(int peer) const override;
  void abortPeer(int peer, const std::string& why) override;

  std::vector<Counters> peerCounters() const override;
  Counters transportCounters() const override;
  std::vector<TraceSeries> drainTraceSeries() override;
  // Every udp op ends here while traffic counters are kept: no clock read unless recording.
  void sampleTraceAtOpEnd() override {
    if (endpoint_.trace() != nullptr) endpoint_.sampleTraceNow(nowUs());
  }

  const SocketAddress& boundAddress() const { return socket_.localAddress(); }

 private:
  // Transport-wide counters of the I/O (the endpoint keeps its own, each connection its Stats).
  struct Counts {
    uint64_t truncatedOnReceive = 0;  // longer than the receive buffer
    uint64_t sendBlocked = 0;       // times the socket's send buffer was full
    uint64_t receiveBatches = 0;
    uint64_t sendBatches = 0;
    uint64_t trainsSent = 0;      // GSO sends (several datagrams in one)
    uint64_t trainsReceived = 0;  // GRO receives
    uint64_t socketErrors = 0;    // ICMP errors read from the error queue
  };

  static TimeUs nowUs();
  // Both return how many datagrams came in (each datagram of a train counted).
  size_t receiveDatagrams(TimeUs now, bool& active);
  size_t receiveFrom(UdpSocket& socket, TimeUs now, bool& active);
  // Hands the endpoint the peers whose port turned out closed; returns whether any error
  // was read.
  bool receiveRefusals(TimeUs now);
  // Sends up to `budget` datagrams.
  void transmit(TimeUs now, bool& active, size_t budget);
  bool flushOutgoing();
  void buildTrains();
  void setWantWritable(bool want);
  void linger();
  UdpSocket& socketOf(uint32_t path) { return path == 0 ? socket_ : *pathSockets_[path - 1]; }
  const UdpSocket& socketOf(uint32_t path) const {
    return path == 0 ? socket_ : *pathSockets_[path - 1];
  }
  uint32_t socketCount() const { return static_cast<uint32_t>(pathSockets_.size() + 1); }

  Endpoint endpoint_;
  UdpSocket socket_;  // path 0
  std::vector<std::unique_ptr<UdpSocket>> pathSockets_;  // paths 1 .. paths-1
  UniqueFd epollFd_;
  UniqueFd timerFd_;
  bool wantWritable_ = false;
  bool sendBacklog_ = false;  // transmit() stopped with datagrams still to send
  Counts counts_;

  // Receive side: one buffer per batch slot, large enough for any UDP datagram.
  std::unique_ptr<uint8_t[]> receiveArena_;
  std::vector<Datagram> receiveBatch_;
  // Send side: datagrams written by the endpoint and not yet accepted by the socket.
  std::unique_ptr<uint8_t[]> sendArena_;
  std::vector<Datagram> outgoing_;  // slots [0, outgoingCount_) are filled
  std::vector<uint32_t> outgoingPath_;  // the path of each slot
  size_t outgoingSent_ = 0;        // of those, already sent (the socket was full)
  size_t outgoingCount_ = 0;
  std::vector<Datagram> trains_;   // the unsent slots grouped for one sendmmsg
  std::vector<size_t> trainSlots_; // how many slots each train covers
  std::vector<uint32_t> trainPath_;  // and the path (socket) it leaves from
  std::vector<SocketAddress> refused_;  // scratch for receiveRefusals()
};

}  // namespace ucxb::udp
