// An in-memory Transport for the ranks of one group running on threads of one process, so the
// collective algorithms can be tested without UCX, sockets or the backend's engine. Test-only
// (tests/cpp, not transports/): setup.py compiles every transports/**/*.cpp into the
// extension, and the backend has no use for a transport that cannot leave the process.
//
// It keeps transport.h's contract: each rank's InprocTransport and its requests belong to
// that rank's thread, and requests complete only inside that thread's progress(). The ranks
// share a Fabric, whose one mutex guards every inbox.
//
// A message moves like a UCX rendezvous: send() queues a descriptor of the sender's buffer
// in the receiver's inbox; the receiver's progress() matches each message, in arrival order,
// to the earliest posted receive whose tag agrees on the receive's mask bits (FIFO, as UCX's
// tag matching), copies straight out of the sender's buffer, and only then hands the message
// back to the sender, whose next progress() completes the send. So a
// sender that reuses its buffer before its send completes corrupts what the peer receives,
// as it would over UCX. A message longer than the receive fails the receive (truncated) and
// completes the send. cancel() withdraws a message no receive has taken yet; abortPeer()
// cuts the link both ways and fails every outstanding request with that peer.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "transports/transport.h"

namespace ucxb::inproc {

// One posted send: a view of the sender's buffer, in the receiver's inbox until taken.
struct Message {
  enum class State { kQueued, kTaken, kDelivered, kWithdrawn };
  int source = -1;
  int destination = -1;
  Tag tag = 0;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  State state = State::kQueued;  // guarded by Fabric::mu_
};

// An eventfd, closed with its owner.
class EventFd {
 public:
  EventFd();  // throws TransportError
  ~EventFd();
  EventFd(EventFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  EventFd& operator=(EventFd&&) = delete;
  int fd() const { return fd_; }
  void signal() const;
  void drain() const;

 private:
  int fd_;
};

// What the ranks of one group share. Outlives every transport made from it.
class Fabric {
 public:
  // folds: the transports fold receives (Transport::recvFolded), handing each message over in
  // pieces cut inside elements, the last piece first; otherwise recvFolded says they cannot.
  // carriesDevice: send/recv take memory labelled MemoryType::kCuda and move it as they move
  // host memory (ucx's CUDA path, for CarriedMemory: device_stand_ins.h); otherwise they
  // refuse it (udp's).
  explicit Fabric(int size, bool folds = false, bool carriesDevice = false);
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  // Rank `rank`'s transport; one per rank, used by one thread at a time.
  std::unique_ptr<Transport> transport(int rank);
  // Folding receives posted so far on every rank (recvFolded calls that returned a request).
  uint64_t foldsPosted() const { return foldsPosted_.load(); }
  // Sends posted so far on every rank: how many messages the ops' algorithms exchanged.
  uint64_t sendsPosted() const { return sendsPosted_.load(); }
  // Lets the transports map each other's exposed buffers (Transport::exposeMemory,
  // mapPeerMemory), as ucx maps a CUDA buffer of a peer on this node: trivially, since the
  // ranks share an address space. Otherwise both answer unsupported. `refusingRank`'s
  // mapPeerMemory answers unsupported all the same (a peer UCX cannot reach so), and
  // `throwingRank`'s throws TransportError (a mapping that fails): -1, none. Before any
  // transport() is made.
  // `stallingRank`'s mapPeerMemory first sleeps `stall` (a peer that stalls mid-op).
  void allowPeerMaps(int refusingRank = -1, int throwingRank = -1, int stallingRank = -1,
                     std::chrono::milliseconds stall = {}) {
    peerMaps_ = true;
    peerMapRefusingRank_ = refusingRank;
    peerMapThrowingRank_ = throwingRank;
    peerMapStallingRank_ = stallingRank;
    peerMapStall_ = stall;
  }
  // Mappings made so far on every rank (mapPeerMemory calls that returned one).
  uint64_t peerMapsMade() const { return peerMapsMade_.load(); }

 private:
  friend class InprocTransport;
  struct Rank {
    std::deque<std::shared_ptr<Message>> inbox;  // arrival order
    // This rank's sends whose receiver has copied them out, for its next progress().
    std::vector<std::shared_ptr<Message>> delivered;
    EventFd wake;                  // readable after notify()
    uint64_t events = 0;           // notify() count, for arm()
    std::vector<std::string> cut;  // cut[peer]: why the link is gone ("" = up)
    uint64_t cuts = 0;             // changes of `cut`, so progress() rescans only then
  };
  // Wakes `rank`: something in its inbox or one of its sends changed. Caller holds mu_.
  void notify(int rank);

  std::mutex mu_;
  std::condition_variable delivered_;  // a taken message was delivered
  std::vector<Rank> ranks_;
  const bool folds_;
  const bool carriesDevice_;
  std::atomic<uint64_t> foldsPosted_{0};
  std::atomic<uint64_t> sendsPosted_{0};
  bool peerMaps_ = false;
  int peerMapRefusingRank_ = -1;
  int peerMapThrowingRank_ = -1;
  int peerMapStallingRank_ = -1;
  std::chrono::milliseconds peerMapStall_{0};
  std::atomic<uint64_t> peerMapsMade_{0};
};

}  // namespace ucxb::inproc
