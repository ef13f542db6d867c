#include "transports/udp/endpoint.h"

#include <algorithm>
#include <stdexcept>

#include "transports/udp/auth_keys.h"

namespace ucxb::udp {
namespace {

// While lingering our last ACK to a peer may have been lost, and its timer may have backed
// off: the ACK is repeated this often (cheap, and at 30% loss the chance that every copy is
// lost is nil), rather than counting on answering its retransmission. So is the CLOSE, which
// lets a peer that has everything from us stop lingering.
constexpr DurationUs kAckRepeatUs = 5000;

const char* const kClosing = "the udp transport was closed with the request pending";

std::string cancelledMessage(int peer) {
  return "the receive from " + peerLabel(peer) + " was cancelled";
}

// What each connection runs with: the group's udp_config, with peer_timeout_us raised to the
// op timeout, so that silence alone never fails a peer before the op waiting on it times out.
// With authentication the connections write datagrams a trailer shorter, so that sealed
// ones are still at most mtu_payload (and full-size ones still make GSO trains).
UdpConfig connectionConfig(const EndpointOptions& options) {
  UdpConfig c = options.config;
  c.peerTimeoutUs = std::max(c.peerTimeoutUs, options.opTimeoutUs);
  if (options.groupKey) {
    if (c.mtuPayload < kMinMtuPayload + kAuthTrailerBytes) {
      throw ConfigError("udp config: mtu_payload=" + std::to_string(c.mtuPayload) +
                        " leaves no room for the " + std::to_string(kAuthTrailerBytes) +
                        "-byte authentication trailer (secret_file): at least " +
                        std::to_string(kMinMtuPayload + kAuthTrailerBytes));
    }
    c.mtuPayload -= kAuthTrailerBytes;
  }
  return c;
}

// The rate of this rank's downlink when the fault layer emulates it on every path (the sum
// over the paths), else 0: congestion=credit grants at it (credit_scheduler.h).
uint64_t emulatedDownlinkMbps(const EndpointOptions& options) {
  uint64_t total = 0;
  for (uint32_t p = 0; p < options.config.paths; ++p) {
    const FaultConfig& f = p < options.pathFaults.size() ? options.pathFaults[p] : options.faults;
    if (!f.bottleneck()) return 0;
    total += f.rateMbps;
  }
  return total;
}

}  // namespace

class Endpoint::EndpointRequest final : public Request {
 public:
  EndpointRequest(Endpoint* owner, bool isSend, int peer, size_t bytes)
      : Request(isSend, peer, bytes), owner_(owner) {}

  // Pending requests never outlive their endpoint (its destructor fails them), so owner_ is
  // valid whenever pending() holds.
  void cancel() override {
    if (owner_ != nullptr && pending()) owner_->cancelRequest(*this);
  }
  int boundPeer() const override { return boundPeer_ >= 0 ? boundPeer_ : peer(); }

 private:
  friend class Endpoint;
  void completeNow(size_t bytes, Tag tag) { complete(bytes, tag); }
  void failNow(std::string why) { fail(std::move(why)); }
  void failTruncatedNow(std::string why) { failTruncated(std::move(why)); }

  Endpoint* owner_;
  // Receives: what was posted, kept for any-source matching and for cancellation.
  Tag tag_ = 0;
  Tag mask_ = 0;
  void* buffer_ = nullptr;
  int boundPeer_ = -1;   // the connection holding it (-1: an any-source receive not yet bound)
  uint64_t coreId_ = 0;  // its MessageId or ReceiveId there
  bool cancelling_ = false;
};

Endpoint::Endpoint(int rank, int size, EndpointOptions options)
    : rank_(rank), size_(size), options_(std::move(options)), peers_(static_cast<size_t>(size)) {
  validate(options_.config);
  credits_ = makeCreditScheduler(options_.config);
  if (const uint64_t mbps = emulatedDownlinkMbps(options_)) credits_->setEmulatedDownlinkMbps(mbps);
  for (int p = 0; p < size_; ++p) {
    PeerIdentity id;
    id.localRank = static_cast<uint16_t>(rank_);
    id.peerRank = static_cast<uint16_t>(p);
    id.sessionToken = options_.sessionToken;
    Peer& peer = peers_[static_cast<size_t>(p)];
    peer.connection =
        std::make_unique<PeerConnection>(connectionConfig(options_), id, credits_.get());
    if (options_.groupKey) {
      peer.sealer = std::make_unique<DatagramSealer>(
          deriveDirectionKey(*options_.groupKey, rank_, p), id.localRank, id.peerRank);
      peer.opener = std::make_unique<DatagramOpener>(
          deriveDirectionKey(*options_.groupKey, p, rank_), id.peerRank, id.localRank);
      // The peer's replay window covers so many datagrams, of whatever size.
      peer.connection->limitPacketsInFlight(ReplayWindow::kInFlightLimit);
    }
  }
  const uint32_t paths = options_.config.paths;
  if (options_.pathFaults.size() > paths) {
    throw ConfigError("udp faults: " + std::to_string(options_.pathFaults.size()) +
                      " ';'-separated path sections, but udp_config paths=" +
                      std::to_string(paths) + " (one section per path at most)");
  }
  std::vector<FaultConfig> perPath(paths, options_.faults);
  bool anyFaults = false;
  for (uint32_t p = 0; p < paths; ++p) {
    if (p < options_.pathFaults.size()) perPath[p] = options_.pathFaults[p];
    // Same seed on every rank would drop the same datagram numbers in both directions.
    perPath[p].seed = perPath[p].seed * 1000003u + static_cast<uint64_t>(rank_);
    if (p >= options_.pathFaults.size() && p > 0) perPath[p].seed += 7919u * p;
    anyFaults = anyFaults || perPath[p].any();
  }
  if (anyFaults) faults_ = std::make_unique<FaultInjector>(std::move(perPath));
  if (options_.config.traceSamples > 0) {
    trace_ = std::make_unique<TraceRecorder>(options_.config.traceSamples,
                                             options_.config.traceIntervalUs, rank_, size_, paths);
  }
}

Endpoint::~Endpoint() {
  for (auto& peer : peers_) {
    for (auto& [id, r] : peer.sends) r->failNow(kClosing);
    for (auto& [id, r] : peer.receives) r->failNow(kClosing);
    peer.sends.clear();
    peer.receives.clear();
  }
  for (auto& r : anySource_) r->failNow(kClosing);
  for (auto& r : cancelled_) r->failNow("cancelled");
}

void Endpoint::connect(int peer, const SocketAddress& address) {
  connect(peer, std::span<const SocketAddress>(&address, 1));
}

void Endpoint::connect(int peer, std::span<const SocketAddress> addresses,
                       std::optional<uint64_t> receiveBufferBytes) {
  if (peer < 0 || peer >= size_) {
    throw TransportError("udp: connect to rank " + std::to_string(peer) + " outside the group of " +
                             std::to_string(size_),
                         peer);
  }
  const size_t paths = options_.config.paths;
  if (addresses.empty() || (addresses.size() != 1 && addresses.size() != paths)) {
    throw TransportError("udp: rank " + std::to_string(peer) + " has " +
                             std::to_string(addresses.size()) + " path addresses, this rank " +
                             std::to_string(paths) + " (udp_config paths must agree)",
                         peer);
  }
  for (size_t i = 0; i < addresses.size(); ++i) {
    const Route route{peer, static_cast<uint32_t>(i)};
    auto [it, inserted] = peerByAddress_.emplace(addresses[i], route);
    if (!inserted && (it->second.peer != peer || it->second.path != route.path)) {
      throw TransportError("udp: ranks " + std::to_string(it->second.peer) + " and " +
                               std::to_string(peer) + " both claim " + addresses[i].toString(),
                           peer);
    }
  }
  Peer& p = peers_[static_cast<size_t>(peer)];
  p.addresses.assign(addresses.begin(), addresses.end());
  p.connected = true;
  // Every other rank of the group may send to the peer at once.
  if (receiveBufferBytes) {
    p.connection->setSendWindowBytes(
        sendWindowFor(options_.config, *receiveBufferBytes, std::max(size_ - 1, 1)));
  }
}

Endpoint::Peer& Endpoint::peerAt(int peer, const char* what) {
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

RequestPtr Endpoint::send(int peer, Tag tag, const void* data, size_t bytes) {
  Peer& p = peerAt(peer, "send");
  auto req = std::make_shared<EndpointRequest>(this, true, peer, bytes);
  if (!p.error.empty()) {
    req->failNow(p.error);
    return req;
  }
  MessageId id = 0;
  try {
    id = p.connection->send(tag, data, bytes);
  } catch (const std::invalid_argument& e) {
    // The connection knows the limit, not whose message it is: name the peer.
    throw TransportError("udp: send of " + std::to_string(bytes) + " bytes to rank " +
                             std::to_string(peer) + " refused: " + e.what(),
                         peer);
  }
  req->boundPeer_ = peer;
  req->coreId_ = id;
  p.sends.emplace(id, req);
  return req;
}

RequestPtr Endpoint::recv(int peer, Tag tag, Tag mask, void* data, size_t bytes) {
  return postReceive(peer, tag, mask, data, bytes, nullptr);
}

RequestPtr Endpoint::recv(int peer, Tag tag, Tag mask, size_t bytes, ReceiveSink& sink) {
  if (peer == kAnySource) {
    throw TransportError("udp: a receive into a sink needs a source rank, not any");
  }
  return postReceive(peer, tag, mask, nullptr, bytes, &sink);
}

RequestPtr Endpoint::postReceive(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                                 ReceiveSink* sink) {
  auto req = std::make_shared<EndpointRequest>(this, false, peer, bytes);
  req->tag_ = tag;
  req->mask_ = mask;
  req->buffer_ = data;
  if (peer == kAnySource) {
    anySource_.push_back(req);
    matchAnySource();
    return req;
  }
  Peer& p = peerAt(peer, "receive");
  if (!p.error.empty()) {
    req->failNow(p.error);
    return req;
  }
  const ReceiveId id = p.connection->postReceive(tag, mask, data, bytes, sink);
  req->boundPeer_ = peer;
  req->coreId_ = id;
  p.receives.emplace(id, req);
  return req;
}

void Endpoint::cancelRequest(EndpointRequest& r) {
  // A send cannot be withdrawn once queued (the peer may hold part of it); the owner that
  // gives up on one calls abortPeer, which fails it.
  if (r.isSend() || r.cancelling_) return;
  if (r.boundPeer_ < 0) {
    for (auto it = anySource_.begin(); it != anySource_.end(); ++it) {
      if (it->get() == &r) {
        r.cancelling_ = true;
        cancelled_.push_back(*it);
        anySource_.erase(it);
        watchAnySource();
        return;
      }
    }
    return;
  }
  Peer& p = peers_[static_cast<size_t>(r.boundPeer_)];
  // Its kReceiveCancelled event completes it in a later completeRequests().
  if (p.connection->cancelReceive(r.coreId_)) r.cancelling_ = true;
}

bool Endpoint::handleDatagram(TimeUs now, const SocketAddress& from,
                              std::span<const uint8_t> bytes, size_t segmentSize) {
  const auto it = peerByAddress_.find(from);
  if (it == peerByAddress_.end()) {
    ++unknownSource_;
    return false;
  }
  const int peer = it->second.peer;
  const uint32_t path = it->second.path;
  // A train is cut back into the datagrams it was sent as; anything else (an empty datagram
  // too, which the core then counts as truncated) is one piece.
  const size_t step = segmentSize != 0 ? segmentSize : std::max<size_t>(bytes.size(), 1);
  for (size_t offset = 0; offset == 0 || offset < bytes.size(); offset += step) {
    const auto piece = bytes.subspan(offset, std::min(step, bytes.size() - offset));
    if (!faults_) {
      deliver(peer, path, piece, now);
      continue;
    }
    faultOut_.clear();
    faults_->apply(piece, now, faultOut_, path);
    if (trace_) trace_->sampleQueue(now, peer, path, *faults_);
    for (auto& copy : faultOut_) {
      if (copy.extraDelayUs == 0) {
        deliver(peer, path, copy.bytes, now);
      } else {
        delayed_.push(
            Delayed{now + copy.extraDelayUs, delayedOrder_++, peer, path, std::move(copy.bytes)});
      }
    }
  }
  return true;
}

bool Endpoint::handlePortUnreachable(TimeUs now, const SocketAddress& to) {
  ++portUnreachable_;
  const auto it = peerByAddress_.find(to);
  if (it == peerByAddress_.end() || it->second.peer == rank_) return false;
  const int peer = it->second.peer;
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.error.empty() || p.connection->failed()) return false;
  p.refusedPaths |= uint32_t{1} << it->second.path;
  // An any-source receive pending could come from this peer: it waits on it too. A closing
  // group's linger waits on every connection still receiving: once the peer's port is closed,
  // nobody is left to send the rest of a message or to hear our ACKs.
  if (p.sends.empty() && p.receives.empty() && anySource_.empty() && !closing()) return false;
  if (p.opener) {
    // Pinged once per suspicion: a dead peer's port answers every PING with another ICMP.
    if (!p.unreachableSince) {
      p.unreachableSince = now;
      p.connection->pingSoon();
    }
    return false;
  }
  // Through the connection, so that handleEvents names the peer like any connection failure.
  p.connection->fail("its port " + to.toString() +
                     " is closed (ICMP port unreachable): the process is gone");
  return true;
}

std::string Endpoint::refusedPorts(const Peer& p) const {
  std::string out;
  size_t count = 0;
  for (size_t i = 0; i < p.addresses.size(); ++i) {
    if (!(p.refusedPaths >> i & 1u)) continue;
    out += (count++ == 0 ? "" : " and ") + p.addresses[i].toString();
  }
  if (count == 0) return "port " + p.addresses.front().toString() + " is";
  return (count == 1 ? "port " : "ports ") + out + (count == 1 ? " is" : " are");
}

std::string Endpoint::pathReport(const Peer& p) const {
  const uint32_t paths = options_.config.paths;
  if (paths <= 1) return {};
  std::string out = " [";
  for (uint32_t i = 0; i < paths; ++i) {
    const size_t a = p.addresses.size() == 1 ? 0 : i;
    const PathStats& s = p.connection->pathSelector().stats(i);
    out += (i == 0 ? "path " : "; path ") + std::to_string(i) + " to " +
           p.addresses[a].toString() + ": ";
    if (p.refusedPaths >> a & 1u) out += "ICMP port unreachable, ";
    out += std::to_string(s.packetsSent) + " packets sent, " + std::to_string(s.acked) +
           " acknowledged, " + std::to_string(s.lost) + " declared lost";
  }
  return out + "]";
}

DurationUs Endpoint::unreachableGraceUs() const {
  // A live peer acknowledges the PING within an RTT; keepalive_us is how long silence is
  // tolerated before a PING anyway.
  const UdpConfig& c = options_.config;
  return c.keepaliveUs != 0 ? c.keepaliveUs : c.rtoMaxUs;
}

bool Endpoint::failUnreachable(TimeUs now) {
  bool failed = false;
  for (auto& p : peers_) {
    if (!p.unreachableSince || now - *p.unreachableSince < unreachableGraceUs()) continue;
    p.unreachableSince.reset();
    if (!p.error.empty() || p.connection->failed()) continue;
    if (p.sends.empty() && p.receives.empty() && anySource_.empty() && !closing()) continue;
    p.connection->fail("its " + refusedPorts(p) +
                       " closed (ICMP port unreachable) and nothing authenticated came from "
                       "it for " + std::to_string(unreachableGraceUs() / 1000) +
                       " ms after a PING: the process is gone");
    failed = true;
  }
  return failed;
}

void Endpoint::deliver(int peer, uint32_t path, std::span<const uint8_t> bytes, TimeUs now) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.opener) {
    // Nothing unauthenticated reaches the connection: not even its decoder sees it.
    if (p.opener->open(bytes) != OpenResult::kAccepted) {
      p.authDroppedBytes += bytes.size();
      return;
    }
    bytes = bytes.first(bytes.size() - kAuthTrailerBytes);
    p.unreachableSince.reset();  // it is alive: whatever the ICMP said was not from it
    p.refusedPaths = 0;
  }
  // Whatever came over this path came from an open port. With one address for every path,
  // the ICMP reports count against path 0 (handlePortUnreachable's route).
  p.refusedPaths &= ~(uint32_t{1} << (p.addresses.size() == 1 ? 0 : path));
  p.connection->onDatagram(bytes, now, path);
  if (trace_) trace_->sampleConnection(now, peer, *p.connection);
}

void Endpoint::sampleTraceNow(TimeUs now) {
  if (!trace_) return;
  for (auto& peer : peers_) {
    if (!peer.connected) continue;
    trace_->sampleConnection(now, peer.connection->identity().peerRank, *peer.connection,
                             TraceRecorder::kForced);
  }
}

bool Endpoint::handleTimeout(TimeUs now) {
  bool delivered = false;
  while (!delayed_.empty() && delayed_.top().dueUs <= now) {
    // top() is const, but the element is popped right after: moving its bytes out is safe.
    Delayed d = std::move(const_cast<Delayed&>(delayed_.top()));
    delayed_.pop();
    deliver(d.peer, d.path, d.bytes, now);
    delivered = true;
  }
  if (failUnreachable(now)) delivered = true;
  if (linger_ && (!linger_->lastAckRepeat || now - *linger_->lastAckRepeat >= kAckRepeatUs)) {
    for (auto& peer : peers_) {
      if (!peer.connected || peer.connection->failed()) continue;
      peer.connection->acknowledgeAgain();
      peer.connection->announceClose();
    }
    linger_->lastAckRepeat = now;
  }
  for (auto& peer : peers_) {
    if (!peer.connected) continue;
    const auto t = peer.connection->nextTimeout();
    if (t && *t <= now) {
      peer.connection->onTimeout(now);
      const int rank = peer.connection->identity().peerRank;
      if (trace_) trace_->sampleConnection(now, rank, *peer.connection);
    }
  }
  return delivered;
}

size_t Endpoint::pollTransmit(TimeUs now, std::span<uint8_t> out, SocketAddress& to) {
  uint32_t path = 0;
  return pollTransmit(now, out, to, path);
}

size_t Endpoint::pollTransmit(TimeUs now, std::span<uint8_t> out, SocketAddress& to,
                              uint32_t& path) {
  // Ends after every peer in a row had nothing; a peer that used up its burst is passed over
  // without counting, so it gets another turn when the others are done.
  for (int emptyInARow = 0; emptyInARow < size_;) {
    Peer& peer = peers_[static_cast<size_t>(transmitTurn_)];
    if (turnBurst_ < kPeerBurst) {
      if (peer.connected) {
        if (const size_t n = peer.connection->pollTransmit(now, out)) {
          ++turnBurst_;
          if (trace_) trace_->sampleConnection(now, transmitTurn_, *peer.connection);
          path = peer.connection->transmitPath();
          to = peer.addresses[peer.addresses.size() == 1 ? 0 : path];
          return peer.sealer ? peer.sealer->seal(out, n) : n;
        }
      }
      ++emptyInARow;
    }
    transmitTurn_ = (transmitTurn_ + 1) % size_;
    turnBurst_ = 0;
  }
  return 0;
}

bool Endpoint::completeRequests() {
  bool active = completeCancelled();
  active = handleEvents() || active;
  if (!anySource_.empty()) active = matchAnySource() || active;
  return active;
}

bool Endpoint::completeCancelled() {
  if (cancelled_.empty()) return false;
  auto done = std::move(cancelled_);
  cancelled_.clear();
  for (auto& r : done) r->failNow(cancelledMessage(r->peer()));
  return true;
}

bool Endpoint::handleEvents() {
  bool active = false;
  for (int p = 0; p < size_; ++p) {
    Peer& peer = peers_[static_cast<size_t>(p)];
    while (auto e = peer.connection->pollEvent()) {
      active = true;
      switch (e->kind) {
        case EventKind::kPeerFailed:
          if (peer.error.empty()) {
            peer.error = "udp: connection to rank " + std::to_string(p) + " failed: " + e->error +
                         pathReport(peer);
          }
          failures_.push_back(PeerFailure{p, peer.error});
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
            r->failTruncatedNow("udp: message of " + std::to_string(e->bytes) +
                                    " bytes from rank " + std::to_string(p) +
                                    " is longer than the " + std::to_string(r->postedBytes()) +
                                    " bytes posted to receive it");
          } else if (e->kind == EventKind::kMessageReceived) {
            r->completeNow(e->bytes, e->tag);
          } else if (e->kind == EventKind::kReceiveCancelled) {
            r->failNow(cancelledMessage(r->peer()));
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
  return active;
}

bool Endpoint::matchAnySource() {
  bool active = false;
  for (auto it = anySource_.begin(); it != anySource_.end();) {
    EndpointRequest& r = **it;
    bool bound = false;
    bool anyAlive = false;
    const Peer* dead = nullptr;  // the first failed peer: the receive could have come from it
    for (int p = 0; p < size_ && !bound; ++p) {
      Peer& peer = peers_[static_cast<size_t>(p)];
      if (!peer.connected) continue;
      if (!peer.error.empty()) {
        if (dead == nullptr) dead = &peer;
        continue;
      }
      anyAlive = true;
      if (!peer.connection->hasMatchable(r.tag_, r.mask_)) continue;
      const ReceiveId id =
          peer.connection->postReceive(r.tag_, r.mask_, r.buffer_, r.postedBytes());
      r.boundPeer_ = p;
      r.coreId_ = id;
      peer.receives.emplace(id, *it);
      bound = true;
    }
    if (bound) {
      it = anySource_.erase(it);
      active = true;
    } else if (dead != nullptr) {
      // A message already here from a live peer was taken above; otherwise the one this
      // receive waits for may be the dead peer's, which will never come. Waiting on the
      // others would only end at the group's timeout for an op the group then fails anyway
      // (as a receive from the dead peer itself fails now): fail it, naming the peer.
      (*it)->failNow("udp: receive from any rank failed: " + dead->error);
      it = anySource_.erase(it);
      active = true;
    } else if (!anyAlive) {
      (*it)->failNow("udp: receive from any rank failed: no rank is connected");
      it = anySource_.erase(it);
      active = true;
    } else {
      ++it;
    }
  }
  watchAnySource();
  return active;
}

void Endpoint::watchAnySource() {
  for (int p = 0; p < size_; ++p) {
    Peer& peer = peers_[static_cast<size_t>(p)];
    if (p != rank_ && peer.connected) peer.connection->setAnySourcePending(!anySource_.empty());
  }
}

void Endpoint::failPeer(int peer, const std::string& why) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.error.empty()) p.error = why;
  p.connection->fail(why);
}

void Endpoint::abortPeer(int peer, const std::string& why) {
  if (peer < 0 || peer >= size_) return;
  failPeer(peer, why);
  handleEvents();  // the requests complete now: their buffers may go right after
}

int Endpoint::probe(Tag tag, Tag mask) const {
  for (int p = 0; p < size_; ++p) {
    const Peer& peer = peers_[static_cast<size_t>(p)];
    if (p != rank_ && peer.connected && peer.connection->hasMatchable(tag, mask)) return p;
  }
  return -1;
}

std::string Endpoint::peerError(int peer) const {
  if (peer < 0 || peer >= size_) return {};
  return peers_[static_cast<size_t>(peer)].error;
}

std::optional<PeerFailure> Endpoint::pollPeerFailure() {
  if (failures_.empty()) return std::nullopt;
  PeerFailure f = std::move(failures_.front());
  failures_.pop_front();
  return f;
}

std::optional<TimeUs> Endpoint::nextTimeout() const {
  // A cancelled any-source receive completes in the next round: due at once.
  if (!cancelled_.empty()) return TimeUs{0};
  std::optional<TimeUs> next;
  const auto consider = [&next](TimeUs t) {
    if (!next || t < *next) next = t;
  };
  for (const auto& peer : peers_) {
    if (!peer.connected) continue;
    if (const auto t = peer.connection->nextTimeout()) consider(*t);
    if (peer.unreachableSince) consider(*peer.unreachableSince + unreachableGraceUs());
  }
  if (!delayed_.empty()) consider(delayed_.top().dueUs);
  if (linger_) {
    consider(linger_->lastAckRepeat ? *linger_->lastAckRepeat + kAckRepeatUs : 0);
    consider(linger_->start + options_.lingerMaxUs);
    if (allIdle()) consider(linger_->lastHeard + linger_->quiet);
  }
  return next;
}

void Endpoint::close(TimeUs now) {
  for (int p = 0; p < size_; ++p) {
    Peer& peer = peers_[static_cast<size_t>(p)];
    if (!peer.sends.empty() || !peer.receives.empty()) failPeer(p, kClosing);
  }
  handleEvents();
  // An any-source receive not yet bound is on no connection: cut off here, or the linger's
  // completeRequests() would bind it to a message arriving meanwhile and write that into a
  // buffer that may be gone.
  auto anySource = std::move(anySource_);
  anySource_.clear();
  for (auto& r : anySource) r->failNow(kClosing);
  watchAnySource();
  linger_ = Linger{now, now, std::nullopt, options_.lingerQuietUs, heard()};
}

Endpoint::Heard Endpoint::heard() const {
  Heard h;
  for (const auto& peer : peers_) {
    // A failed connection (close() fails those with requests pending) drops what its peer
    // sends and acknowledges nothing: hearing from that peer is no reason to stay. Counting
    // it kept both ends of an abandoned send for the whole linger cap, each hearing the other.
    if (peer.connection->failed()) continue;
    const Stats s = peer.connection->stats();
    h.heard += s.datagramsReceived - s.ackPacketsReceived - s.closePacketsReceived;
    h.duplicates += s.duplicatePackets + s.duplicateFragments + s.dropped(DropReason::kAfterGap);
  }
  return h;
}

bool Endpoint::allIdle() const {
  for (const auto& peer : peers_) {
    if (peer.connected && !peer.connection->failed() && !peer.connection->idle()) return false;
  }
  return true;
}

bool Endpoint::allClosedAndSettled() const {
  for (const auto& peer : peers_) {
    if (!peer.connected || peer.connection->failed()) continue;
    const PeerConnection& c = *peer.connection;
    if (!c.peerClosed() || !c.sendSettled() || !c.closeSent()) return false;
  }
  return true;
}

bool Endpoint::lingerDone(TimeUs now) {
  if (!linger_) return false;
  // Every peer has closed and needs nothing more from us (its CLOSE), we need nothing more
  // from it, and it has been told so (our CLOSE, sent at least once): nobody is left for the
  // linger to answer. A peer whose copy of our CLOSE was lost still ends: it lingers the
  // quiet time as before, or sooner, when its repeats meet our closed port.
  if (allClosedAndSettled()) return true;
  Linger& l = *linger_;
  const Heard h = heard();
  // Growth only: a connection that fails leaves the sums (heard()), which is no news.
  if (h.heard > l.seen.heard) l.lastHeard = now;
  // Once a peer has retransmitted something we already had (our ACK was lost), or something
  // go-back-N made us discard, its timer may back off up to rto_max: stay until it has been
  // quiet that long.
  if (h.duplicates > l.seen.duplicates) l.quiet = std::max(l.quiet, options_.config.rtoMaxUs);
  l.seen = h;
  if (now - l.start >= options_.lingerMaxUs) return true;
  return allIdle() && now - l.lastHeard >= l.quiet;
}

Stats Endpoint::peerStats(int peer) const {
  const Peer& p = peers_.at(static_cast<size_t>(peer));
  Stats s = p.connection->stats();
  if (p.opener) {
    // Dropped before the connection saw them: added here, so that every datagram received
    // is still accepted or counted under one drop reason.
    const uint64_t failed = p.opener->authFailed(), replayed = p.opener->replayed();
    s.droppedBy[static_cast<size_t>(DropReason::kAuthFailed)] += failed;
    s.droppedBy[static_cast<size_t>(DropReason::kReplayed)] += replayed;
    s.datagramsDropped += failed + replayed;
    s.datagramsReceived += failed + replayed;
    s.bytesReceived += p.authDroppedBytes;
  }
  return s;
}

}  // namespace ucxb::udp
