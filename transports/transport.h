// The transport interface: tagged, non-blocking send/recv of contiguous bytes between the ranks
// of one group, plus the hooks an owner thread needs to drive it (progress, arm, event fd).
//
// Threading contract: a Transport and every Request it returns belong to ONE thread (the
// backend's progress thread). Completion is observed only inside progress() on that thread, so
// request state needs no locks. This mirrors a UCX worker created in UCS_THREAD_MODE_SINGLE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ucxb {

using Tag = uint64_t;
constexpr int kAnySource = -1;

// How a transport names a peer in its errors: "rank 3", or "any rank" for kAnySource.
inline std::string peerLabel(int peer) {
  return peer == kAnySource ? std::string("any rank") : "rank " + std::to_string(peer);
}

enum class MemoryType { kHost, kCuda };

// Whether bytes in `memory` may take the paths that read and write them on the host: the
// backend's shared-memory slots (csrc/collectives/staged_path.h: memcpy and the host
// kernels), the folding receive (recvFolded: the host kernels inside progress()) and the
// streamed receive built on it (non-temporal host stores), ucx's send lane (a second worker
// that posts host memory) and the backend's inline run on the caller's thread (no device
// stream, no ready event). The one rule for all of them, asked with the memory type of the op
// (Comm::staging(), Comm::recvFolded(), Comm::recvStreamed(), TransportBackend::enqueue) or of
// the message (UcxTransport::viaLane): host memory only. A CUDA buffer on one of them would be
// read by the host (a crash, or bytes that are not the tensor's), or leave before the
// kernels that write it have run.
constexpr bool takesHostPaths(MemoryType memory) { return memory == MemoryType::kHost; }

enum class RequestState { kPending, kDone, kFailed };

// One posted send or receive. The transport fills in the outcome during progress().
class Request {
 public:
  Request(bool isSend, int peer, size_t bytes) : isSend_(isSend), peer_(peer), postedBytes_(bytes) {}
  virtual ~Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  RequestState state() const { return state_; }
  bool pending() const { return state_ == RequestState::kPending; }
  bool failed() const { return state_ == RequestState::kFailed; }
  bool isSend() const { return isSend_; }
  // The peer given when posting (kAnySource for a wildcard receive).
  int peer() const { return peer_; }
  // The peer whose bytes the request moves: peer(), or for a wildcard receive the peer whose
  // message it has begun to take (kAnySource while none). Whom a request that cannot be
  // withdrawn ties to it (csrc/p2p_withdraw.hpp cuts that peer off).
  virtual int boundPeer() const { return peer_; }
  size_t postedBytes() const { return postedBytes_; }
  // For receives: the bytes that actually arrived and the sender's full tag.
  size_t receivedBytes() const { return receivedBytes_; }
  Tag senderTag() const { return senderTag_; }
  const std::string& error() const { return error_; }
  // A receive that failed only because the message was longer than its buffer. The transport
  // took the whole message (what did not fit was dropped), so nothing of it is left to match
  // a later receive: as with a shorter message, the ranks disagree on a size, and no peer or
  // connection failed.
  bool truncated() const { return truncated_; }

  // Asks the transport to abandon the request. It completes (failed or done) in a later
  // progress() call; until then the buffer must stay alive.
  virtual void cancel() = 0;

  // Invoked once, on the owner thread, when the request leaves kPending. If it already has,
  // the callback runs immediately.
  void onComplete(std::function<void(Request&)> cb) {
    if (!pending()) {
      cb(*this);
    } else {
      callback_ = std::move(cb);
    }
  }

  // Forgets the onComplete callback, unrun: for an owner that gives the request up and is
  // gone before it settles (a cancel cannot stop a receive already matched to a message whose
  // last fragments are on their way, so it may settle long after). Owner thread.
  void dropOnComplete() { callback_ = nullptr; }

  // Anything that must outlive the request (e.g. the tensors whose memory it reads or writes)
  // when its owner gives up on it before the transport has finished with it. Adds to what
  // earlier calls gave (a staging buffer, then the op's tensors).
  void keepAlive(std::shared_ptr<void> owner) { keepAlive_.push_back(std::move(owner)); }

 protected:
  void complete(size_t bytes, Tag senderTag) {
    receivedBytes_ = bytes;
    senderTag_ = senderTag;
    settle(RequestState::kDone);
  }
  void fail(std::string why) {
    error_ = std::move(why);
    settle(RequestState::kFailed);
  }
  void failTruncated(std::string why) {
    truncated_ = true;
    fail(std::move(why));
  }

 private:
  void settle(RequestState s) {
    state_ = s;
    if (callback_) {
      auto cb = std::move(callback_);
      callback_ = nullptr;
      cb(*this);
    }
  }

  const bool isSend_;
  const int peer_;
  const size_t postedBytes_;
  RequestState state_ = RequestState::kPending;
  size_t receivedBytes_ = 0;
  Tag senderTag_ = 0;
  std::string error_;
  bool truncated_ = false;
  std::function<void(Request&)> callback_;
  std::vector<std::shared_ptr<void>> keepAlive_;
};

using RequestPtr = std::shared_ptr<Request>;

// Named counters (snake_case name, value): what a transport reports about its traffic.
using Counters = std::vector<std::pair<std::string, uint64_t>>;

// Samples of one kind of a transport's time series (udp: trace_samples): every sample has a
// value per field, stored one sample after another in `values` (names once, not per sample).
struct TraceSeries {
  std::string kind;
  std::vector<std::string> fields;
  std::vector<uint64_t> values;
  uint64_t overwritten = 0;  // samples lost so far because nobody read them in time
};

// Raised for failures a caller cannot recover from locally (set-up, bad address, ...). Failures
// of individual messages are reported through Request::error() instead.
class TransportError : public std::runtime_error {
 public:
  TransportError(const std::string& what, int peer = -1) : std::runtime_error(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// A buffer of this rank exposed to its peers (Transport::exposeMemory): blob() is what a peer
// passes to Transport::mapPeerMemory, through a message of the caller's. The exposure ends
// when this is destroyed; a peer's mapping of it must be gone (or unused) by then.
class ExposedMemory {
 public:
  virtual ~ExposedMemory() = default;
  virtual const std::vector<uint8_t>& blob() const = 0;
};

// A peer's exposed buffer mapped into this process (Transport::mapPeerMemory): data() is the
// peer's buffer at the address this process uses for it (for device memory: one that kernels
// of this process on its current device read and write), valid until this is destroyed.
class PeerMapping {
 public:
  virtual ~PeerMapping() = default;
  virtual void* data() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Opaque blob a peer passes to connect() to reach this rank.
  virtual std::vector<uint8_t> localAddress() const = 0;
  virtual void connect(int peer, const std::vector<uint8_t>& address) = 0;

  // Non-blocking. The buffer must stay valid until the request completes.
  virtual RequestPtr send(int peer, Tag tag, const void* data, size_t bytes,
                          MemoryType mem = MemoryType::kHost) = 0;
  // Matches a message whose tag equals `tag` on the bits set in `mask`. `peer` is recorded for
  // error reporting only (the source rank is part of the tag); kAnySource for wildcards.
  virtual RequestPtr recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                          MemoryType mem = MemoryType::kHost) = 0;

  // Runs completions; returns true if anything happened.
  virtual bool progress() = 0;
  // Prepares to sleep on eventFd(). Returns false if events are already pending (progress
  // again instead of sleeping).
  virtual bool arm() = 0;
  // Becomes readable when progress() has work to do. -1 if the transport cannot sleep.
  virtual int eventFd() const = 0;

  // The source rank of a message that is already here, matches `tag` on the bits set in
  // `mask` and no receive has taken, left in place for a recv() to take; -1 if none. It posts
  // nothing and watches no peer, where a receive left posted would cost every op (ucx keeps a
  // wildcard receive on a queue that each arriving message checks, and makes an endpoint for
  // each peer a receive names) and change an idle group (udp keeps a keepalive running to
  // each peer a receive waits on, and fails it when the peer exits): how a group looks for
  // its failure notices (csrc/engine/failure_notice.h). -1 where the transport cannot tell.
  virtual int probe(Tag /*tag*/, Tag /*mask*/) { return -1; }

  // Non-empty once the transport has seen this peer fail (connection reset, keepalive lost).
  virtual std::string peerError(int peer) const = 0;

  // Force-closes the connection to `peer`: every outstanding request to or from it completes
  // (failed) and later ones fail at once with `why`. Called after an op failed with requests
  // the transport could not cancel, so that no request outlives the buffers it points into.
  virtual void abortPeer(int peer, const std::string& why) = 0;

  // Whether the backend may move bytes between ranks of one host through shared memory of its
  // own (csrc/staging_setup.cpp) instead of through this transport: a medium the transport
  // itself would use there. No by default: udp exists to put every byte on the wire.
  virtual bool permitsSharedMemory() const { return false; }

  // Whether send/recv take device memory (MemoryType::kCuda) and move it themselves. If not,
  // the backend stages device buffers through pinned host memory (collectives/op_memory.h).
  virtual bool carriesDeviceMemory() const { return false; }

  // Whether this rank's transport reaches every rank whose address is in `addresses` (every
  // rank's, by rank, this one's included). Every rank must give the same answer, so it comes
  // from the addresses alone. False makes every rank of the group build its transport again
  // for any host and exchange the new addresses (a ucx worker made for one host, in a group
  // that spans hosts: csrc/transport_backend.cpp).
  virtual bool reachesAll(const std::vector<std::vector<uint8_t>>& /*addresses*/) const {
    return true;
  }
  // The transports below this one that may carry its bytes (ucx: its UCP context's), for
  // startup_profile; empty where there is no such choice.
  virtual std::vector<std::string> lowerTransports() const { return {}; }
  // Threads this transport runs beside its owner's (ucx: the send lane's, once a peer on
  // another host made one); the owner counts them among its rank's own threads. After connect.
  virtual int threadsOfItsOwn() const { return 0; }

  // Traffic counters per peer (index = peer rank) and for the transport as a whole; empty for
  // a transport that keeps none. Owner thread only, like everything else here.
  virtual std::vector<Counters> peerCounters() const { return {}; }
  virtual Counters transportCounters() const { return {}; }
  // The time-series samples taken since the last call (each kind's oldest first); empty when
  // the transport records none. Owner thread only.
  virtual std::vector<TraceSeries> drainTraceSeries() { return {}; }
  // An op just ended: sample every connection now, whatever the sampling interval, so that
  // even an op shorter than the interval has its samples. Owner thread only.
  virtual void sampleTraceAtOpEnd() {}

  // Peer mapping: this rank exposes a buffer (exposeMemory), sends the blob to a peer in a
  // message of its own, and the peer maps it (mapPeerMemory) and reads or writes the buffer
  // directly, with no message carrying its bytes (csrc/collectives/peer_map.cpp). Both answer
  // null with `why` set where the transport cannot (the default: a transport with no shared
  // address space to offer, or memory it cannot export, or a peer it cannot reach so): a
  // clean "unsupported" that the caller falls back from. A failure of the transport itself
  // throws TransportError. Owner thread only; a mapping holds what it needs of the
  // transport, which outlives it.
  virtual std::unique_ptr<ExposedMemory> exposeMemory(void* /*data*/, size_t /*bytes*/,
                                                      MemoryType /*memory*/, std::string& why) {
    why = name() + " does not map memory between ranks";
    return nullptr;
  }
  // `bytes`: how much of the peer's buffer the caller will touch, from its start (the blob
  // says where it is); `memory`: its type, as the peer exposed it.
  virtual std::unique_ptr<PeerMapping> mapPeerMemory(int /*peer*/,
                                                     const std::vector<uint8_t>& /*blob*/,
                                                     size_t /*bytes*/, MemoryType /*memory*/,
                                                     std::string& why) {
    why = name() + " does not map memory between ranks";
    return nullptr;
  }

  // Folds `elements` elements of `in` into `acc` (acc[i] = acc[i] op in[i]): a receive that
  // reduces as it arrives (recvFolded).
  using Fold = std::function<void(void* acc, const void* in, size_t elements)>;
  // Like recv() into `dst`, but each piece of the message is folded into `dst` with `fold` as
  // it arrives (elements of `elementSize` bytes, at most 16) instead of being stored: no copy
  // through a bounce buffer and no second pass over it. Null where the transport cannot, or
  // does not for this peer (the caller then receives into a buffer and reduces it). Host
  // memory only; `fold` runs inside progress(), on the owner thread, and may see the pieces in
  // any order.
  virtual RequestPtr recvFolded(int /*peer*/, Tag /*tag*/, Tag /*mask*/, void* /*dst*/,
                                size_t /*bytes*/, size_t /*elementSize*/, Fold /*fold*/) {
    return nullptr;
  }
};

}  // namespace ucxb
