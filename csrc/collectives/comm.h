// What an algorithm sees of one op on one group: its rank, the group size, and tagged
// send/recv to peers. The tag is built from (group, op sequence number, step, source) here, so
// algorithms only number their steps. The transport and the driver that waits on its requests
// are interfaces (transport.h, op_driver.h): the backend passes its ProgressEngine and the
// engine's transport, the algorithm tests an in-memory transport on threads. Torch-free and
// UCX-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "csrc/collectives/op_driver.h"
#include "csrc/collectives/op_memory.h"
#include "csrc/collectives/selection.h"
#include "csrc/collectives/staged_path.h"
#include "transports/transport.h"

namespace ucxb {

class Comm {
 public:
  // `driver` waits on the requests of `transport`; both, `tuning` and `memory` outlive the
  // Comm. `memory` says where the op's buffers live (op_memory.h); none: host memory.
  Comm(Transport& transport, OpDriver& driver, uint32_t groupHash, uint64_t seq,
       Clock::time_point deadline, const algo::Tuning& tuning, OpMemory* memory = nullptr)
      : driver_(driver), transport_(transport), group_(groupHash), seq_(seq),
        deadline_(deadline), tuning_(tuning), host_(driver),
        memory_(memory != nullptr ? *memory : host_) {}
  // An op that leaves with requests still pending (an exception between posting and waiting:
  // a device copy or wait that failed) gives them up here, before its buffers are freed.
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return transport_.rank(); }
  int size() const { return transport_.size(); }
  // The group's algorithm choices and chunk size.
  const algo::Tuning& tuning() const { return tuning_; }

  // `data` is in the op's memory; a memory the transport cannot carry goes through a host
  // buffer (copied out before the send is posted, copied in by the wait() that sees it).
  RequestPtr send(int peer, uint32_t step, const void* data, size_t bytes);
  RequestPtr recv(int peer, uint32_t step, void* data, size_t bytes);
  // A receive folded into `acc` (red's kernel, acc = acc op message) piece by piece as it
  // arrives (Transport::recvFolded), so that no bounce buffer is written and read back. Null
  // where that cannot be: memory that does not take host paths (takesHostPaths), a reduction
  // without a host kernel, or a transport that does not fold for this peer (then receive into
  // scratch and reduce()).
  RequestPtr recvFolded(int peer, uint32_t step, void* acc, size_t bytes, const Reduction& red);
  // A receive into `dst` whose pieces the transport hands over as they arrive (the same
  // Transport::recvFolded) and that stores them with non-temporal stores (streamingCopy):
  // where the transport copies every byte out of its own buffer anyway (UCX over TCP), the
  // copy then writes memory without first reading each line of a destination that is not in
  // the cache. Null where that cannot be: memory that does not take host paths
  // (takesHostPaths), or a transport that does not hand pieces over (then recv()).
  RequestPtr recvStreamed(int peer, uint32_t step, void* dst, size_t bytes);
  // Waits for all; a receive that got fewer bytes than posted is an error (ranks disagree on
  // the message size), as is one that got more (UCX reports truncation).
  void wait(const std::vector<RequestPtr>& requests);
  // What wait() does once the requests have completed, for a caller that waited for them
  // itself (an op run inline on the caller's thread): the size check, and staged receives
  // copied into the op's memory.
  void completed(const std::vector<RequestPtr>& requests);
  void abandon(const std::vector<RequestPtr>& requests);
  // Memory the op's requests point into that the op's caller frees once the op returns or
  // throws (a contiguous copy of a strided tensor, a packed buffer): this Comm holds `owner`
  // and hands it to each request that abandon() (the destructor's included) could not stop
  // (Request::keepAlive). A request given up that the transport cannot stop (UCX cannot
  // cancel a receive matched to an eager message whose last fragments are still arriving)
  // writes into it after the op has gone.
  void keep(std::shared_ptr<void> owner) { kept_.push_back(std::move(owner)); }
  // A receive of the first message `peer` would send if it took another path than this rank
  // for a message between them (transport or shared-memory slots: the length picks the
  // path, so ranks that disagree on the length take different ones, with different tags,
  // and would each wait out the timeout for a message that never comes). It never completes
  // while the ranks agree; when a message does arrive (whole or truncated), every other
  // request of this Comm still pending is cancelled and wait() throws OpFailed with
  // `why(request)` instead. Abandon it once the receive it guards has completed.
  RequestPtr tripwire(int peer, uint32_t step, void* data, size_t bytes,
                      std::function<std::string(const Request&)> why);
  // Whether `wire` (a tripwire) caught a message, whole or truncated, rather than ending
  // cancelled or still pending.
  static bool caught(const Request& wire) {
    return !wire.pending() && (!wire.failed() || wire.truncated());
  }
  // The peer of the tripwire of this Comm that caught a message, or -1.
  int trippedBy() const { return trippedBy_; }
  // Whether the tripwire that caught a message is the one for `peer`'s message at `step`:
  // an op may watch one peer with several wires that mean different things.
  bool trippedAt(int peer, uint32_t step) const {
    return trippedBy_ == peer && trippedStep_ == step;
  }
  // Clears that failure, so that the op can go on with its other peers (an algorithm whose
  // peer refused its message serves the rest before it fails), and returns it.
  std::string untrip() {
    trippedBy_ = -1;
    return std::exchange(tripped_, {});
  }
  // Small messages of host memory whatever the op's memory is (a notice that the op's
  // buffers are ready, or have been read): never staged, never labelled device memory.
  RequestPtr sendNotice(int peer, uint32_t step, const void* data, size_t bytes);
  RequestPtr recvNotice(int peer, uint32_t step, void* data, size_t bytes);
  // Exposes `bytes` of the op's memory at `data` for a peer to map (Transport::exposeMemory)
  // once the device work queued on the op's buffers has finished (OpMemory::settle): null
  // with `why` where the transport cannot. Throws TransportError where it fails.
  std::unique_ptr<ExposedMemory> expose(void* data, size_t bytes, std::string& why);
  // Maps the buffer `peer` exposed (`blob`), of which `bytes` are touched, in the op's memory
  // type (Transport::mapPeerMemory): null with `why` where the transport cannot.
  std::unique_ptr<PeerMapping> mapPeer(int peer, const std::vector<uint8_t>& blob, size_t bytes,
                                       std::string& why);
  // Local work on the op's buffers, done where they live (op_memory.h).
  void copy(void* dst, const void* src, size_t bytes) { memory_.copy(dst, src, bytes); }
  void reduce(const Reduction& red, void* acc, const void* in, size_t count) {
    memory_.reduce(red, acc, in, count);
  }
  // A reusable scratch buffer in the op's memory (at least `bytes`); one user at a time.
  uint8_t* scratch(size_t bytes) { return memory_.scratch(bytes); }
  // Whether the op's buffers are host memory (takesHostPaths): the transport then receives
  // straight into them, with no host staging to pay for a receive that may never match.
  bool onHost() const { return takesHostPaths(memory_.type()); }
  // The group's shared-memory slots for this op: null unless every rank runs on this host
  // and the op's memory takes host paths (takesHostPaths). Every staged path of the
  // algorithms finds the slots here, so device memory never reaches one.
  StagingArea* staging() const {
    return takesHostPaths(memory_.type()) ? driver_.staging() : nullptr;
  }
  // Whether a message goes through those slots, and how: asked once per exchange (see
  // staged_path.h, which also explains the layer).
  std::optional<StagedPlan> staged(StagedTraffic traffic, size_t bytes, size_t elementSize,
                                   StepBudget budget) const {
    return planStaged(staging(), traffic, bytes, elementSize, budget);
  }

 private:
  // A receive staged through a host buffer, copied into `dst` once it has arrived.
  struct Bounced {
    RequestPtr request;
    void* dst;
    const uint8_t* host;
  };

  OpDriver& driver_;
  Transport& transport_;
  const uint32_t group_;
  const uint64_t seq_;
  const Clock::time_point deadline_;
  const algo::Tuning& tuning_;
  HostMemory host_;
  OpMemory& memory_;
  std::vector<Bounced> bounced_;
  // Requests posted and not yet seen complete by wait(); pruned as they complete.
  std::vector<RequestPtr> posted_;
  // keep()'s owners, handed to the requests that abandon() could not stop.
  std::vector<std::shared_ptr<void>> kept_;
  // Set by a tripwire that caught a message of the other path: what wait() throws.
  std::string tripped_;
  int trippedBy_ = -1;
  uint32_t trippedStep_ = 0;  // of that tripwire, while trippedBy_ >= 0
  void track(const RequestPtr& request);
  // What abandon() does to each of `requests` that the driver could not stop (UCX cannot
  // cancel a receive matched to an eager message whose last fragments are still arriving):
  // it settles in a later progress(), perhaps after this Comm is gone, so it runs no callback
  // of this Comm's and holds what it may write into (keep()).
  void orphan(const std::vector<RequestPtr>& requests);
};

}  // namespace ucxb
