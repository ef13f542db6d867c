#include "transports/udp/udp_transport.h"

#include <sys/epoll.h>
#include <sys/timerfd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "transports/udp/wire_format.h"

namespace ucxb::udp {
namespace {

// The address blob starts with this, so that a rank handed another transport's address (the
// ranks disagree on the backend) fails with a clear message instead of a garbled address.
constexpr uint8_t kAddressMagic[4] = {'U', 'D', 'P', 1};

constexpr size_t kReceiveBatch = 32;      // datagrams per recvmmsg
constexpr size_t kReceiveBatchesPerProgress = 8;
constexpr size_t kSendBatch = 64;         // datagrams per sendmmsg
constexpr size_t kSendPerProgress = 512;  // then progress() returns to receive ACKs
constexpr size_t kPeerBurst = 64;         // datagrams per peer per turn (one train's worth)

[[noreturn]] void throwErrno(const std::string& what) {
  throw TransportError("udp: " + what + " failed: " + std::strerror(errno));
}

std::string peerLabel(int peer) {
  return peer == kAnySource ? std::string("any rank") : "rank " + std::to_string(peer);
}

}  // namespace

class UdpTransport::UdpRequest final : public Request {
 public:
  UdpRequest(UdpTransport* owner, bool isSend, int peer, size_t bytes)
      : Request(isSend, peer, bytes), owner_(owner) {}

  void cancel() override {
    if (owner_ != nullptr && pending()) owner_->cancelRequest(*this);
  }

 private:
  friend class UdpTransport;
  void completeNow(size_t bytes, Tag tag) { complete(bytes, tag); }
  void failNow(std::string why) { fail(std::move(why)); }

  UdpTransport* owner_;
  // Receives: what was posted, kept for any-source matching and for cancellation.
  Tag tag_ = 0;
  Tag mask_ = 0;
  void* buffer_ = nullptr;
  int boundPeer_ = -1;     // the connection holding it (-1: an any-source receive not yet bound)
  uint64_t coreId_ = 0;    // its MessageId or ReceiveId there
  bool cancelling_ = false;
};

TimeUs UdpTransport::nowUs() {
  return static_cast<TimeUs>(std::chrono::duration_cast<std::chrono::microseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count());
}

UdpTransport::UdpTransport(int rank, int size, UdpTransportOptions options)
    : rank_(rank),
      size_(size),
      options_(std::move(options)),
      socket_(SocketAddress::parse(options_.bindHost, 0), options_.socketBufferBytes),
      peers_(static_cast<size_t>(size)) {
  validate(options_.config);
  epollFd_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  if (epollFd_.get() < 0) throwErrno("epoll_create1()");
  timerFd_ = UniqueFd(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (timerFd_.get() < 0) throwErrno("timerfd_create()");
  for (int fd : {socket_.fd(), timerFd_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epollFd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) throwErrno("epoll_ctl(ADD)");
  }
  for (int p = 0; p < size_; ++p) {
    PeerIdentity id;
    id.localRank = static_cast<uint16_t>(rank_);
    id.peerRank = static_cast<uint16_t>(p);
    id.sessionToken = options_.sessionToken;
    peers_[static_cast<size_t>(p)].connection = std::make_unique<PeerConnection>(options_.config, id);
  }
  if (options_.faults.any()) {
    FaultConfig perRank = options_.faults;
    // Same seed on every rank would drop the same datagram numbers in both directions.
    perRank.seed = options_.faults.seed * 1000003u + static_cast<uint64_t>(rank_);
    faults_ = std::make_unique<FaultInjector>(perRank);
  }
  receiveArena_.resize(kReceiveBatch * kMaxDatagramBytes);
  receiveBatch_.resize(kReceiveBatch);
  for (size_t i = 0; i < kReceiveBatch; ++i) {
    receiveBatch_[i].data = receiveArena_.data() + i * kMaxDatagramBytes;
    receiveBatch_[i].capacity = kMaxDatagramBytes;
  }
  const size_t mtu = options_.config.mtuPayload;
  sendArena_.resize(kSendBatch * mtu);
  outgoing_.resize(kSendBatch);
  for (size_t i = 0; i < kSendBatch; ++i) outgoing_[i].data = sendArena_.data() + i * mtu;
}

UdpTransport::~UdpTransport() {
  const std::string closing = "the udp transport was closed with the request pending";
  try {
    // Connections with requests still pending are cut off first: their buffers are about to
    // go away, and a failed connection never touches a buffer again.
    for (int p = 0; p < size_; ++p) {
      Peer& peer = peers_[static_cast<size_t>(p)];
      if (!peer.sends.empty() || !peer.receives.empty()) failPeer(p, closing);
    }
    bool ignored = false;
    handleEvents(ignored);
    linger();
  } catch (...) {
    // A destructor must not throw; what is left is failed below.
  }
  for (auto& peer : peers_) {
    for (auto& [id, r] : peer.sends) r->failNow(closing);
    for (auto& [id, r] : peer.receives) r->failNow(closing);
    peer.sends.clear();
    peer.receives.clear();
  }
  for (auto& r : anySource_) r->failNow(closing);
  for (auto& r : cancelled_) r->failNow("cancelled");
}

void UdpTransport::linger() {
  // How long to stay after the last datagram: a short while normally; but once a peer has
  // retransmitted something we already had (our ACK was lost), or something go-back-N made us
  // discard, its timer may back off up to rto_max, so stay until it has been quiet that long.
  // `heard`: what a peer still waiting on us sends, anything but ACKs (two lingering peers
  // repeat their ACKs to each other, and that alone must not keep either of them here).
  struct Received {
    uint64_t heard = 0, duplicates = 0;
  };
  const auto received = [this] {
    Received r;
    for (const auto& peer : peers_) {
      const Stats s = peer.connection->stats();
      r.heard += s.datagramsReceived - s.ackPacketsReceived;
      r.duplicates += s.duplicatePackets + s.duplicateFragments + s.dropped(DropReason::kAfterGap);
    }
    return r;
  };
  // Our last ACK to a peer may have been lost, and its timer may have backed off: repeat
  // the ACK every few ms while we stay (cheap, and at 30% loss the chance that every copy is
  // lost is nil), rather than count on answering its retransmission.
  constexpr DurationUs kAckRepeatUs = 5000;
  const TimeUs start = nowUs();
  TimeUs lastHeard = start;
  TimeUs lastAckRepeat = 0;
  DurationUs quiet = options_.lingerQuietUs;
  Received seen = received();
  for (;;) {
    if (nowUs() - lastAckRepeat >= kAckRepeatUs) {
      for (auto& peer : peers_) {
        if (peer.connected && !peer.connection->failed()) peer.connection->acknowledgeAgain();
      }
      lastAckRepeat = nowUs();
    }
    progress();
    const TimeUs now = nowUs();
    const Received r = received();
    if (r.heard != seen.heard) lastHeard = now;
    if (r.duplicates != seen.duplicates) quiet = std::max(quiet, options_.config.rtoMaxUs);
    seen = r;
    bool idle = true;
    for (const auto& peer : peers_) {
      if (peer.connected && !peer.connection->failed() && !peer.connection->idle()) idle = false;
    }
    if (now - start >= options_.lingerMaxUs) return;
    if (idle && now - lastHeard >= quiet) return;
    if (arm()) {
      epoll_event ev;
      const TimeUs wait = std::min<TimeUs>(idle ? quiet - (now - lastHeard) : 1000, kAckRepeatUs);
      ::epoll_wait(epollFd_.get(), &ev, 1, static_cast<int>(std::max<TimeUs>(1, wait / 1000)));
    }
  }
}

std::vector<uint8_t> UdpTransport::localAddress() const {
  std::vector<uint8_t> blob(std::begin(kAddressMagic), std::end(kAddressMagic));
  socket_.localAddress().appendTo(blob);
  return blob;
}

void UdpTransport::connect(int peer, const std::vector<uint8_t>& address) {
  if (peer < 0 || peer >= size_) {
    throw TransportError("udp: connect to rank " + std::to_string(peer) + " outside the group of " +
                             std::to_string(size_),
                         peer);
  }
  if (address.size() < sizeof(kAddressMagic) ||
      !std::equal(std::begin(kAddressMagic), std::end(kAddressMagic), address.begin())) {
    throw TransportError("udp: rank " + std::to_string(peer) +
                             " published an address that is not a udp transport's (do all "
                             "ranks use the same backend?)",
                         peer);
  }
  size_t offset = sizeof(kAddressMagic);
  const SocketAddress a = SocketAddress::readFrom(address, offset);
  if (a.family() != socket_.localAddress().family()) {
    throw TransportError("udp: rank " + std::to_string(peer) + " is at " + a.toString() +
                             ", another address family than this rank's " +
                             socket_.localAddress().toString(),
                         peer);
  }
  auto [it, inserted] = peerByAddress_.emplace(a, peer);
  if (!inserted && it->second != peer) {
    throw TransportError("udp: ranks " + std::to_string(it->second) + " and " +
                             std::to_string(peer) + " both claim " + a.toString(),
                         peer);
  }
  Peer& p = peers_[static_cast<size_t>(peer)];
  p.address = a;
  p.connected = true;
}

UdpTransport::Peer& UdpTransport::peerAt(int peer, const char* what) {
  if (peer < 0 || peer >= size_) {
    throw TransportError(std::string("udp: ") + what + " with rank " + std::to_string(peer) +
                             " outside the group of " + std::to_string(size_),
                         peer);
  }
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.connected) {
    throw TransportError(std::string("udp: ") + what + " with rank " + std::to_string(peer) +
                             " before connecting to it",
                         peer);
  }
  return p;
}

RequestPtr UdpTransport::send(int peer, Tag tag, const void* data, size_t bytes,
                              MemoryType mem) {
  if (mem != MemoryType::kHost) {
    throw TransportError("udp: the udp transport carries host memory only", peer);
  }
  Peer& p = peerAt(peer, "send");
  auto req = std::make_shared<UdpRequest>(this, true, peer, bytes);
  if (!p.error.empty()) {
    req->failNow(p.error);
    return req;
  }
  const MessageId id = p.connection->send(tag, data, bytes);
  req->boundPeer_ = peer;
  req->coreId_ = id;
  p.sends.emplace(id, req);
  return req;
}

RequestPtr UdpTransport::recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                              MemoryType mem) {
  if (mem != MemoryType::kHost) {
    throw TransportError("udp: the udp transport carries host memory only", peer);
  }
  auto req = std::make_shared<UdpRequest>(this, false, peer, bytes);
  req->tag_ = tag;
  req->mask_ = mask;
  req->buffer_ = data;
  if (peer == kAnySource) {
    anySource_.push_back(req);
    bool ignored = false;
    matchAnySource(ignored);
    return req;
  }
  Peer& p = peerAt(peer, "receive");
  if (!p.error.empty()) {
    req->failNow(p.error);
    return req;
  }
  const ReceiveId id = p.connection->postReceive(tag, mask, data, bytes);
  req->boundPeer_ = peer;
  req->coreId_ = id;
  p.receives.emplace(id, req);
  return req;
}

void UdpTransport::cancelRequest(UdpRequest& r) {
  // A send cannot be withdrawn once queued (the peer may hold part of it); the owner that
  // gives up on one calls abortPeer, which fails it.
  if (r.isSend() || r.cancelling_) return;
  if (r.boundPeer_ < 0) {
    for (auto it = anySource_.begin(); it != anySource_.end(); ++it) {
      if (it->get() == &r) {
        r.cancelling_ = true;
        cancelled_.push_back(*it);
        anySource_.erase(it);
        return;
      }
    }
    return;
  }
  Peer& p = peers_[static_cast<size_t>(r.boundPeer_)];
  // Its kReceiveCancelled event completes it in a later progress().
  if (p.connection->cancelReceive(r.coreId_)) r.cancelling_ = true;
}

void UdpTransport::completeCancelled(bool& active) {
  if (cancelled_.empty()) return;
  auto done = std::move(cancelled_);
  cancelled_.clear();
  for (auto& r : done) r->failNow("the receive from " + peerLabel(r->peer()) + " was cancelled");
  active = true;
}

bool UdpTransport::progress() {
  bool active = false;
  completeCancelled(active);
  TimeUs now = nowUs();
  receiveDatagrams(now, active);
  if (faults_ && !delayed_.empty()) deliverDelayed(now, active);
  fireTimers(now);
  transmit(now, active);
  handleEvents(active);
  if (!anySource_.empty()) matchAnySource(active);
  return active;
}

void UdpTransport::receiveDatagrams(TimeUs now, bool& active) {
  for (size_t round = 0; round < kReceiveBatchesPerProgress; ++round) {
    const size_t n = socket_.receiveBatch(receiveBatch_);
    if (n == 0) return;
    ++counts_.receiveBatches;
    active = true;
    for (size_t i = 0; i < n; ++i) {
      const Datagram& d = receiveBatch_[i];
      if (d.truncated) {
        ++counts_.truncatedOnReceive;
        continue;
      }
      const auto it = peerByAddress_.find(d.peer);
      if (it == peerByAddress_.end()) {
        ++counts_.unknownSource;
        continue;
      }
      // A coalesced train (UDP GRO) is cut back into the datagrams it was sent as; anything
      // else (an empty datagram too, which the core then counts as truncated) is one piece.
      const size_t step = d.segmentSize != 0 ? d.segmentSize : std::max<size_t>(d.length, 1);
      if (d.segmentSize != 0) ++counts_.trainsReceived;
      for (size_t offset = 0; offset == 0 || offset < d.length; offset += step) {
        const std::span<const uint8_t> bytes(d.data + offset, std::min(step, d.length - offset));
        if (!faults_) {
          deliver(it->second, bytes, now);
          continue;
        }
        faultOut_.clear();
        faults_->apply(bytes, faultOut_);
        for (auto& copy : faultOut_) {
          if (copy.extraDelayUs == 0) {
            deliver(it->second, copy.bytes, now);
          } else {
            delayed_.push(Delayed{now + copy.extraDelayUs, delayedOrder_++, it->second,
                                  std::move(copy.bytes)});
          }
        }
      }
    }
    if (n < receiveBatch_.size()) return;
  }
}

void UdpTransport::deliver(int peer, std::span<const uint8_t> bytes, TimeUs now) {
  peers_[static_cast<size_t>(peer)].connection->onDatagram(bytes, now);
}

void UdpTransport::deliverDelayed(TimeUs now, bool& active) {
  while (!delayed_.empty() && delayed_.top().dueUs <= now) {
    // top() is const, but the element is popped right after: moving its bytes out is safe.
    Delayed d = std::move(const_cast<Delayed&>(delayed_.top()));
    delayed_.pop();
    deliver(d.peer, d.bytes, now);
    active = true;
  }
}

void UdpTransport::fireTimers(TimeUs now) {
  for (auto& peer : peers_) {
    if (!peer.connected) continue;
    const auto t = peer.connection->nextTimeout();
    if (t && *t <= now) peer.connection->onTimeout(now);
  }
}

void UdpTransport::setWantWritable(bool want) {
  if (want == wantWritable_) return;
  epoll_event ev{};
  ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
  ev.data.fd = socket_.fd();
  if (::epoll_ctl(epollFd_.get(), EPOLL_CTL_MOD, socket_.fd(), &ev) != 0) {
    throwErrno("epoll_ctl(MOD)");
  }
  wantWritable_ = want;
}

void UdpTransport::buildTrains() {
  // Slots are mtu apart in sendArena_, so consecutive full-size datagrams to one peer are
  // already one contiguous train; a shorter datagram (an ACK, a message's tail) ends it.
  trains_.clear();
  trainSlots_.clear();
  const size_t mtu = options_.config.mtuPayload;
  const bool gso = socket_.segmentationOffload() && 2 * mtu <= UdpSocket::kMaxTrainBytes;
  for (size_t i = outgoingSent_; i < outgoingCount_;) {
    Datagram train = outgoing_[i];
    size_t slots = 1;
    while (gso && i + slots < outgoingCount_ && outgoing_[i + slots - 1].length == mtu &&
           slots < UdpSocket::kMaxSegments &&
           train.length + outgoing_[i + slots].length <= UdpSocket::kMaxTrainBytes &&
           outgoing_[i + slots].peer == train.peer) {
      train.length += outgoing_[i + slots].length;
      ++slots;
    }
    train.segmentSize = slots > 1 ? static_cast<uint16_t>(mtu) : 0;
    trains_.push_back(train);
    trainSlots_.push_back(slots);
    i += slots;
  }
}

bool UdpTransport::flushOutgoing() {
  if (outgoingSent_ < outgoingCount_) {
    buildTrains();
    const size_t sent = socket_.sendBatch(trains_);
    ++counts_.sendBatches;
    for (size_t k = 0; k < sent; ++k) {
      outgoingSent_ += trainSlots_[k];
      if (trainSlots_[k] > 1) ++counts_.trainsSent;
    }
  }
  if (outgoingSent_ < outgoingCount_) {
    ++counts_.sendBlocked;
    setWantWritable(true);
    return false;
  }
  outgoingSent_ = outgoingCount_ = 0;
  setWantWritable(false);
  return true;
}

void UdpTransport::transmit(TimeUs now, bool& active) {
  sendBacklog_ = false;
  if (!flushOutgoing()) return;
  const size_t mtu = options_.config.mtuPayload;
  size_t budget = kSendPerProgress;
  bool more = true;
  while (more && budget > 0) {
    more = false;
    for (int k = 0; k < size_ && budget > 0; ++k) {
      const int p = (nextPeerToSend_ + k) % size_;
      Peer& peer = peers_[static_cast<size_t>(p)];
      if (!peer.connected) continue;
      size_t burst = 0;
      for (; burst < kPeerBurst && budget > 0; ++burst) {
        if (outgoingCount_ == outgoing_.size() && !flushOutgoing()) {
          sendBacklog_ = true;
          return;
        }
        Datagram& d = outgoing_[outgoingCount_];
        const size_t n = peer.connection->pollTransmit(now, std::span<uint8_t>(d.data, mtu));
        if (n == 0) break;
        d.length = n;
        d.peer = peer.address;
        ++outgoingCount_;
        --budget;
        active = true;
      }
      if (burst == kPeerBurst) more = true;
    }
    nextPeerToSend_ = (nextPeerToSend_ + 1) % size_;
  }
  if (budget == 0) sendBacklog_ = true;
  if (!flushOutgoing()) sendBacklog_ = true;
}

void UdpTransport::handleEvents(bool& active) {
  for (int p = 0; p < size_; ++p) {
    Peer& peer = peers_[static_cast<size_t>(p)];
    while (auto e = peer.connection->pollEvent()) {
      active = true;
      switch (e->kind) {
        case EventKind::kPeerFailed:
          if (peer.error.empty()) {
            peer.error = "udp: connection to rank " + std::to_string(p) + " failed: " + e->error;
          }
          break;
        case EventKind::kSendCompleted:
        case EventKind::kSendFailed: {
          auto it = peer.sends.find(e->id);
          if (it == peer.sends.end()) break;
          auto r = std::move(it->second);
          peer.sends.erase(it);
          if (e->kind == EventKind::kSendCompleted) {
            r->completeNow(e->bytes, e->tag);
          } else {
            r->failNow(peer.error.empty() ? "udp: send to rank " + std::to_string(p) +
                                                " failed: " + e->error
                                          : peer.error);
          }
          break;
        }
        case EventKind::kMessageReceived:
        case EventKind::kReceiveFailed:
        case EventKind::kReceiveCancelled: {
          auto it = peer.receives.find(e->id);
          if (it == peer.receives.end()) break;
          auto r = std::move(it->second);
          peer.receives.erase(it);
          if (e->kind == EventKind::kMessageReceived && e->truncated) {
            r->failNow("udp: message of " + std::to_string(e->bytes) + " bytes from rank " +
                       std::to_string(p) + " is longer than the " +
                       std::to_string(r->postedBytes()) + " bytes posted to receive it");
          } else if (e->kind == EventKind::kMessageReceived) {
            r->completeNow(e->bytes, e->tag);
          } else if (e->kind == EventKind::kReceiveCancelled) {
            r->failNow("the receive from " + peerLabel(r->peer()) + " was cancelled");
          } else {
            r->failNow(peer.error.empty() ? "udp: receive from rank " + std::to_string(p) +
                                                " failed: " + e->error
                                          : peer.error);
          }
          break;
        }
      }
    }
  }
}

void UdpTransport::matchAnySource(bool& active) {
  for (auto it = anySource_.begin(); it != anySource_.end();) {
    UdpRequest& r = **it;
    bool bound = false;
    bool anyAlive = false;
    for (int p = 0; p < size_ && !bound; ++p) {
      Peer& peer = peers_[static_cast<size_t>(p)];
      if (!peer.connected || !peer.error.empty()) continue;
      anyAlive = true;
      if (!peer.connection->hasMatchable(r.tag_, r.mask_)) continue;
      const ReceiveId id = peer.connection->postReceive(r.tag_, r.mask_, r.buffer_, r.postedBytes());
      r.boundPeer_ = p;
      r.coreId_ = id;
      peer.receives.emplace(id, *it);
      bound = true;
    }
    if (bound) {
      it = anySource_.erase(it);
      active = true;
    } else if (!anyAlive) {
      (*it)->failNow("udp: receive from any rank failed: every connection has failed");
      it = anySource_.erase(it);
      active = true;
    } else {
      ++it;
    }
  }
}

void UdpTransport::failPeer(int peer, const std::string& why) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.error.empty()) p.error = why;
  p.connection->fail(why);
}

void UdpTransport::abortPeer(int peer, const std::string& why) {
  if (peer < 0 || peer >= size_) return;
  failPeer(peer, why);
  bool ignored = false;
  handleEvents(ignored);  // the requests complete now: their buffers may go right after
}

std::string UdpTransport::peerError(int peer) const {
  if (peer < 0 || peer >= size_) return {};
  return peers_[static_cast<size_t>(peer)].error;
}

std::optional<TimeUs> UdpTransport::earliestTimeout() const {
  std::optional<TimeUs> next;
  for (const auto& peer : peers_) {
    if (!peer.connected) continue;
    const auto t = peer.connection->nextTimeout();
    if (t && (!next || *t < *next)) next = t;
  }
  if (!delayed_.empty() && (!next || delayed_.top().dueUs < *next)) next = delayed_.top().dueUs;
  return next;
}

bool UdpTransport::arm() {
  if (!cancelled_.empty() || sendBacklog_) return false;
  const auto deadline = earliestTimeout();
  if (deadline && *deadline <= nowUs()) return false;
  itimerspec spec{};
  if (deadline) {
    // steady_clock is CLOCK_MONOTONIC on Linux, the timerfd's clock.
    spec.it_value.tv_sec = static_cast<time_t>(*deadline / 1'000'000);
    spec.it_value.tv_nsec = static_cast<long>((*deadline % 1'000'000) * 1000);
  }
  // Re-arming (or disarming) also clears an expiry the fd still reports.
  if (::timerfd_settime(timerFd_.get(), TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
    throwErrno("timerfd_settime()");
  }
  return true;
}

std::vector<Counters> UdpTransport::peerCounters() const {
  std::vector<Counters> out(static_cast<size_t>(size_));
  for (int p = 0; p < size_; ++p) {
    out[static_cast<size_t>(p)] = statCounters(peers_[static_cast<size_t>(p)].connection->stats());
  }
  return out;
}

Counters UdpTransport::transportCounters() const {
  Counters c = {
      {"unknown_source_drops", counts_.unknownSource},
      {"truncated_on_receive", counts_.truncatedOnReceive},
      {"send_blocked", counts_.sendBlocked},
      {"receive_batches", counts_.receiveBatches},
      {"send_batches", counts_.sendBatches},
      {"trains_sent", counts_.trainsSent},
      {"trains_received", counts_.trainsReceived},
      {"segmentation_offload", socket_.segmentationOffload() ? 1u : 0u},
      {"receive_offload", socket_.receiveOffload() ? 1u : 0u},
      {"mtu_payload", options_.config.mtuPayload},
      {"socket_receive_buffer", static_cast<uint64_t>(socket_.receiveBufferBytes())},
      {"socket_send_buffer", static_cast<uint64_t>(socket_.sendBufferBytes())},
  };
  if (faults_) {
    const auto& f = faults_->counters();
    c.insert(c.end(), {{"faults_seen", f.seen},
                       {"faults_dropped", f.dropped},
                       {"faults_duplicated", f.duplicated},
                       {"faults_reordered", f.reordered},
                       {"faults_delayed", f.delayed},
                       {"faults_corrupted", f.corrupted}});
  }
  return c;
}

}  // namespace ucxb::udp
