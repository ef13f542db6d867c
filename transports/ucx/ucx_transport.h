// Transport over UCP tag matching: one worker per group, one endpoint per peer, peer error
// handling on every endpoint so that a dead peer fails its requests instead of hanging them.
//
// Endpoints are created on first use: connect() only records the peer's address, and the
// first send to or receive from a peer creates its endpoint. A group's creation then costs no
// all-to-all wire-up (a ring op talks to two peers, a recursive-doubling one to log2(n)), and
// no barrier is needed after it: a rank only connects to a peer it exchanges a message with,
// which cannot have left before that message. A receive creates the endpoint too, so that
// UCX's keepalive watches every peer this rank waits for.
//
// Large collective sends to a peer on another host that UCX reaches over TCP go through a
// send lane (send_lane.h): a second worker with its own thread, so that this rank sends and
// receives at once. The choice is made per peer at its first such send (chooseLane), from
// the peer's host (carried in its address) and the transports of its endpoint; the mode
// (the send_lane option) forces it on or off.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "transports/fold_target.h"
#include "transports/transport.h"
#include "transports/ucx/peer_map.h"
#include "transports/ucx/send_lane.h"
#include "transports/ucx/ucx_context.h"

namespace ucxb::ucx {

// Progress rounds a receive gets, once its peer (any peer, for an any-source one) is known
// failed, to take in a message that peer or a live one sent before: a message already in a
// lower transport's queue is matched within them.
constexpr int kFailedPeerProgressRounds = 16;

class UcxTransport final : public Transport {
 public:
  // netDevices: UCX_NET_DEVICES for this group's context ("" keeps UCX's choice). reach:
  // kOneHost guesses that every rank runs on this host and leaves the transports only another
  // host needs out of the worker (Context::oneHostOnly); reachesAll() checks the guess.
  UcxTransport(int rank, int size, const std::string& netDevices = "",
               SendLaneMode laneMode = SendLaneMode::kAuto, Reach reach = Reach::kAnyHost);
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  std::string name() const override { return "ucx"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<uint8_t> localAddress() const override { return address_; }
  void connect(int peer, const std::vector<uint8_t>& address) override;

  RequestPtr send(int peer, Tag tag, const void* data, size_t bytes, MemoryType mem) override;
  RequestPtr recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                  MemoryType mem) override;
  // Folds in UCX's unpack (fold_receive.h), from peers UCX reaches over TCP alone: there it
  // copies every byte out of its segments anyway. Other peers (shared memory, where UCX may
  // move a large message in one copy into a contiguous buffer; RDMA) get null.
  RequestPtr recvFolded(int peer, Tag tag, Tag mask, void* dst, size_t bytes, size_t elementSize,
                        Fold fold) override;

  bool progress() override;
  bool arm() override;
  int eventFd() const override { return eventFd_; }
  int probe(Tag tag, Tag mask) override;
  std::string peerError(int peer) const override;
  void abortPeer(int peer, const std::string& why) override;
  // Unless UCX_TLS leaves out UCX's own shared-memory transports.
  bool permitsSharedMemory() const override { return context_->sharedMemory(); }
  // UCX moves device memory itself when told its type: cuda_copy, cuda_ipc between processes
  // of one node, GPUDirect RDMA over rc/dc where the NIC and driver allow.
  bool carriesDeviceMemory() const override { return true; }
  // False when some rank's worker was made for one host (its address says so) and the
  // addresses name more than one host.
  bool reachesAll(const std::vector<std::vector<uint8_t>>& addresses) const override;
  // The transports of this group's UCP context, e.g. {"self", "sysv", "posix", "cma"}.
  std::vector<std::string> lowerTransports() const override;
  int threadsOfItsOwn() const override { return lane_ ? 1 : 0; }
  // Only where a send lane may be used (send_lane "on", or "auto" with a peer on another
  // host): send_lane_peers (peers whose large sends take the lane), send_lane_messages and
  // send_lane_bytes. Empty otherwise, so that a group on one host keeps no statistics.
  Counters transportCounters() const override;
  // CUDA buffers of ranks on this node, through UCX's cuda_ipc (peer_map.h); anything else
  // answers unsupported.
  std::unique_ptr<ExposedMemory> exposeMemory(void* data, size_t bytes, MemoryType memory,
                                              std::string& why) override;
  std::unique_ptr<PeerMapping> mapPeerMemory(int peer, const std::vector<uint8_t>& blob,
                                             size_t bytes, MemoryType memory,
                                             std::string& why) override;

 private:
  class UcxRequest;
  struct PeerSlot {
    UcxTransport* owner;
    int peer;
    ucp_ep_h ep = nullptr;
    std::string error;
    std::vector<uint8_t> address;  // from connect(); the endpoint is made from it on first use
    bool otherHost = false;        // the peer's host identity differs from this rank's
    int lane = -1;                 // large sends take the send lane: -1 undecided, 0 no, 1 yes
    int folds = -1;                // receives may fold (TCP only): -1 undecided, 0 no, 1 yes
    // Keys unpacked on `ep` for mappings of the peer's memory (mapPeerMemory), released
    // before `ep` is closed.
    std::vector<std::weak_ptr<RemoteKey>> keys;
  };
  struct WorkerDeleter {
    void operator()(ucp_worker* w) const { ucp_worker_destroy(w); }
  };

  static void onSendDone(void* handle, ucs_status_t status, void* user);
  static void onRecvDone(void* handle, ucs_status_t status, const ucp_tag_recv_info_t* info,
                         void* user);
  static void onPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);

  ucp_worker_h worker() const { return worker_.get(); }
  // recv() and recvFolded(): `data` is the FoldTarget where `fold` is set (kept alive by the
  // request).
  RequestPtr postRecv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                      ucs_memory_type_t mem, const std::shared_ptr<FoldTarget>& fold);
  // The peer's endpoint, created now if this is its first use; null when it cannot be
  // created (slot.error set) or the peer was never connected (slot.error set for a send).
  ucp_ep_h endpoint(PeerSlot& slot, bool forSend);
  std::shared_ptr<UcxRequest> track(bool isSend, int peer, size_t bytes);
  void settle(const std::shared_ptr<UcxRequest>& req, ucs_status_ptr_t result);
  std::shared_ptr<UcxRequest> untrack(UcxRequest* req);
  // `sender`: the rank a too long message came from, where UCX said (kAnySource: not known).
  std::string failure(const UcxRequest& req, ucs_status_t status, int sender = kAnySource) const;
  // Fails `req` with `status`: a receive of a longer message only as truncated (UCX took the
  // whole message off the wire; Request::truncated), anything else as failed. `info`: UCX's
  // record of the message, where it gave one.
  void failRequest(UcxRequest& req, ucs_status_t status,
                   const ucp_tag_recv_info_t* info = nullptr) const;
  void closeEndpoints();
  void cancelReceivesFromFailedPeers();
  // Fails every pending any-source receive, naming the failed peer, once some other rank has
  // failed (firstFailedPeer), unless a message already here matches it.
  void cancelAnySource();
  const PeerSlot* firstFailedPeer() const;
  // Whether this send goes through the send lane (decides the peer's choice on first use).
  bool viaLane(PeerSlot& slot, Tag tag, size_t bytes, MemoryType mem);
  bool chooseLane(PeerSlot& slot);
  // Completes the requests whose lane sends finished; true if there were any.
  bool reapLane();

  const int rank_;
  const int size_;
  std::shared_ptr<Context> context_;  // outlives the worker (declared first, destroyed last)
  const std::string host_;            // shm::hostIdentity(), which localAddress() carries
  std::unique_ptr<ucp_worker, WorkerDeleter> worker_;
  std::vector<uint8_t> address_;
  int eventFd_ = -1;
  std::vector<std::unique_ptr<PeerSlot>> peers_;
  bool peerFailed_ = false;  // set in UCX's error callback, handled in progress()
  // An any-source receive has made an endpoint to every peer (postRecv): later ones need not.
  bool everyPeerWatched_ = false;
  // Set while the transport is being destroyed: what cancelled requests report.
  std::string closing_;
  // Whether this UCX reports the length of an immediately completed tagged receive.
  bool immediateRecvInfo_ = false;
  // Requests UCX still holds, in no order; each knows its place (UcxRequest::inflightAt_),
  // so the callback that gets our pointer back removes it at once, and a small op allocates
  // no map node per request (a 2-rank 8-byte all_reduce posts two).
  std::vector<std::shared_ptr<UcxRequest>> inflight_;
  const SendLaneMode laneMode_;
  // Created by connect() once a lane may be used; its completion fd then joins the worker's
  // in eventFd_, an epoll set of both (laneEpollFd_).
  std::unique_ptr<SendLane> lane_;
  int workerFd_ = -1;
  int laneEpollFd_ = -1;
  uint64_t laneMessages_ = 0;
  uint64_t laneBytes_ = 0;
};

}  // namespace ucxb::ucx
