// Transport over UCP tag matching: one worker per group, one endpoint per peer, peer error
// handling on every endpoint so that a dead peer fails its requests instead of hanging them.
//
// Endpoints are created on first use: connect() only records the peer's address, and the
// first send to or receive from a peer creates its endpoint. A group's creation then costs no
// all-to-all wire-up (a ring op talks to two peers, a recursive-doubling one to log2(n)), and
// no barrier is needed after it: a rank only connects to a peer it exchanges a message with,
// which cannot have left before that message. A receive creates the endpoint too, so that
// UCX's keepalive watches every peer this rank waits for.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transports/transport.h"
#include "transports/ucx/ucx_context.h"

namespace ucxb::ucx {

class UcxTransport final : public Transport {
 public:
  // netDevices: UCX_NET_DEVICES for this group's context ("" keeps UCX's choice).
  UcxTransport(int rank, int size, const std::string& netDevices = "");
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

  bool progress() override;
  bool arm() override;
  int eventFd() const override { return eventFd_; }
  std::string peerError(int peer) const override;
  void abortPeer(int peer, const std::string& why) override;
  // Unless UCX_TLS leaves out UCX's own shared-memory transports.
  bool permitsSharedMemory() const override { return context_->sharedMemory(); }
  // UCX moves device memory itself when told its type: cuda_copy, cuda_ipc between processes
  // of one node, GPUDirect RDMA over rc/dc where the NIC and driver allow.
  bool carriesDeviceMemory() const override { return true; }

 private:
  class UcxRequest;
  struct PeerSlot {
    UcxTransport* owner;
    int peer;
    ucp_ep_h ep = nullptr;
    std::string error;
    std::vector<uint8_t> address;  // from connect(); the endpoint is made from it on first use
  };
  struct WorkerDeleter {
    void operator()(ucp_worker* w) const { ucp_worker_destroy(w); }
  };

  static void onSendDone(void* handle, ucs_status_t status, void* user);
  static void onRecvDone(void* handle, ucs_status_t status, const ucp_tag_recv_info_t* info,
                         void* user);
  static void onPeerError(void* arg, ucp_ep_h ep, ucs_status_t status);

  ucp_worker_h worker() const { return worker_.get(); }
  // The peer's endpoint, created now if this is its first use; null when it cannot be
  // created (slot.error set) or the peer was never connected (slot.error set for a send).
  ucp_ep_h endpoint(PeerSlot& slot, bool forSend);
  std::shared_ptr<UcxRequest> track(bool isSend, int peer, size_t bytes);
  void settle(const std::shared_ptr<UcxRequest>& req, ucs_status_ptr_t result);
  std::shared_ptr<UcxRequest> untrack(UcxRequest* req);
  std::string failure(const UcxRequest& req, ucs_status_t status) const;
  void closeEndpoints();
  // Progresses until `done()` or the deadline passes.
  template <typename Pred>
  void progressUntil(Pred done, std::chrono::milliseconds limit);
  void cancelReceivesFromFailedPeers();

  const int rank_;
  const int size_;
  std::shared_ptr<Context> context_;  // outlives the worker (declared first, destroyed last)
  std::unique_ptr<ucp_worker, WorkerDeleter> worker_;
  std::vector<uint8_t> address_;
  int eventFd_ = -1;
  std::vector<std::unique_ptr<PeerSlot>> peers_;
  bool peerFailed_ = false;  // set in UCX's error callback, handled in progress()
  // Set while the transport is being destroyed: what cancelled requests report.
  std::string closing_;
  // Whether this UCX reports the length of an immediately completed tagged receive.
  bool immediateRecvInfo_ = false;
  // Requests UCX still holds, keyed by the pointer UCX hands back to our callbacks.
  std::unordered_map<const UcxRequest*, std::shared_ptr<UcxRequest>> inflight_;
};

}  // namespace ucxb::ucx
