// Transport over shared memory alone, for a group whose ranks all run on one host: each rank
// owns an inbox (inbox.h) with a byte ring per sender, sleeps on a doorbell (doorbell.h) and
// watches its peers' processes through pidfds. Torch-free, UCX-free.
//
// Why: a ucx group's creation makes a UCP context, a worker and endpoints, about 3-4 ms of
// CPU per rank, the part of its start-up that Gloo does not pay (docs/performance.md,
// "Where a rank's start-up CPU goes"). This transport is made with a segment, a socket and a
// pidfd per peer. It is chosen by the one_host_transport option (csrc/transport_factory.cpp);
// a group that turns out to span hosts (reachesAll) is built again over UCX.
//
// Messages: a 16-byte header (tag, length) then the payload, streamed through the sender's
// ring in the receiver's inbox. A send completes once its last byte is in the ring (the
// bytes are then in the receiver's memory: they arrive even if the sender exits); a message
// longer than the ring streams while the receiver copies out. From 64 KiB up, where the
// receiver may read the sender's memory (process_vm_readv: ptrace rules and a container's
// seccomp decide, tried once per pair at connect), a message goes by reference instead: the
// header names the payload's address, the receiver copies it straight into the receive's
// buffer and answers, and the send completes on the answer (one copy instead of two, as
// UCX's cma rendezvous). The receiver matches a header
// against its posted receives (tag under mask, in posting order) or keeps the message as
// unexpected until a receive asks for it, in arrival order per sender. Host memory only: the
// backend stages device buffers through host memory (carriesDeviceMemory).
//
// Failure: a peer whose process exits (its pidfd turns readable) or that abortPeer() names
// fails every request to or from it, once what it wrote before is taken; any-source
// receives pending then fail too, as over ucx. cancel() settles in the next progress(),
// except a send announced by reference, which the peer may still read: it stays pending
// until the peer answers or fails (as a ucx rendezvous does).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "transports/shm/byte_ring.h"
#include "transports/shm/doorbell.h"
#include "transports/shm/shared_segment.h"
#include "transports/transport.h"

namespace ucxb::shm {

// What follows the header of a message sent by reference (shm_transport.cpp).
struct RendezvousBody {
  uint64_t address;  // of the payload, in the sender's memory
  uint64_t cookie;   // names the send in the receiver's answer
};

class ShmTransport final : public Transport {
 public:
  ShmTransport(int rank, int size);
  ~ShmTransport() override;
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  // Whether this host lets the transport watch a peer (pidfd_open, Linux 5.3): without it a
  // dead peer would hang its receivers, so the factory keeps ucx.
  static bool available();

  std::string name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<uint8_t> localAddress() const override { return address_; }
  // Maps the peer's inbox and opens its pidfd (throws TransportError naming the peer).
  void connect(int peer, const std::vector<uint8_t>& address) override;

  RequestPtr send(int peer, Tag tag, const void* data, size_t bytes, MemoryType mem) override;
  RequestPtr recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                  MemoryType mem) override;

  bool progress() override;
  bool arm() override;
  int eventFd() const override { return epollFd_; }
  int probe(Tag tag, Tag mask) override;
  std::string peerError(int peer) const override;
  void abortPeer(int peer, const std::string& why) override;
  bool permitsSharedMemory() const override { return true; }
  // Every address is a shm one from this host and pid namespace (pidfds name pids in it).
  bool reachesAll(const std::vector<std::vector<uint8_t>>& addresses) const override;
  std::vector<std::string> lowerTransports() const override { return {"shm"}; }

  class ShmRequest;  // public for the file's helpers; its members are the transport's

 private:
  // A message that arrived (or is arriving) before a receive asked for it.
  struct Arrival {
    int source;
    Tag tag;
    size_t bytes;
    std::unique_ptr<uint8_t[]> data;
    size_t got = 0;
    std::shared_ptr<ShmRequest> claimedBy;  // a receive that matched it before its end
    bool byReference = false;  // nothing copied yet: read from the sender when matched
    RendezvousBody body{};
  };
  // What this rank is reading out of one sender's ring.
  struct Inbound {
    bool inMessage = false;
    Tag tag = 0;
    size_t bytes = 0;
    size_t done = 0;
    std::shared_ptr<ShmRequest> target;  // the receive being filled, or
    std::shared_ptr<Arrival> arrival;    // the unexpected message being filled, or neither:
                                         // dropped (aborted peer, cancelled receive)
  };
  struct Peer {
    pid_t pid = 0;
    int pidfd = -1;
    SharedSegment inbox;          // the peer's inbox, mapped
    ByteRing out;                 // this rank's ring in it
    std::atomic<uint32_t>* sleeping = nullptr;
    Doorbell::Address doorbell;
    ByteRing in;                  // the peer's ring in this rank's inbox
    Inbound inbound;
    std::deque<std::shared_ptr<ShmRequest>> sends;  // in order; the front one is streaming
    // Sent by reference, announced, not yet read by the peer.
    std::vector<std::shared_ptr<ShmRequest>> awaitingRead;
    std::string error;
    bool ringPending = false;     // published bytes since the last doorbell check
  };

  std::shared_ptr<ShmRequest> makeRequest(bool isSend, int peer, size_t bytes);
  // Settles a receive with the message it took: done, or truncated if it was longer.
  void finishReceive(const std::shared_ptr<ShmRequest>& req, int source, Tag tag, size_t bytes);
  void cancelRequest(ShmRequest& req);
  bool pushSends(int peer);
  bool readMessages(int peer);
  void startMessage(int peer, Tag tag, size_t bytes);
  void endMessage(int peer);
  // Takes the message `a` for `req` (complete or not): copies what is there, or attaches.
  void deliver(const std::shared_ptr<Arrival>& a, const std::shared_ptr<ShmRequest>& req);
  std::shared_ptr<ShmRequest> matchPosted(int source, Tag tag);
  void startByReference(int peer, Tag tag, size_t bytes, const RendezvousBody& body);
  // Reads a message sent by reference into `req`, answers the sender, settles `req`.
  void readByReference(const std::shared_ptr<ShmRequest>& req, int source, Tag tag,
                       size_t bytes, const RendezvousBody& body);
  // The peer answered: its read of the send named by `cookie` is over.
  void finishedReading(int peer, uint64_t cookie);
  void checkPeers();
  void failPeer(int peer, const std::string& why);
  void failAnySource(const std::string& why);
  std::string label(int peer) const;

  const int rank_;
  const int size_;
  const std::string host_;
  const uint64_t pidNamespace_;
  SharedSegment inbox_;
  std::unique_ptr<Doorbell> doorbell_;
  std::vector<uint8_t> address_;
  int epollFd_ = -1;
  std::vector<Peer> peers_;
  std::vector<std::shared_ptr<ShmRequest>> posted_;     // receives waiting for a message
  std::deque<std::shared_ptr<Arrival>> arrivals_;       // unexpected messages, oldest first
  std::vector<std::shared_ptr<ShmRequest>> settling_;   // settled in the next progress()
  uint64_t nextCookie_ = 0;
  bool armed_ = false;
  bool anyPeerFailed_ = false;
  std::string firstFailure_;
  std::chrono::steady_clock::time_point nextPeerCheck_{};
  std::string closing_;
};

}  // namespace ucxb::shm
