#include "transports/ucx/ucx_transport.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "transports/shm/shared_segment.h"
#include "transports/tag.h"
#include "transports/ucx/endpoint_close.h"
#include "transports/ucx/fold_receive.h"
#include "transports/ucx/ucx_status.h"

namespace ucxb::ucx {

class UcxTransport::UcxRequest final : public Request {
 public:
  UcxRequest(UcxTransport* owner, bool isSend, int peer, size_t bytes)
      : Request(isSend, peer, bytes), owner_(owner) {}

  void cancel() override {
    if (handle_ != nullptr && pending()) {
      ucp_request_cancel(owner_->worker(), handle_);
    }
  }

 private:
  void failNow(std::string why) { fail(std::move(why)); }

  friend class UcxTransport;
  static constexpr size_t kNotInflight = static_cast<size_t>(-1);
  UcxTransport* owner_;
  size_t inflightAt_ = kNotInflight;  // index in owner_->inflight_ while tracked
  void* handle_ = nullptr;        // UCX's request, while UCX holds it
  // Why an any-source receive was cancelled (a peer it could come from failed): what it
  // reports instead of UCX's bare "canceled" (failure()).
  std::string cancelledFor_;
  ucp_tag_recv_info_t info_{};    // filled by UCX on immediate receive completion
};

namespace {

ucs_memory_type_t toUcs(MemoryType mem) {
  return mem == MemoryType::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
}

// What localAddress() carries: the length of this host's identity (4 bytes, little-endian),
// the identity (shm::hostIdentity), a byte that is 1 when the worker reaches no other host
// (Context::oneHostOnly), then the worker's UCX address. The identity tells a peer on another
// host (or in another network namespace) from one on this host (chooseLane, reachesAll).
struct PackedAddress {
  std::string host;
  bool oneHostOnly = false;
  std::vector<uint8_t> worker;
};

std::vector<uint8_t> packAddress(const std::string& host, bool oneHostOnly, const uint8_t* worker,
                                 size_t len) {
  const auto n = static_cast<uint32_t>(host.size());
  std::vector<uint8_t> out(4 + host.size() + 1 + len);
  for (size_t i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 4, host.data(), host.size());
  out[4 + host.size()] = oneHostOnly ? 1 : 0;
  if (len > 0) std::memcpy(out.data() + 4 + host.size() + 1, worker, len);
  return out;
}

// Splits a packed address; throws on a short one.
PackedAddress unpackAddress(const std::vector<uint8_t>& blob, int peer) {
  uint32_t n = 0;
  for (int i = 0; i < 4 && i < static_cast<int>(blob.size()); ++i) n |= uint32_t{blob[i]} << (8 * i);
  if (blob.size() < 4 || blob.size() - 4 <= n) {
    throw TransportError("the address of rank " + std::to_string(peer) + " is truncated (" +
                             std::to_string(blob.size()) + " bytes)",
                         peer);
  }
  return {std::string(blob.begin() + 4, blob.begin() + 4 + n), blob[4 + n] == 1,
          std::vector<uint8_t>(blob.begin() + 4 + n + 1, blob.end())};
}

// Whether every lane of `ep` is UCX's TCP transport, i.e. the kernel moves this peer's bytes
// (RDMA and shared memory bypass it, and a second thread would only add a hop). False where
// this UCX cannot say (ucp_ep_query reports transports from UCX 1.14 on).
bool overTcpOnly(ucp_ep_h ep) {
#if UCP_API_MAJOR > 1 || (UCP_API_MAJOR == 1 && UCP_API_MINOR >= 14)
  ucp_transport_entry_t entries[16];
  ucp_ep_attr_t attr{};
  attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
  attr.transports.entries = entries;
  attr.transports.num_entries = 16;
  attr.transports.entry_size = sizeof(ucp_transport_entry_t);
  if (ucp_ep_query(ep, &attr) != UCS_OK || attr.transports.num_entries == 0) return false;
  for (unsigned i = 0; i < attr.transports.num_entries; ++i) {
    const char* name = entries[i].transport_name;
    if (name == nullptr || std::strcmp(name, "tcp") != 0) return false;
  }
  return true;
#else
  (void)ep;
  return false;
#endif
}

}  // namespace

UcxTransport::UcxTransport(int rank, int size, const std::string& netDevices,
                           SendLaneMode laneMode, Reach reach)
    : rank_(rank),
      size_(size),
      context_(Context::shared(netDevices, reach)),
      host_(shm::hostIdentity()),
      laneMode_(laneMode) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time touches this worker: the progress thread, or a caller that borrows
  // it for an inline op (ProgressEngine::lend), never both at once. That is UCX's SERIALIZED
  // contract (SINGLE promises one thread for the worker's whole life); neither takes a lock.
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h w = nullptr;
  check(ucp_worker_create(context_->handle(), &params, &w), "ucp_worker_create");
  worker_.reset(w);

  ucp_address_t* addr = nullptr;
  size_t len = 0;
  check(ucp_worker_get_address(worker(), &addr, &len), "ucp_worker_get_address");
  address_ = packAddress(host_, context_->oneHostOnly(), reinterpret_cast<const uint8_t*>(addr),
                         len);
  ucp_worker_release_address(worker(), addr);

  check(ucp_worker_get_efd(worker(), &workerFd_), "ucp_worker_get_efd");
  eventFd_ = workerFd_;

  // UCX 1.13 (Debian 12) completes a matched receive immediately without filling
  // recv_info, so its length reads as 0; 1.22 fills it. Older versions get their receives
  // completed through the callback instead (UCP_OP_ATTR_FLAG_NO_IMM_CMPL).
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  immediateRecvInfo_ = major > 1 || (major == 1 && minor >= 16);

  peers_.resize(size_);
  for (int p = 0; p < size_; ++p) {
    peers_[p] = std::make_unique<PeerSlot>(PeerSlot{this, p, nullptr, {}, {}, false, -1, -1, {}});
  }
}

UcxTransport::~UcxTransport() {
  // Only possible after a failed or aborted op: abandon what is still posted. Cancelling an
  // unmatched receive completes it (and removes it from inflight_) inside the call, so work
  // on a copy. What cancel cannot stop (sends, matched rendezvous receives) ends when its
  // endpoint is force-closed.
  closing_ = "the process group was shut down";
  // The lane first: stopping it completes every send it still holds (flushed, or cancelled
  // when the op failed), and reapLane fails those with closing_.
  if (lane_) {
    lane_->stop();
    reapLane();
    lane_.reset();
  }
  std::vector<std::shared_ptr<UcxRequest>> pending;
  for (auto& req : inflight_) pending.push_back(req);
  for (auto& req : pending) req->cancel();
  progressUntil(worker(), [this] { return inflight_.empty(); },
                std::chrono::milliseconds(200));
  // Cut off only the peers with requests cancel could not stop; the others keep the
  // graceful flush in closeEndpoints (their last eager messages may still be queued).
  std::vector<bool> abort(size_, false);
  bool anySourceLeft = false;
  for (auto& req : inflight_) {
    if (req->peer() >= 0) {
      abort[req->peer()] = true;
    } else {
      anySourceLeft = true;
    }
  }
  for (int p = 0; p < size_; ++p) {
    if (abort[p] || anySourceLeft) abortPeer(p, closing_);
  }
  pending.clear();
  for (auto& req : inflight_) pending.push_back(req);
  for (auto& req : pending) {
    // UCX no longer calls back once the request is freed: finish it ourselves so that
    // whoever waits on it (a p2p Work) learns it failed.
    if (req->handle_ != nullptr) {
      ucp_request_free(req->handle_);
      req->handle_ = nullptr;
    }
    untrack(req.get());
    if (req->pending()) req->failNow(closing_);
  }
  closeEndpoints();
  if (laneEpollFd_ >= 0) ::close(laneEpollFd_);
}

void UcxTransport::abortPeer(int peer, const std::string& why) {
  PeerSlot& slot = *peers_.at(peer);
  if (slot.error.empty()) {
    slot.error = why;
  }
  if (lane_ && slot.lane == 1) {
    lane_->abortPeer(peer);
    reapLane();
  }
  releaseKeys(slot.keys);         // unpacked on the endpoint that goes now
  forceClose(worker(), slot.ep);  // completes every request on it as cancelled
  cancelReceivesFromFailedPeers();
}

void UcxTransport::closeEndpoints() {
  std::vector<void*> closing;
  for (auto& slot : peers_) {
    releaseKeys(slot->keys);
    // A failed endpoint cannot be flushed; a healthy one is flushed so queued data still leaves.
    startClose(slot->ep, !slot->error.empty(), closing);
  }
  // A peer that already exited cannot acknowledge a flush: bound the wait.
  finishCloses(worker(), closing, std::chrono::milliseconds(500));
}

void UcxTransport::connect(int peer, const std::vector<uint8_t>& address) {
  PeerSlot& slot = *peers_.at(peer);
  if (slot.ep != nullptr) return;
  PackedAddress packed = unpackAddress(address, peer);
  slot.address = std::move(packed.worker);
  slot.otherHost = packed.host != host_;
  const bool lanePossible = laneMode_ == SendLaneMode::kOn ||
                            (laneMode_ == SendLaneMode::kAuto && slot.otherHost);
  if (!lanePossible || lane_ || peer == rank_) return;
  // The engine listens on eventFd() from its start (after every connect): from here on it is
  // an epoll set of the worker's fd and the lane's completion fd, readable when either is.
  lane_ = std::make_unique<SendLane>(context_);
  laneEpollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (laneEpollFd_ < 0) throw TransportError(std::string("epoll_create1: ") + std::strerror(errno));
  for (int fd : {workerFd_, lane_->completionFd()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(laneEpollFd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw TransportError(std::string("epoll_ctl: ") + std::strerror(errno));
    }
  }
  eventFd_ = laneEpollFd_;
}

bool UcxTransport::chooseLane(PeerSlot& slot) {
  if (!lane_ || slot.peer == rank_) return false;
  if (laneMode_ == SendLaneMode::kOn) return true;
  // kAuto: the peer is on another host and UCX reaches it over TCP alone.
  return slot.otherHost && slot.ep != nullptr && overTcpOnly(slot.ep);
}

bool UcxTransport::viaLane(PeerSlot& slot, Tag tag, size_t bytes, MemoryType mem) {
  // Point-to-point messages keep one path: c10d matches a peer's sends with one user tag in
  // the order they were sent, which two workers would not keep. Collective tags are unique.
  if (!lane_ || bytes < kSendLaneMinBytes || !takesHostPaths(mem) || tag::isP2P(tag)) {
    return false;
  }
  if (slot.lane < 0) slot.lane = chooseLane(slot) ? 1 : 0;
  return slot.lane == 1;
}

bool UcxTransport::reapLane() {
  if (!lane_) return false;
  auto done = lane_->takeCompleted();
  for (auto& c : done) {
    auto owned = untrack(static_cast<UcxRequest*>(const_cast<void*>(c.token)));
    if (!owned) continue;
    if (c.status == UCS_OK) {
      owned->complete(owned->postedBytes(), 0);
    } else if (!c.error.empty() && peers_[owned->peer()]->error.empty()) {
      owned->fail(c.error);
    } else {
      owned->fail(failure(*owned, c.status));
    }
  }
  return !done.empty();
}

bool UcxTransport::reachesAll(const std::vector<std::vector<uint8_t>>& addresses) const {
  // From the addresses alone, so that every rank answers alike: a rank whose worker reaches
  // every host still takes part when another rank's does not.
  bool anyOneHostOnly = false;
  bool oneHost = true;
  std::string first;
  for (size_t p = 0; p < addresses.size(); ++p) {
    PackedAddress packed;
    try {
      packed = unpackAddress(addresses[p], static_cast<int>(p));
    } catch (const TransportError&) {
      // Another transport's address (a rank whose shm transport could be made, where this
      // one's could not: transport_factory.cpp): every rank builds ucx for any host.
      return false;
    }
    anyOneHostOnly = anyOneHostOnly || packed.oneHostOnly;
    if (p == 0) first = packed.host;
    oneHost = oneHost && packed.host == first;
  }
  return oneHost || !anyOneHostOnly;
}

std::vector<std::string> UcxTransport::lowerTransports() const {
  return context_->transports();
}

Counters UcxTransport::transportCounters() const {
  if (!lane_) return {};
  uint64_t peers = 0;
  for (const auto& slot : peers_) peers += slot->lane == 1 ? 1 : 0;
  return {{"send_lane_peers", peers},
          {"send_lane_messages", laneMessages_},
          {"send_lane_bytes", laneBytes_}};
}

std::unique_ptr<ExposedMemory> UcxTransport::exposeMemory(void* data, size_t bytes,
                                                          MemoryType memory, std::string& why) {
  // cuda_ipc reaches only processes of this node. A group that spans hosts answers before
  // registering anything: ucp_mem_map would register the buffer with every device-memory
  // domain, an RDMA NIC's among them (milliseconds for a large buffer), at every op, only for
  // the peer to fail to map it. Every rank of such a group has a peer on another host, so all
  // answer alike.
  for (const auto& slot : peers_) {
    if (slot->otherHost) {
      why = "rank " + std::to_string(slot->peer) +
            " is on another host (cuda_ipc maps only memory of this node)";
      return nullptr;
    }
  }
  return exposeDeviceMemory(context_->handle(), context_->transports(), data, bytes, memory, why);
}

std::unique_ptr<PeerMapping> UcxTransport::mapPeerMemory(int peer,
                                                         const std::vector<uint8_t>& blob,
                                                         size_t bytes, MemoryType memory,
                                                         std::string& why) {
  PeerSlot& slot = *peers_.at(peer);
  ucp_ep_h ep = endpoint(slot, /*forSend=*/true);
  if (ep == nullptr) throw TransportError(slot.error, peer);
  return mapDeviceMemory(ep, peer, blob, bytes, memory, slot.keys, why);
}

ucp_ep_h UcxTransport::endpoint(PeerSlot& slot, bool forSend) {
  if (slot.ep != nullptr || !slot.error.empty()) return slot.ep;
  if (slot.address.empty()) {
    if (forSend) slot.error = "rank " + std::to_string(slot.peer) + " is not connected";
    return nullptr;
  }
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(slot.address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxTransport::onPeerError;
  params.err_handler.arg = &slot;
  const ucs_status_t status = ucp_ep_create(worker(), &params, &slot.ep);
  if (status != UCS_OK) {
    // Most often the peer's worker is gone (its shared memory removed): a receive from it
    // fails too, naming this, unless what the peer sent before it left is here already
    // (recv()); otherwise it would wait for the op's timeout with no word of the peer.
    slot.ep = nullptr;
    slot.error = describe(status, "ucp_ep_create to rank " + std::to_string(slot.peer));
  }
  return slot.ep;
}

void UcxTransport::onPeerError(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* slot = static_cast<PeerSlot*>(arg);
  slot->error = describe(status, "connection to rank " + std::to_string(slot->peer) + " failed");
  slot->owner->peerFailed_ = true;
}

// UCX fails the sends queued on a failed endpoint by itself, but a tag receive belongs to the
// worker, not to an endpoint: cancel the ones directed at a failed peer so they do not wait
// for the group timeout, and the any-source ones too (cancelAnySource). (Deferred from the
// error callback to keep UCX's call stack simple.)
void UcxTransport::cancelReceivesFromFailedPeers() {
  peerFailed_ = false;
  std::vector<std::shared_ptr<UcxRequest>> victims;
  bool anySource = false;
  for (auto& req : inflight_) {
    if (req->isSend()) continue;
    if (req->peer() == kAnySource) {
      anySource = true;
    } else if (!peers_[req->peer()]->error.empty()) {
      victims.push_back(req);
    }
  }
  for (auto& req : victims) {
    req->cancel();
  }
  if (anySource) cancelAnySource();
}

const UcxTransport::PeerSlot* UcxTransport::firstFailedPeer() const {
  for (const auto& slot : peers_) {
    if (slot->peer != rank_ && !slot->error.empty()) return slot.get();
  }
  return nullptr;
}

void UcxTransport::cancelAnySource() {
  const PeerSlot* dead = firstFailedPeer();
  if (dead == nullptr) return;
  // A message a live peer sent before this may still sit in a lower transport's queue (a
  // shared-memory FIFO, a socket): progress takes it in, and it matches the posted receive,
  // which UCX then completes as usual (cancel leaves a matched receive alone). No probe of
  // UCX's unexpected queue is needed: a message that matches a posted receive never waits
  // there, UCX hands it to the receive on arrival (and at posting, from the queue).
  auto pending = [this] {
    for (const auto& req : inflight_) {
      if (!req->isSend() && req->peer() == kAnySource && req->handle_ != nullptr) return true;
    }
    return false;
  };
  for (int i = 0; i < kFailedPeerProgressRounds && pending(); ++i) ucp_worker_progress(worker());
  std::vector<std::shared_ptr<UcxRequest>> victims;
  for (auto& req : inflight_) {
    if (!req->isSend() && req->peer() == kAnySource) victims.push_back(req);
  }
  // The message this receive waits for may be the dead peer's, which will never come; waiting
  // on the others would only end at the group's timeout, for an op the group then fails
  // anyway (as a receive from the dead peer itself fails now). As udp does
  // (Endpoint::matchAnySource), it fails naming the peer.
  for (auto& req : victims) {
    req->cancelledFor_ = "receive from any rank failed: " + dead->error;
    req->cancel();
  }
}

int UcxTransport::probe(Tag tag, Tag mask) {
  // Looks at the unexpected queue only (remove=0): nothing is posted, matched or progressed.
  ucp_tag_recv_info_t info{};
  if (ucp_tag_probe_nb(worker(), tag, mask, 0, &info) == nullptr) return -1;
  return static_cast<int>(tag::source(info.sender_tag));
}

std::string UcxTransport::peerError(int peer) const {
  if (peer < 0 || peer >= size_) {
    return {};
  }
  return peers_[peer]->error;
}

std::shared_ptr<UcxTransport::UcxRequest> UcxTransport::track(bool isSend, int peer,
                                                              size_t bytes) {
  auto req = std::make_shared<UcxRequest>(this, isSend, peer, bytes);
  req->inflightAt_ = inflight_.size();
  inflight_.push_back(req);
  return req;
}

std::shared_ptr<UcxTransport::UcxRequest> UcxTransport::untrack(UcxRequest* req) {
  const size_t at = req->inflightAt_;
  if (at >= inflight_.size() || inflight_[at].get() != req) {
    return nullptr;  // not tracked (kNotInflight), or settled already
  }
  auto owned = std::move(inflight_[at]);
  if (at + 1 != inflight_.size()) {
    inflight_[at] = std::move(inflight_.back());
    inflight_[at]->inflightAt_ = at;
  }
  inflight_.pop_back();
  req->inflightAt_ = UcxRequest::kNotInflight;
  return owned;
}

// Records what ucp_*_nbx returned: a handle (completion comes later through a callback), an
// immediate completion, or an immediate error.
void UcxTransport::settle(const std::shared_ptr<UcxRequest>& req, ucs_status_ptr_t result) {
  if (UCS_PTR_IS_PTR(result)) {
    if (req->pending()) {
      req->handle_ = result;
    }
    return;
  }
  untrack(req.get());
  const ucs_status_t status = UCS_PTR_STATUS(result);
  if (status == UCS_OK) {
    if (req->isSend()) {
      req->complete(req->postedBytes(), 0);
    } else {
      req->complete(req->info_.length, req->info_.sender_tag);
    }
  } else {
    failRequest(*req, status);
  }
}

RequestPtr UcxTransport::send(int peer, Tag tag, const void* data, size_t bytes,
                              MemoryType mem) {
  auto req = track(true, peer, bytes);
  PeerSlot& slot = *peers_.at(peer);
  if (endpoint(slot, true) == nullptr || !slot.error.empty()) {
    untrack(req.get());
    req->fail(slot.error);
    return req;
  }
  if (viaLane(slot, tag, bytes, mem)) {
    ++laneMessages_;
    laneBytes_ += bytes;
    lane_->post(peer, slot.address, tag, data, bytes, req.get());
    return req;
  }
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  param.cb.send = &UcxTransport::onSendDone;
  param.user_data = req.get();
  param.memory_type = toUcs(mem);
  settle(req, ucp_tag_send_nbx(slot.ep, data, bytes, tag, &param));
  return req;
}

RequestPtr UcxTransport::recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                              MemoryType mem) {
  return postRecv(peer, tag, mask, data, bytes, toUcs(mem), nullptr);
}

RequestPtr UcxTransport::recvFolded(int peer, Tag tag, Tag mask, void* dst, size_t bytes,
                                    size_t elementSize, Fold fold) {
  if (peer < 0) return nullptr;
  PeerSlot& slot = *peers_.at(peer);
  if (slot.folds < 0) {
    ucp_ep_h ep = endpoint(slot, false);
    if (ep == nullptr) return nullptr;  // recv() reports the peer's error
    slot.folds = overTcpOnly(ep) ? 1 : 0;
  }
  if (slot.folds == 0) return nullptr;
  auto target = std::make_shared<FoldTarget>(dst, bytes, elementSize, std::move(fold));
  return postRecv(peer, tag, mask, target.get(), bytes, UCS_MEMORY_TYPE_HOST, target);
}

RequestPtr UcxTransport::postRecv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                                  ucs_memory_type_t mem,
                                  const std::shared_ptr<FoldTarget>& fold) {
  // The endpoint is not needed to receive, but its keepalive tells a dead peer from a slow
  // one, and one that cannot be created says the peer is gone: the peer's error, below. An
  // any-source receive may come from every other rank, so it watches them all.
  if (peer >= 0) {
    PeerSlot& slot = *peers_.at(peer);
    // A failure notice already here needs no watching: it is one small eager message that
    // the receive takes at once, and an endpoint made for it would only cost a connection, or
    // a UCX error where the peer has left (a notice taken as the group ends:
    // csrc/engine/failure_notice.h). Any other message may be a rendezvous whose data still
    // needs the sender, so its receive watches the peer. Asked only until the endpoint exists.
    const bool noticeHere = tag::isNotice(tag) && probe(tag, mask) >= 0;
    if (slot.ep != nullptr || !slot.error.empty() || !noticeHere) endpoint(slot, false);
  } else if (!everyPeerWatched_) {  // once: an endpoint, once made, stays (or fails)
    for (auto& slot : peers_) {
      if (slot->peer != rank_) endpoint(*slot, false);
    }
    everyPeerWatched_ = true;
  }
  auto req = track(false, peer, bytes);
  ucp_request_param_t param{};
  // An any-source receive completes through the callback: UCX's record of the message there
  // names the sender also when the message was too long (an immediate failure's does not).
  const bool immediate = immediateRecvInfo_ && peer != kAnySource;
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_MEMORY_TYPE |
                       (immediate ? UCP_OP_ATTR_FIELD_RECV_INFO : UCP_OP_ATTR_FLAG_NO_IMM_CMPL);
  param.cb.recv = &UcxTransport::onRecvDone;
  param.user_data = req.get();
  param.memory_type = mem;
  param.recv_info.tag_info = &req->info_;
  size_t count = bytes;
  if (fold) {
    // One FoldTarget "element" of the generic datatype: UCX asks it for the size in bytes.
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = foldDatatype();
    count = 1;
    req->keepAlive(fold);  // UCX unpacks into it until the request completes
  }
  settle(req, ucp_tag_recv_nbx(worker(), data, count, tag, mask, &param));
  // A peer whose connection is gone (most often: it finished and destroyed the group) may
  // have sent this message before it left; UCX then matches it from the unexpected queue.
  // Only a receive that nothing matches fails, with the peer's error.
  if (peer >= 0 && !peers_.at(peer)->error.empty() && req->pending()) {
    for (int i = 0; i < kFailedPeerProgressRounds && req->pending(); ++i) {
      ucp_worker_progress(worker());
    }
    if (req->pending()) req->cancel();
  }
  // An any-source receive likewise once any rank it could come from is known failed.
  if (peer == kAnySource && req->pending()) cancelAnySource();
  return req;
}

std::string UcxTransport::failure(const UcxRequest& req, ucs_status_t status, int sender) const {
  // A request cancelled because its peer failed or was aborted reports the peer's error; an
  // any-source receive, the error of the failed peer it could have come from.
  if (status == UCS_ERR_CANCELED && req.peer() >= 0 && !peers_[req.peer()]->error.empty()) {
    return peers_[req.peer()]->error;
  }
  if (status == UCS_ERR_CANCELED && !req.cancelledFor_.empty()) return req.cancelledFor_;
  if (status == UCS_ERR_CANCELED && !closing_.empty()) {
    return closing_;
  }
  if (status == UCS_ERR_MESSAGE_TRUNCATED && !req.isSend()) {
    // The peer sent more than this rank expects: the ranks passed tensors (or split sizes)
    // that disagree. Said as udp says it, not as UCX's bare "Message truncated".
    return describe(status, "the message from " +
                                peerLabel(sender != kAnySource ? sender : req.peer()) +
                                " is longer than the " +
                                std::to_string(req.postedBytes()) +
                                " bytes posted to receive it");
  }
  return describe(status, std::string(req.isSend() ? "send to " : "receive from ") +
                              peerLabel(req.peer()) + " (" + std::to_string(req.postedBytes()) +
                              " bytes)");
}

void UcxTransport::failRequest(UcxRequest& req, ucs_status_t status,
                               const ucp_tag_recv_info_t* info) const {
  if (status == UCS_ERR_MESSAGE_TRUNCATED && !req.isSend()) {
    // UCX fills in the sender's tag when it matches the message, before it finds the buffer
    // too short: it names the sender of a message to an any-source receive.
    const bool known = info != nullptr && tag::isP2P(info->sender_tag);
    req.failTruncated(failure(req, status,
                              known ? static_cast<int>(tag::source(info->sender_tag))
                                    : kAnySource));
  } else {
    req.fail(failure(req, status));
  }
}

void UcxTransport::onSendDone(void* handle, ucs_status_t status, void* user) {
  auto* req = static_cast<UcxRequest*>(user);
  auto owned = req->owner_->untrack(req);
  ucp_request_free(handle);
  req->handle_ = nullptr;
  if (status == UCS_OK) {
    req->complete(req->postedBytes(), 0);
  } else {
    req->fail(req->owner_->failure(*req, status));
  }
}

void UcxTransport::onRecvDone(void* handle, ucs_status_t status, const ucp_tag_recv_info_t* info,
                              void* user) {
  auto* req = static_cast<UcxRequest*>(user);
  auto owned = req->owner_->untrack(req);
  ucp_request_free(handle);
  req->handle_ = nullptr;
  if (status == UCS_OK) {
    req->complete(info->length, info->sender_tag);
  } else {
    req->owner_->failRequest(*req, status, info);
  }
}

bool UcxTransport::progress() {
  bool any = ucp_worker_progress(worker()) != 0;
  any = reapLane() || any;
  if (peerFailed_) {
    cancelReceivesFromFailedPeers();
    return true;
  }
  return any;
}

bool UcxTransport::arm() {
  const ucs_status_t status = ucp_worker_arm(worker());
  if (status == UCS_ERR_BUSY) {
    return false;
  }
  check(status, "ucp_worker_arm");
  return !(lane_ && lane_->hasCompleted());
}

}  // namespace ucxb::ucx
