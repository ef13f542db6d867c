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
// ring in the receiver's inbox. A send no longer than the ring (eagerBytes_: 256 KiB at 2
// ranks, 32 KiB at 32) completes once its last byte is in the ring (the bytes are then in the
// receiver's memory: they arrive even if the sender exits); a longer one also waits until a
// receive has taken it, which the receiver tells the sender with a header of its own in its
// ring the other way, as ucx's rendezvous does (a send that no receive matches does not
// complete). The receive of such a message succeeds only once that notice is in the ring and
// the sender had not given the message up then (RingControl::abandoned, set by its
// abortPeer() or destructor, which then take the notices already written before they fail
// what is left): a receive never takes a message whose send failed; it fails instead, also
// when the notice was written in the instant the sender gave up. Such a message streams
// through the ring while the receiver copies out, or, where
// the receiver may read the sender's memory (process_vm_readv: ptrace rules and a container's
// seccomp decide, tried once per pair at connect), goes by reference: the header names the
// payload's address, the receiver copies it straight into the receive's buffer, then tells
// the sender (one copy instead of two, as UCX's cma rendezvous). The receiver matches a header
// against its posted receives (tag under mask, in posting order) or keeps the message as
// unexpected until a receive asks for it, in arrival order per sender. Host memory only: the
// backend stages device buffers through host memory (carriesDeviceMemory).
//
// Failure: a peer whose process exits (its pidfd turns readable), that abortPeer() names, or
// that cut this rank off, could not populate its ring here (/dev/shm full) or destroyed its
// transport (RingControl::abandoned, which the destructor, abortPeer() and a failed populate
// set in the peer's ring) fails every request to or from it, once what it wrote before is
// taken; any-source receives pending then fail too, as over ucx.
// cancel() settles a receive, or a send not yet begun, in the next progress(); a send whose
// header is out stays pending (the receiver holds it, as a ucx peer holds an announced
// rendezvous; one sent by reference may be read until the receiver answers).
//
// Sleeping: arm() takes the doorbell's rings and sets the inbox's `sleeping` word; the first
// sender to publish after it clears the word and rings. The ring stays until the next arm(),
// whoever calls progress() meanwhile, as a ucx worker's fd does: the engine's progress
// thread may sleep on eventFd() while an inline op's caller drives the transport, and must
// still wake for a message that arrives after that op (a point-to-point receive it
// completes). Before 2026-11-28 progress() cleared the word and took the rings, and such a
// receive waited for the next op.
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
  uint64_t unused;   // keeps the body 16 bytes (the header's size)
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
  // A match notice queued for the sender of message `seq`, and the receive that took it,
  // which completes only once the notice is written (writeAcks).
  struct MatchNotice {
    uint64_t seq;
    std::shared_ptr<ShmRequest> receive;
  };
  // A message that arrived (or is arriving) before a receive asked for it.
  struct Arrival {
    int source;
    Tag tag;
    size_t bytes;
    std::unique_ptr<uint8_t[]> data;
    size_t got = 0;
    uint64_t seq = 0;  // its number among its sender's messages (kMatchedFlag names it)
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
    uint8_t* outBytes = nullptr;  // that ring's bytes, and how many of them are populated
    size_t outPopulated = 0;      // (InboxHeader::sendersPopulate; the ring's size if not)
    std::atomic<uint32_t>* sleeping = nullptr;
    Doorbell::Address doorbell;
    ByteRing in;                  // the peer's ring in this rank's inbox
    Inbound inbound;
    std::deque<std::shared_ptr<ShmRequest>> sends;  // in order; the front one is streaming
    // Sends longer than eagerBytes_ wholly in the ring, waiting for the peer to match them
    // (one sent by reference: to read it).
    std::vector<std::shared_ptr<ShmRequest>> unmatched;
    std::deque<MatchNotice> acks;  // the peer's messages matched here, to tell it
    uint64_t sentMessages = 0;     // messages this rank started to the peer
    uint64_t receivedMessages = 0; // messages this rank started to read from the peer
    std::string error;
  };

  std::shared_ptr<ShmRequest> makeRequest(bool isSend, int peer, size_t bytes);
  // Settles a receive with the message it took: done, or truncated if it was longer; one whose
  // match notice is not out yet completes when it is (noticeWritten).
  void finishReceive(const std::shared_ptr<ShmRequest>& req, int source, Tag tag, size_t bytes);
  void cancelRequest(ShmRequest& req);
  bool pushSends(int peer);
  // The room in the peer's ring that pushSends() needs to write anything more: a header
  // between messages (a match notice, the next message), one byte inside one.
  static size_t roomNeeded(const Peer& p);
  // A send's last byte is in the ring: done, or waiting for the receiver's match.
  void sent(Peer& p, const std::shared_ptr<ShmRequest>& req);
  // `req` took message `seq` of `source`: tells the sender if it waits for that (a message
  // longer than eagerBytes_), and then `req` completes only once the notice is out.
  void matched(const std::shared_ptr<ShmRequest>& req, int source, uint64_t seq, size_t bytes);
  // The peer matched this rank's message `seq`.
  void takeMatch(int peer, uint64_t seq);
  // Writes the match notices queued for the peer that fit, then settles their receives
  // (noticeWritten); true if it wrote any.
  bool writeAcks(int peer);
  // The notice of `req`'s match is in the ring; `abandoned`: the sender's mark, read after it.
  void noticeWritten(int source, const std::shared_ptr<ShmRequest>& req, uint32_t abandoned);
  // Populates this rank's ring in the peer's inbox for `bytes` more past its tail (the pages
  // of the ring's first pass that the receiver left to its senders): "" or why it could not
  // (/dev/shm full), in which case nothing may be written there.
  std::string populateOut(Peer& p, size_t bytes);
  // Rings the peer's doorbell if it sleeps, after this rank published bytes to it.
  void wake(Peer& p);
  bool readMessages(int peer);
  void startMessage(int peer, Tag tag, size_t bytes);
  void endMessage(int peer);
  // Takes the message `a` for `req` (complete or not): copies what is there, or attaches.
  void deliver(const std::shared_ptr<Arrival>& a, const std::shared_ptr<ShmRequest>& req);
  std::shared_ptr<ShmRequest> matchPosted(int source, Tag tag);
  // Whether the unexpected message `a` is one its sender abandoned (RingControl::abandoned),
  // longer than eagerBytes_, so never complete for it: takeAbandonment() drops such ones.
  bool givenUp(const Arrival& a) const;
  // An unexpected message's record, its contents not yet kept.
  static std::shared_ptr<Arrival> newArrival(int source, Tag tag, size_t bytes, uint64_t seq);
  void startByReference(int peer, Tag tag, size_t bytes, const RendezvousBody& body);
  // Reads message `seq` of `source`, sent by reference, into `req`, tells the sender it was
  // matched (its buffer is free from then on), settles `req`.
  void readByReference(const std::shared_ptr<ShmRequest>& req, int source, Tag tag,
                       size_t bytes, const RendezvousBody& body, uint64_t seq);
  // Fails every peer whose process exited (after taking what it wrote); true if any did.
  bool checkPeers();
  // abortPeer() with the mark `mark` (RingControl::abandoned) that tells the peer why.
  void cutOff(int peer, uint32_t mark, const std::string& why);
  // The peer cut this rank off (its abortPeer) or left (destroyed its transport): fails it,
  // and drops what it gave up on. `why`: RingControl::abandoned.
  void takeAbandonment(int peer, uint32_t why);
  // The words a peer's abandonment `why` (RingControl::abandoned) fails requests with.
  static std::string abandonmentReason(int peer, uint32_t why);
  // Drops the peer's unexpected messages longer than eagerBytes_ that no receive took: their
  // sender fails them (it gave up, or sees that this rank did), so none may be taken later.
  void dropUntaken(int peer);
  void failPeer(int peer, const std::string& why);

  const int rank_;
  const int size_;
  const std::string host_;
  const uint64_t pidNamespace_;
  // The longest send that completes once it is in the ring: the ring's size (inbox.h). A
  // longer one completes only once a receive has taken it, as ucx's rendezvous and udp's large
  // messages do: a sender is never told that a message arrived that no rank asked for (a rank
  // passed a longer tensor than its peers, a send nobody receives), and its wait(timeout)
  // times out as it would over ucx.
  const size_t eagerBytes_;
  // The process that made it: a child forked later holds a copy that is not the rank.
  const pid_t creatorPid_;
  SharedSegment inbox_;
  std::unique_ptr<Doorbell> doorbell_;
  std::vector<uint8_t> address_;
  int epollFd_ = -1;
  std::vector<Peer> peers_;
  std::vector<std::shared_ptr<ShmRequest>> posted_;     // receives waiting for a message
  std::deque<std::shared_ptr<Arrival>> arrivals_;       // unexpected messages, oldest first
  std::vector<std::shared_ptr<ShmRequest>> settling_;   // settled in the next progress()
  // arm() returned true since the last progress(): a pidfd may have woken the sleeper.
  bool armed_ = false;
  bool anyPeerFailed_ = false;
  std::string firstFailure_;
  std::chrono::steady_clock::time_point nextPeerCheck_{};
  std::string closing_;
};

}  // namespace ucxb::shm
