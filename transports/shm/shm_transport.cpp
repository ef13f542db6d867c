#include "transports/shm/shm_transport.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "transports/entropy.h"
#include "transports/shm/inbox.h"
#include "transports/shm/peer_process.h"

namespace ucxb::shm {

namespace {

// What precedes every message in a ring. `bytes` carries two flags in its top bits.
struct WireHeader {
  uint64_t tag;
  uint64_t bytes;
};
constexpr size_t kHeaderBytes = sizeof(WireHeader);
// A header with this bit set in `bytes` is no message: it tells the sender that the receiver
// matched its message number `tag` (counted per sender from 0), which completes a send longer
// than the eager size (ShmTransport::eagerBytes_, the ring's size). No message is 2^62 bytes.
constexpr uint64_t kMatchedFlag = uint64_t{1} << 63;
// A message sent by reference: the header is followed by a RendezvousBody instead of the
// payload, and the receiver reads the payload out of the sender's memory (process_vm_readv,
// one copy instead of two through the ring) before it tells the sender it matched it. Only a
// message longer than the eager size, where the receiver may read the sender's memory.
constexpr uint64_t kByReference = uint64_t{1} << 62;
constexpr uint64_t kLengthBits = kByReference - 1;
// RingControl::abandoned: why the producer is done with this consumer.
constexpr uint32_t kCutOff = 1;  // abortPeer(): it gave up on a message it had begun to send
constexpr uint32_t kClosed = 2;  // its transport was destroyed (the group, on that rank)
// pushSends(): its ring in the consumer's inbox could not be populated (/dev/shm full), so
// nothing more of it can reach the consumer, which would otherwise wait out the op's timeout.
constexpr uint32_t kNoRoom = 3;

// How often a busy rank looks at its peers' pidfds; a sleeping one is woken by them.
constexpr auto kPeerCheckInterval = std::chrono::milliseconds(20);
// How long the destructor keeps streaming sends that are not in a ring yet, as ucx flushes
// its endpoints: a peer that exited cannot take them.
constexpr auto kCloseFlush = std::chrono::milliseconds(500);

// Why an any-source receive failed: it names both, as over ucx ("receive from any rank
// failed: connection to rank 1 failed: ..."), so that the op's error says it was waiting on
// any rank and which one failed it.
std::string anySourceFailure(const std::string& why) {
  return "receive from any rank failed: " + why;
}

// Whether this kernel has MADV_POPULATE_WRITE (Linux 5.14): asked once per process, of a page
// of its own.
bool sendersCanPopulate() {
  static const bool ok = [] {
    const size_t page = 4096;
    void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    const bool works = ::madvise(p, page, MADV_POPULATE_WRITE) == 0;
    ::munmap(p, page);
    return works;
  }();
  return ok;
}

}  // namespace

class ShmTransport::ShmRequest final : public Request {
 public:
  ShmRequest(ShmTransport* owner, bool isSend, int peer, size_t bytes)
      : Request(isSend, peer, bytes), owner_(owner) {}

  void cancel() override {
    if (pending() && owner_ != nullptr) owner_->cancelRequest(*this);
  }

  int boundPeer() const override { return matchedFrom_ >= 0 ? matchedFrom_ : peer(); }
  void succeed(size_t bytes, Tag tag) { complete(bytes, tag); }
  void failWith(std::string why) { fail(std::move(why)); }
  void failTooLong(std::string why) { failTruncated(std::move(why)); }

  ShmTransport* owner_;
  Tag tag_ = 0;
  Tag mask_ = 0;
  // send: the caller's bytes to stream.
  const uint8_t* source_ = nullptr;
  bool headerSent_ = false;
  size_t written_ = 0;
  uint64_t seq_ = 0;      // its number among the messages to its peer, once its header is out
  bool matched_ = false;  // the receiver took it (kMatchedFlag) before its last byte was out
  // What the header's `bytes` says (the length, with kByReference where it goes so), and for a
  // send by reference the body streamed in place of the payload.
  uint64_t wireBytes_ = 0;
  RendezvousBody body_{};
  // recv: where the message goes.
  uint8_t* dest_ = nullptr;
  // recv: the peer whose message it has begun to take (matched); -1 before. From then on it
  // cannot be withdrawn (cancelRequest).
  int matchedFrom_ = -1;
  // recv of a message longer than the eager size: its match notice is queued, not yet in the
  // ring; and once the whole message is in dest_ (then finishReceive left it pending), what it
  // completes with when the notice is out (noticeWritten).
  bool awaitingNotice_ = false;
  bool whole_ = false;
  Tag wholeTag_ = 0;
  size_t wholeBytes_ = 0;
  // Settled by the next progress() with this reason (a cancel, a failed peer at posting).
  std::string deferredFailure_;
  std::weak_ptr<ShmRequest> self_;

  bool byReference() const { return (wireBytes_ & kByReference) != 0; }
  // The bytes that follow the header in the ring, and the next of them to write.
  size_t streamBytes() const {
    return byReference() ? sizeof(RendezvousBody) : postedBytes();
  }
  const uint8_t* next() const {
    return byReference() ? reinterpret_cast<const uint8_t*>(&body_) + written_
                         : source_ + written_;
  }
};

bool ShmTransport::available() {
  static const bool ok = [] {
    const int fd = pidfdOpen(::getpid());
    if (fd < 0) return false;
    ::close(fd);
    return true;
  }();
  return ok;
}

ShmTransport::ShmTransport(int rank, int size)
    : rank_(rank), size_(size), host_(hostIdentity()), pidNamespace_(currentOwner().pidNamespace),
      eagerBytes_(ringBytesFor(size)), creatorPid_(::getpid()) {
  if (!available()) {
    throw TransportError("the shm transport needs pidfd_open (Linux 5.3 or later) to watch its "
                         "peers: " + std::string(std::strerror(errno)));
  }
  const uint64_t nonce = randomWord();
  const SegmentOwner owner = currentOwner();
  // The rings' pages are left to their senders where the kernel lets them populate pages with
  // an error instead of a SIGBUS (InboxHeader::sendersPopulate); /dev/shm must still have
  // room for every rank's whole inbox now (SharedSegment::create checks).
  const bool sendersPopulate = sendersCanPopulate();
  inbox_ = SharedSegment::create(segmentName(owner, nonce, rank), InboxLayout::bytes(size),
                                 sendersPopulate ? InboxLayout::ringsOffset(size) : SIZE_MAX,
                                 static_cast<size_t>(size));
  InboxHeader* header = InboxLayout::header(inbox_.data());
  header->magic = kInboxMagic;
  header->ranks = static_cast<uint32_t>(size);
  header->ringBytes = static_cast<uint32_t>(ringBytesFor(size));
  header->sendersPopulate = sendersPopulate ? 1 : 0;
  if (size == 1) inbox_.unlink();
  const std::string bell = "ucxb-" + std::to_string(::getpid()) + "-" + std::to_string(nonce) +
                           "-r" + std::to_string(rank);
  doorbell_ = std::make_unique<Doorbell>(bell);
  epollFd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epollFd_ < 0) throw TransportError(std::string("epoll_create1: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = doorbell_->fd();
  if (::epoll_ctl(epollFd_, EPOLL_CTL_ADD, doorbell_->fd(), &ev) != 0) {
    const int err = errno;
    ::close(epollFd_);
    throw TransportError(std::string("epoll_ctl(doorbell): ") + std::strerror(err));
  }
  peers_.resize(static_cast<size_t>(size));
  address_ = packAddress({host_, pidNamespace_, ::getpid(), size, inbox_.name(), bell,
                          reinterpret_cast<uint64_t>(&kReadableProbe), ownPidfdInode()});
}

ShmTransport::~ShmTransport() {
  closing_ = "the process group was shut down (rank " + std::to_string(rank_) + ")";
  // A forked child's copy (a DataLoader worker that destroys it): the rings it would write,
  // the `abandoned` flags in the peers' inboxes and the epoll set are its parent's, which
  // goes on using them. It only lets its own requests and descriptors go.
  const bool forked = ::getpid() != creatorPid_;
  // Streams what is not in a ring yet while its peers take it, for a bounded time.
  const auto deadline = std::chrono::steady_clock::now() + kCloseFlush;
  // Sends by reference wait for the peer's answer (it may be reading their buffers now).
  for (; !forked;) {
    bool queued = false;
    for (int p = 0; p < size_; ++p) {
      Peer& peer = peers_[static_cast<size_t>(p)];
      if (p == rank_ || peer.pid == 0 || !peer.error.empty()) continue;
      // A peer that left or cut this rank off takes nothing more: no wait for it.
      if (const uint32_t why = peer.in.control().abandoned.load(std::memory_order_seq_cst);
          why != 0) {
        takeAbandonment(p, why);
        continue;
      }
      if (!peer.sends.empty() || !peer.acks.empty()) pushSends(p);
      // A send by reference waits for the peer's match: it may be reading the buffer now.
      const bool reading = std::any_of(peer.unmatched.begin(), peer.unmatched.end(),
                                       [](const auto& r) { return r->byReference(); });
      if (reading && peer.in.readable() != 0) readMessages(p);
      queued = queued || !peer.sends.empty() || !peer.acks.empty() || reading;
    }
    if (!queued || std::chrono::steady_clock::now() >= deadline) break;
    checkPeers();
    pollfd pfd{epollFd_, POLLIN, 0};
    ::poll(&pfd, 1, 1);
    doorbell_->drain();
  }
  // Tells each peer that this rank is gone from the group, as a closed ucx endpoint does:
  // what it sent is taken, the rest fails at once instead of at the op's timeout.
  for (int q = 0; q < size_; ++q) {
    Peer& peer = peers_[static_cast<size_t>(q)];
    if (forked || q == rank_ || !peer.out.valid() || !peer.error.empty()) continue;
    peer.out.control().abandoned.store(kClosed, std::memory_order_seq_cst);
    // The match notices it wrote before it could see that mark: it takes those messages, so
    // their sends succeed (abortPeer says why).
    if (peer.in.readable() != 0) readMessages(q);
    doorbell_->ring(peer.doorbell);
  }
  // Those seq_cst stores come before the failures below release any buffer a peer may read
  // by reference (readByReference's load pairs with them).
  std::vector<std::shared_ptr<ShmRequest>> left;
  for (auto& peer : peers_) {
    for (auto& r : peer.sends) left.push_back(r);
    for (auto& r : peer.unmatched) left.push_back(r);
    for (auto& n : peer.acks) left.push_back(n.receive);
    if (peer.inbound.target) left.push_back(peer.inbound.target);
    if (peer.inbound.arrival && peer.inbound.arrival->claimedBy) {
      left.push_back(peer.inbound.arrival->claimedBy);
    }
  }
  left.insert(left.end(), posted_.begin(), posted_.end());
  left.insert(left.end(), settling_.begin(), settling_.end());
  for (auto& r : left) {
    r->owner_ = nullptr;
    if (r->pending()) r->failWith(r->deferredFailure_.empty() ? closing_ : r->deferredFailure_);
  }
  for (auto& peer : peers_) {
    if (peer.pidfd >= 0) ::close(peer.pidfd);
  }
  if (epollFd_ >= 0) ::close(epollFd_);
}

void ShmTransport::connect(int peer, const std::vector<uint8_t>& address) {
  ShmAddress a;
  if (!unpackAddress(address, a) || a.ranks != size_) {
    throw TransportError("the address of " + peerLabel(peer) + " is not a shm transport's of a " +
                         std::to_string(size_) + "-rank group", peer);
  }
  Peer& p = peers_.at(static_cast<size_t>(peer));
  if (p.pid != 0) return;
  p.pid = a.pid;
  p.in = InboxLayout::ring(inbox_.data(), size_, peer);
  if (peer == rank_) return;  // messages to itself do not take a ring
  auto inbox = SharedSegment::openIfPresent(a.segment, InboxLayout::bytes(size_));
  if (!inbox) {
    // Its name went before this rank mapped it, which only its creator's destructor (or the
    // sweep of a dead rank's segments) does: the peer destroyed its group as soon as its own
    // creation ended, or died. It takes no part, as a peer that leaves later does; the
    // creation goes on (a peer's failure is its ops' to report, naming it, not an shm_open
    // error of the whole creation).
    failPeer(peer, peerLabel(peer) + " (pid " + std::to_string(a.pid) +
                       ") left the group before this rank connected to it");
    return;
  }
  p.inbox = std::move(*inbox);
  InboxHeader* header = InboxLayout::header(p.inbox.data());
  if (header->magic != kInboxMagic || header->ranks != static_cast<uint32_t>(size_) ||
      header->ringBytes != ringBytesFor(size_)) {
    throw TransportError("the shared-memory inbox of " + peerLabel(peer) + " (" + a.segment +
                             ") has another layout",
                         peer);
  }
  // The last peer to map it removes its name (inbox.h).
  if (header->mapped.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(size_ - 1)) {
    p.inbox.removeName();
  }
  p.out = InboxLayout::ring(p.inbox.data(), size_, rank_);
  p.outBytes = InboxLayout::ringBytes(p.inbox.data(), size_, rank_);
  p.outPopulated = header->sendersPopulate != 0 ? 0 : ringBytesFor(size_);
  // Whether this rank may read the peer's memory (ptrace rules, a container's seccomp):
  // tried once, told to the peer through its ring in this rank's inbox.
  uint64_t probe = 0;
  if (readPeerMemory(a.pid, a.probe, &probe, sizeof probe).empty() && probe == kReadableProbe) {
    p.in.control().consumerReadsProducer.store(1, std::memory_order_release);
  }
  p.sleeping = InboxLayout::sleeping(p.inbox.data());
  p.doorbell = Doorbell::addressOf(a.doorbell);
  p.pidfd = pidfdOpen(a.pid);
  if (p.pidfd < 0 && errno == ESRCH) {
    // Gone before this rank could watch it (killed during the group's creation): failed as a
    // peer that dies later is, so that the creation's own watch names it as over ucx, whose
    // connect() reaches no peer ("died during this creation"), or the first op does.
    failPeer(peer, peerLabel(peer) + " (pid " + std::to_string(a.pid) + ") exited");
    return;
  }
  if (p.pidfd < 0) {
    throw TransportError("pidfd_open of " + peerLabel(peer) + " (pid " + std::to_string(a.pid) +
                             "): " + std::strerror(errno),
                         peer);
  }
  if (const std::string other = wroteAddress(p.pidfd, a, peer); !other.empty()) {
    // Its writer exited before this rank could watch it, as ESRCH above, but its pid went to
    // another process: the pidfd watches that one, so the peer is failed here instead.
    ::close(p.pidfd);
    p.pidfd = -1;
    failPeer(peer, peerLabel(peer) + " (pid " + std::to_string(a.pid) + ") exited (" + other + ")");
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = p.pidfd;
  if (::epoll_ctl(epollFd_, EPOLL_CTL_ADD, p.pidfd, &ev) != 0) {
    throw TransportError(
        "epoll_ctl(pidfd of " + peerLabel(peer) + "): " + std::strerror(errno), peer);
  }
}

bool ShmTransport::reachesAll(const std::vector<std::vector<uint8_t>>& addresses) const {
  for (const auto& bytes : addresses) {
    ShmAddress a;
    if (!unpackAddress(bytes, a) || a.host != host_ || a.pidNamespace != pidNamespace_) {
      return false;
    }
  }
  return true;
}

std::shared_ptr<ShmTransport::ShmRequest> ShmTransport::makeRequest(bool isSend, int peer,
                                                                    size_t bytes) {
  auto req = std::make_shared<ShmRequest>(this, isSend, peer, bytes);
  req->self_ = req;
  return req;
}

RequestPtr ShmTransport::send(int peer, Tag tag, const void* data, size_t bytes,
                              MemoryType mem) {
  if (!takesHostPaths(mem)) {
    throw TransportError("the shm transport carries host memory only (send to " + peerLabel(peer) +
                             ")",
                         peer);
  }
  auto req = makeRequest(true, peer, bytes);
  req->tag_ = tag;
  req->source_ = static_cast<const uint8_t*>(data);
  if (peer == rank_) {
    auto a = newArrival(rank_, tag, bytes, 0);  // no sequence: self-sends take no ring
    a->data.reset(new uint8_t[bytes ? bytes : 1]);
    if (bytes) std::memcpy(a->data.get(), data, bytes);
    a->got = bytes;
    if (auto r = matchPosted(rank_, tag)) {
      deliver(a, r);
    } else {
      arrivals_.push_back(std::move(a));
    }
    req->succeed(bytes, tag);
    return req;
  }
  Peer& p = peers_.at(static_cast<size_t>(peer));
  if (!p.error.empty() || p.pid == 0) {
    req->deferredFailure_ =
        p.pid == 0 ? "send to " + peerLabel(peer) + ", which was never connected" : p.error;
    settling_.push_back(req);
    return req;
  }
  req->wireBytes_ = bytes;
  if (bytes > eagerBytes_ &&
      p.out.control().consumerReadsProducer.load(std::memory_order_acquire) != 0) {
    req->wireBytes_ = bytes | kByReference;
    req->body_ = {reinterpret_cast<uint64_t>(data), 0};
  }
  p.sends.push_back(req);
  if (p.sends.size() == 1) pushSends(peer);
  return req;
}

RequestPtr ShmTransport::recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                              MemoryType mem) {
  if (!takesHostPaths(mem)) {
    throw TransportError("the shm transport carries host memory only (receive from " +
                             peerLabel(peer) + ")",
                         peer);
  }
  auto req = makeRequest(false, peer, bytes);
  req->tag_ = tag;
  req->mask_ = mask;
  req->dest_ = static_cast<uint8_t*>(data);
  for (auto it = arrivals_.begin(); it != arrivals_.end(); ++it) {
    if (((*it)->tag & mask) == (tag & mask)) {
      // Its sender gave it up (abortPeer, or it left) before this rank's progress() saw that:
      // never complete for the sender, so not taken (p2p_withdraw.hpp); takeAbandonment()
      // drops it in the next progress() and fails this receive if it waits on that peer.
      if (givenUp(**it)) continue;
      auto a = *it;
      arrivals_.erase(it);
      // One sent by reference is matched once it is read (readByReference).
      if (!a->byReference) matched(req, a->source, a->seq, a->bytes);
      deliver(a, req);
      return req;
    }
  }
  if (peer != kAnySource && !peers_.at(static_cast<size_t>(peer)).error.empty()) {
    req->deferredFailure_ = peers_[peer].error;
    settling_.push_back(req);
  } else if (peer == kAnySource && anyPeerFailed_) {
    req->deferredFailure_ = anySourceFailure(firstFailure_);
    settling_.push_back(req);
  } else {
    posted_.push_back(req);
  }
  return req;
}

void ShmTransport::finishReceive(const std::shared_ptr<ShmRequest>& req, int source, Tag tag,
                                 size_t bytes) {
  if (!req->pending()) return;
  if (bytes > req->postedBytes()) {
    req->failTooLong("the message from " + peerLabel(source) + " (" + std::to_string(bytes) +
                     " bytes) is longer than the " + std::to_string(req->postedBytes()) +
                     " bytes posted to receive it");
  } else if (req->awaitingNotice_) {
    // Its sender has not been told yet: done once it can be (noticeWritten).
    req->whole_ = true;
    req->wholeTag_ = tag;
    req->wholeBytes_ = bytes;
  } else {
    req->succeed(bytes, tag);
  }
}

void ShmTransport::deliver(const std::shared_ptr<Arrival>& a,
                           const std::shared_ptr<ShmRequest>& req) {
  if (!req->pending()) return;  // its sender gave the message up (noticeWritten)
  req->matchedFrom_ = a->source;
  if (a->byReference) {
    readByReference(req, a->source, a->tag, a->bytes, a->body, a->seq);
    return;
  }
  if (a->got < a->bytes) {
    a->claimedBy = req;  // endMessage() finishes it
    return;
  }
  const size_t n = std::min(a->bytes, req->postedBytes());
  if (n) std::memcpy(req->dest_, a->data.get(), n);
  finishReceive(req, a->source, a->tag, a->bytes);
}

std::shared_ptr<ShmTransport::ShmRequest> ShmTransport::matchPosted(int /*source*/, Tag tag) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if ((tag & (*it)->mask_) == ((*it)->tag_ & (*it)->mask_)) {
      auto r = *it;
      posted_.erase(it);
      return r;
    }
  }
  return nullptr;
}

size_t ShmTransport::roomNeeded(const Peer& p) {
  return p.sends.empty() || !p.sends.front()->headerSent_ ? kHeaderBytes : size_t{1};
}

bool ShmTransport::pushSends(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (p.outPopulated < eagerBytes_) {
    // The ring's first pass: its pages are populated before anything is written into them.
    size_t pending = p.acks.size() * kHeaderBytes;
    for (const auto& r : p.sends) {
      pending += (r->headerSent_ ? 0 : kHeaderBytes) + r->streamBytes() - r->written_;
    }
    if (std::string why = populateOut(p, pending); !why.empty()) {
      cutOff(peer, kNoRoom, why);
      return false;
    }
  }
  bool any = false;
  for (;;) {
    const bool between = p.sends.empty() || !p.sends.front()->headerSent_;
    bool full = false;
    if (between) {
      any = writeAcks(peer) || any;
      full = !p.acks.empty();
      if (!full && p.sends.empty()) break;
    }
    if (!full) {
      auto& r = p.sends.front();
      if (!r->headerSent_) {
        if (p.out.writable() < kHeaderBytes) {
          full = true;
        } else {
          const WireHeader h{r->tag_, r->wireBytes_};
          p.out.write(&h, kHeaderBytes);
          r->headerSent_ = true;
          r->seq_ = p.sentMessages++;
          any = true;
        }
      }
      if (!full) {
        const size_t left = r->streamBytes() - r->written_;
        const size_t n = left ? p.out.write(r->next(), left) : 0;
        r->written_ += n;
        any = any || n > 0;
        if (r->written_ == r->streamBytes()) {
          auto done = std::move(p.sends.front());
          p.sends.pop_front();
          sent(p, done);
          continue;
        }
        full = true;
      }
    }
    // Full: ask the receiver to ring once it frees room, then look again, since it may have
    // freed room before it could see the request (seq_cst: this store and the load of
    // `head` in writable() pair with the receiver's store of `head` and load of the flag).
    const size_t need = roomNeeded(p);
    p.out.control().producerWaiting.store(1, std::memory_order_seq_cst);
    if (p.out.writable() < need) break;
    p.out.control().producerWaiting.store(0, std::memory_order_relaxed);
  }
  if (any) wake(p);
  return any;
}

std::string ShmTransport::populateOut(Peer& p, size_t bytes) {
  if (p.outPopulated >= eagerBytes_) return {};
  // The producer's own position: until it passes the ring's size, positions are offsets.
  const uint64_t tail = p.out.control().tail.load(std::memory_order_relaxed);
  if (tail + bytes <= p.outPopulated) return {};
  const size_t upTo = static_cast<size_t>(
      std::min<uint64_t>(eagerBytes_, (tail + bytes + kPopulateStep - 1) / kPopulateStep *
                                          kPopulateStep));
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  uint8_t* const inbox = p.inbox.data();
  const PopulateSpan span =
      populateSpan(static_cast<size_t>(p.outBytes - inbox), p.outPopulated, upTo, page);
  while (::madvise(inbox + span.offset, span.length, MADV_POPULATE_WRITE) != 0) {
    if (errno == EINTR) continue;
    return "cannot populate the shared-memory ring to " +
           peerLabel(static_cast<int>(&p - peers_.data())) +
           " (" + std::to_string(upTo - p.outPopulated) + " bytes at offset " +
           std::to_string(p.outPopulated) + " of its inbox's ring; is /dev/shm full?): " +
           std::strerror(errno);
  }
  p.outPopulated = upTo;
  return {};
}

bool ShmTransport::writeAcks(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  // Match notices go between messages, ahead of the next one.
  size_t written = 0;
  while (written < p.acks.size() && p.out.writable() >= kHeaderBytes) {
    const WireHeader h{p.acks[written].seq, kMatchedFlag};
    p.out.write(&h, kHeaderBytes);
    ++written;
  }
  if (written == 0) return false;
  // Whether the sender gave up, read after the notices are in the ring (write()'s seq_cst
  // store of `tail`), as its abortPeer() and destructor store the mark (seq_cst) before they
  // read the ring (seq_cst load of `tail`): if this reads no mark, the sender's read comes
  // after these notices and takes them, so their sends succeed; if it reads one, the sender
  // may have failed them, and their receives fail (noticeWritten).
  const uint32_t abandoned = p.in.control().abandoned.load(std::memory_order_seq_cst);
  for (size_t i = 0; i < written; ++i) {
    auto receive = std::move(p.acks.front().receive);
    p.acks.pop_front();
    noticeWritten(peer, receive, abandoned);
  }
  return true;
}

void ShmTransport::noticeWritten(int source, const std::shared_ptr<ShmRequest>& req,
                                 uint32_t abandoned) {
  req->awaitingNotice_ = false;
  // Settled, or cancelled (settles in the next progress()).
  if (!req->pending() || !req->deferredFailure_.empty()) return;
  if (abandoned != 0) {
    // The rest of its message, if any, is dropped (readMessages, endMessage: not pending).
    req->failWith(abandonmentReason(source, abandoned));
  } else if (req->whole_) {
    req->succeed(req->wholeBytes_, req->wholeTag_);
  }
}

void ShmTransport::wake(Peer& p) {
  // With the seq_cst store of `tail` before it, pairs with arm()'s store of `sleeping` and
  // load of `tail`: either the receiver sees the bytes, or this sees it asleep. The sender
  // that finds the word set clears it and rings: one ring per arm(), which stays in the
  // doorbell until the receiver's next arm() (the load first: most sends find it clear).
  if (p.sleeping->load(std::memory_order_seq_cst) != 0 &&
      p.sleeping->exchange(0, std::memory_order_seq_cst) != 0) {
    doorbell_->ring(p.doorbell);
  }
}

void ShmTransport::sent(Peer& p, const std::shared_ptr<ShmRequest>& req) {
  if (!req->pending()) return;
  if (req->postedBytes() <= eagerBytes_ || req->matched_) {
    req->succeed(req->postedBytes(), req->tag_);
  } else {
    p.unmatched.push_back(req);
  }
}

void ShmTransport::matched(const std::shared_ptr<ShmRequest>& req, int source, uint64_t seq,
                           size_t bytes) {
  req->matchedFrom_ = source;
  if (source == rank_ || bytes <= eagerBytes_) return;
  Peer& p = peers_.at(static_cast<size_t>(source));
  // A failed peer whose long messages are still held exited (dropUntaken drops them
  // otherwise): nobody is left to tell, or to think the send failed.
  if (!p.error.empty()) return;
  req->awaitingNotice_ = true;
  p.acks.push_back({seq, req});
  // Out now where no message of this rank's is half out (else after it, by progress() or the
  // destructor): the receive completes only then, so that the sender learns of every message
  // a receive took before it could give it up (writeAcks).
  // Where the ring's pages for it cannot be populated now, the notice stays queued:
  // pushSends fails the peer, naming why.
  if ((p.sends.empty() || !p.sends.front()->headerSent_) &&
      populateOut(p, p.acks.size() * kHeaderBytes).empty() && writeAcks(source)) {
    wake(p);
  }
}

void ShmTransport::takeMatch(int peer, uint64_t seq) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  for (auto& r : p.sends) {
    if (r->headerSent_ && r->seq_ == seq) {
      r->matched_ = true;  // sent() completes it once its last byte is out
      return;
    }
  }
  for (auto it = p.unmatched.begin(); it != p.unmatched.end(); ++it) {
    if ((*it)->seq_ != seq) continue;
    auto r = std::move(*it);
    p.unmatched.erase(it);
    if (r->pending()) r->succeed(r->postedBytes(), r->tag_);
    return;
  }
}

bool ShmTransport::givenUp(const Arrival& a) const {
  // Seq_cst, as readByReference()'s load: the sender stores it before it fails the send.
  return a.source != rank_ && a.bytes > eagerBytes_ &&
         peers_[static_cast<size_t>(a.source)].in.control().abandoned.load(
             std::memory_order_seq_cst) != 0;
}

std::shared_ptr<ShmTransport::Arrival> ShmTransport::newArrival(int source, Tag tag,
                                                                 size_t bytes, uint64_t seq) {
  auto a = std::make_shared<Arrival>();
  a->seq = seq;
  a->source = source;
  a->tag = tag;
  a->bytes = bytes;
  return a;
}

void ShmTransport::startMessage(int peer, Tag tag, size_t bytes) {
  const uint64_t seq = peers_[static_cast<size_t>(peer)].receivedMessages++;
  Inbound& s = peers_[static_cast<size_t>(peer)].inbound;
  s.inMessage = true;
  s.tag = tag;
  s.bytes = bytes;
  s.done = 0;
  s.target.reset();
  s.arrival.reset();
  if (!peers_[static_cast<size_t>(peer)].error.empty()) return;  // aborted: dropped
  s.target = matchPosted(peer, tag);
  if (s.target) {
    matched(s.target, peer, seq, bytes);
    return;
  }
  auto a = newArrival(peer, tag, bytes, seq);
  a->data.reset(new uint8_t[bytes ? bytes : 1]);
  s.arrival = a;
  arrivals_.push_back(std::move(a));
}

void ShmTransport::endMessage(int peer) {
  Inbound& s = peers_[static_cast<size_t>(peer)].inbound;
  if (s.target) {
    finishReceive(s.target, peer, s.tag, s.bytes);
  } else if (s.arrival && s.arrival->claimedBy) {
    auto r = std::move(s.arrival->claimedBy);
    deliver(s.arrival, r);
  }
  s = Inbound{};
}

bool ShmTransport::readMessages(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  Inbound& s = p.inbound;
  bool any = false;
  for (;;) {
    size_t avail = p.in.readable();
    if (!s.inMessage) {
      if (avail < kHeaderBytes) break;
      WireHeader h{};
      p.in.peek(&h, kHeaderBytes);
      if ((h.bytes & kMatchedFlag) == 0 && (h.bytes & kByReference) != 0) {
        if (avail < kHeaderBytes + sizeof(RendezvousBody)) break;
        RendezvousBody body{};
        p.in.take(nullptr, kHeaderBytes);
        p.in.take(&body, sizeof body);
        any = true;
        startByReference(peer, h.tag, static_cast<size_t>(h.bytes & kLengthBits), body);
        continue;
      }
      p.in.take(nullptr, kHeaderBytes);
      avail -= kHeaderBytes;
      any = true;
      if ((h.bytes & kMatchedFlag) != 0) {
        takeMatch(peer, h.tag);
        continue;
      }
      startMessage(peer, h.tag, h.bytes);
      if (h.bytes == 0) {
        endMessage(peer);
        continue;
      }
    }
    if (avail == 0) break;
    const size_t n = std::min(avail, s.bytes - s.done);
    if (s.target && s.target->pending()) {
      const size_t cap = s.target->postedBytes();
      const size_t fit = s.done < cap ? std::min(n, cap - s.done) : 0;
      p.in.take(fit ? s.target->dest_ + s.done : nullptr, fit);
      p.in.take(nullptr, n - fit);
    } else if (s.arrival) {
      p.in.take(s.arrival->data.get() + s.done, n);
      s.arrival->got += n;
    } else {
      p.in.take(nullptr, n);
    }
    s.done += n;
    any = true;
    if (s.done == s.bytes) endMessage(peer);
  }
  if (p.in.release()) {
    // With release()'s seq_cst store of `head`, pairs with pushSends(): either the sender
    // sees the room, or this sees it waiting.
    if (p.in.control().producerWaiting.load(std::memory_order_seq_cst) != 0) {
      p.in.control().producerWaiting.store(0, std::memory_order_relaxed);
      doorbell_->ring(p.doorbell);
    }
  }
  return any;
}

bool ShmTransport::progress() {
  bool any = false;
  const auto now = std::chrono::steady_clock::now();
  // The `sleeping` word and the doorbell's rings are left as they are: the thread that armed
  // may still sleep on eventFd() while another drives the transport (an inline op's caller,
  // csrc/engine/progress_engine.h), and it must wake for what arrives after this call, as a
  // ucx worker's fd, once armed, turns readable at its next event whoever progresses it.
  // arm() takes the rings.
  if (armed_) {
    armed_ = false;
    nextPeerCheck_ = now;  // a pidfd may be what woke it
  }
  if (now >= nextPeerCheck_) {
    // A peer that exited fails its requests there: progress, which an owner that sleeps when
    // progress() returns false must be told of (the pidfd that woke it has left the sleep
    // set, so it would sleep on until its own timeout).
    any = checkPeers();
    nextPeerCheck_ = now + kPeerCheckInterval;
  }
  if (!settling_.empty()) {
    auto settling = std::move(settling_);
    settling_.clear();
    for (auto& r : settling) {
      if (r->pending()) r->failWith(r->deferredFailure_);
    }
    any = true;
  }
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    Peer& p = peers_[static_cast<size_t>(q)];
    if (p.pid == 0) continue;
    if (const uint32_t why = p.in.control().abandoned.load(std::memory_order_acquire);
        why != 0 && p.error.empty()) {
      takeAbandonment(q, why);
      any = true;
    }
    if (!p.sends.empty() || !p.acks.empty()) any = pushSends(q) || any;
    if (p.in.readable() != 0) any = readMessages(q) || any;
  }
  return any;
}

bool ShmTransport::arm() {
  if (!settling_.empty()) return false;
  // The rings taken here are those of events before this call; each of them is looked at
  // below (bytes, room, an abandoned ring), so none is lost, and every ring from here on
  // stays until the next arm(), whoever calls progress() meanwhile.
  doorbell_->drain();
  // Set until a sender rings (wake()); left set where this returns false: a thread that armed
  // before may still sleep on the doorbell (progress()), and a ring too many costs a wake-up.
  InboxLayout::sleeping(inbox_.data())->store(1, std::memory_order_seq_cst);
  for (int q = 0; q < size_; ++q) {
    if (q == rank_ || peers_[static_cast<size_t>(q)].pid == 0) continue;
    const Peer& p = peers_[static_cast<size_t>(q)];
    // Bytes (pairs with wake()), room for a send (with pushSends()), or a peer that gave up
    // on this rank and was not failed for it yet (abortPeer(), the destructor: they store
    // the word before they ring).
    if (p.in.readable() != 0 ||
        ((!p.sends.empty() || !p.acks.empty()) && p.out.writable() >= roomNeeded(p)) ||
        (p.error.empty() &&
         p.in.control().abandoned.load(std::memory_order_seq_cst) != 0)) {
      return false;
    }
  }
  armed_ = true;
  return true;
}

int ShmTransport::probe(Tag tag, Tag mask) {
  for (const auto& a : arrivals_) {
    if ((a->tag & mask) == (tag & mask)) return a->source;
  }
  return -1;
}

std::string ShmTransport::peerError(int peer) const {
  return peers_.at(static_cast<size_t>(peer)).error;
}

bool ShmTransport::checkPeers() {
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (int q = 0; q < size_; ++q) {
    const Peer& p = peers_[static_cast<size_t>(q)];
    if (p.pidfd >= 0 && p.error.empty()) {
      fds.push_back({p.pidfd, POLLIN, 0});
      who.push_back(q);
    }
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return false;
  bool failed = false;
  for (size_t i = 0; i < fds.size(); ++i) {
    if ((fds[i].revents & POLLIN) == 0) continue;
    const int q = who[i];
    // What it wrote before it exited is in this rank's memory: take it first.
    readMessages(q);
    failPeer(q, peerLabel(q) + " (pid " + std::to_string(peers_[static_cast<size_t>(q)].pid) +
                    ") exited");
    failed = true;
  }
  return failed;
}

void ShmTransport::abortPeer(int peer, const std::string& why) { cutOff(peer, kCutOff, why); }

void ShmTransport::cutOff(int peer, uint32_t mark, const std::string& why) {
  // Tells the peer first: it must not take a message this rank gave up on
  // (p2p_withdraw.hpp), and a send by reference whose buffer failPeer() releases must read
  // as given up to a peer that reads it now (readByReference checks after its read).
  Peer& p = peers_.at(static_cast<size_t>(peer));
  const bool ring = peer != rank_ && p.out.valid();
  if (ring) p.out.control().abandoned.store(mark, std::memory_order_seq_cst);
  // The match notices the peer wrote before it could see the mark: its receives take those
  // messages, so their sends succeed here; it fails a receive whose notice it writes later
  // (writeAcks reads the mark after writing). What else it sent before is taken too, as when
  // it exits.
  if (ring && p.error.empty() && p.in.readable() != 0) readMessages(peer);
  failPeer(peer, why);
  dropUntaken(peer);
  if (ring) doorbell_->ring(p.doorbell);
}

void ShmTransport::takeAbandonment(int peer, uint32_t why) {
  readMessages(peer);  // what it finished sending before stays, as in checkPeers()
  // Its messages longer than eagerBytes_ that no receive took were never complete for it.
  dropUntaken(peer);
  failPeer(peer, abandonmentReason(peer, why));
}

std::string ShmTransport::abandonmentReason(int peer, uint32_t why) {
  if (why == kClosed) return peerLabel(peer) + " left the group (destroyed it)";
  if (why == kNoRoom) {
    return peerLabel(peer) + " could not write into this rank's shared-memory inbox (is " +
           "/dev/shm full?)";
  }
  return peerLabel(peer) + " cut this rank off (it gave up on a message it had begun to send "
                           "here)";
}

void ShmTransport::dropUntaken(int peer) {
  arrivals_.erase(std::remove_if(arrivals_.begin(), arrivals_.end(),
                                 [&](const auto& a) {
                                   return a->source == peer && a->bytes > eagerBytes_ &&
                                          !a->claimedBy;
                                 }),
                  arrivals_.end());
}

void ShmTransport::failPeer(int peer, const std::string& why) {
  Peer& p = peers_.at(static_cast<size_t>(peer));
  if (!p.error.empty()) return;
  p.error = why;
  // Nothing of it is watched any more (checkPeers skips it): its pidfd leaves the sleep set,
  // since once it exits (now, or later after an abort) it stays readable and would wake an
  // idle rank at every arm().
  if (p.pidfd >= 0) ::epoll_ctl(epollFd_, EPOLL_CTL_DEL, p.pidfd, nullptr);
  if (!anyPeerFailed_) {
    anyPeerFailed_ = true;
    firstFailure_ = why;
  }
  // The message it was streaming: the rest is dropped (inMessage stays set, so that a live
  // peer's later bytes are not read as headers).
  Inbound& s = p.inbound;
  if (s.target) {
    if (s.target->pending()) s.target->failWith(why);
    s.target.reset();
  }
  if (s.arrival) {
    auto a = std::move(s.arrival);
    arrivals_.erase(std::remove(arrivals_.begin(), arrivals_.end(), a), arrivals_.end());
    if (a->claimedBy && a->claimedBy->pending()) a->claimedBy->failWith(why);
  }
  // Its messages sent by reference that no receive read yet cannot be read any more: it
  // exited (its pid may name another process by now), or it fails them itself once it sees
  // that this rank cut it off (takeAbandonment) and may reuse their buffers. A later receive
  // then fails with `why` instead of reading them.
  const auto unreadable = [&](const auto& a) { return a->source == peer && a->byReference; };
  arrivals_.erase(std::remove_if(arrivals_.begin(), arrivals_.end(), unreadable),
                  arrivals_.end());
  auto sends = std::move(p.sends);
  p.sends.clear();
  sends.insert(sends.end(), p.unmatched.begin(), p.unmatched.end());
  p.unmatched.clear();
  // Receives whose match notice never went out: the peer cannot learn that they took its
  // messages, and fails (or failed) their sends. A cancelled one settles as cancelled.
  auto notices = std::move(p.acks);
  p.acks.clear();
  for (auto& n : notices) {
    if (n.receive->pending() && n.receive->deferredFailure_.empty()) n.receive->failWith(why);
  }
  for (auto& r : sends) {
    if (r->pending()) r->failWith(why);
  }
  std::vector<std::shared_ptr<ShmRequest>> failing;
  for (auto it = posted_.begin(); it != posted_.end();) {
    if ((*it)->peer() == peer || (*it)->peer() == kAnySource) {
      failing.push_back(*it);
      it = posted_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& r : failing) r->failWith(r->peer() == kAnySource ? anySourceFailure(why) : why);
}

void ShmTransport::startByReference(int peer, Tag tag, size_t bytes, const RendezvousBody& body) {
  const uint64_t seq = peers_[static_cast<size_t>(peer)].receivedMessages++;
  if (!peers_[static_cast<size_t>(peer)].error.empty()) return;  // aborted: dropped
  if (auto r = matchPosted(peer, tag)) {
    readByReference(r, peer, tag, bytes, body, seq);
    return;
  }
  auto a = newArrival(peer, tag, bytes, seq);
  a->got = bytes;
  a->byReference = true;
  a->body = body;
  arrivals_.push_back(std::move(a));
}

void ShmTransport::readByReference(const std::shared_ptr<ShmRequest>& req, int source, Tag tag,
                                   size_t bytes, const RendezvousBody& body, uint64_t seq) {
  Peer& p = peers_[static_cast<size_t>(source)];
  std::string failed =
      readPeerMemory(p.pid, body.address, req->dest_, std::min(bytes, req->postedBytes()));
  // The sender sets `abandoned` before it lets the buffer go (abortPeer, its destructor): if
  // it is still clear after the read, the read preceded any such release (the sender's
  // seq_cst store precedes its free; this load follows the read, a system call).
  if (failed.empty() && p.in.control().abandoned.load(std::memory_order_seq_cst) != 0) {
    failed = "the sender gave the message up while it was read";
  }
  // A sender that exited before the read may have left its pid to another process, whose
  // memory the read then took: its pidfd, which names the process and not the number, says.
  // Its exit is also the reason to give where the read failed for it (ESRCH), in the words
  // the pidfd check uses, which a peer's exit fails everything else with.
  pollfd exited{p.pidfd, POLLIN, 0};
  if (p.pidfd >= 0 && ::poll(&exited, 1, 0) > 0) {
    failed = peerLabel(source) + " (pid " + std::to_string(p.pid) + ") exited";
    if (req->pending()) req->failWith(failed + " before its message was read");
    return;
  }
  if (!failed.empty()) {
    if (req->pending()) {
      req->failWith("the message from " + peerLabel(source) + " (" + std::to_string(bytes) +
                    " bytes) could not be read from its memory: " + failed);
    }
    return;
  }
  matched(req, source, seq, bytes);  // after the read: the sender's buffer is free from here on
  finishReceive(req, source, tag, bytes);
}

void ShmTransport::cancelRequest(ShmRequest& req) {
  const std::string why = std::string(req.isSend() ? "the send to " : "the receive from ") +
                          peerLabel(req.peer()) + " was cancelled";
  if (req.isSend()) {
    // A send whose header is in the ring cannot be taken back: the receiver matches it, and a
    // later receive would take it for another message (ucx cannot take back an announced
    // rendezvous either). It stays pending; its owner then fails the group and cuts the peer
    // off (csrc/p2p_withdraw.hpp, abortPeer). One still queued leaves without a trace.
    if (req.headerSent_) return;
    if (req.peer() != rank_) {
      auto& sends = peers_[static_cast<size_t>(req.peer())].sends;
      sends.erase(std::remove_if(sends.begin(), sends.end(),
                                 [&](const auto& r) { return r.get() == &req; }),
                  sends.end());
    }
  } else {
    // A receive that has begun to take a message (streaming into its buffer, claiming one
    // still arriving, or waiting for its match notice to go out) cannot be taken back either:
    // dropping the rest lost a message whose sender had been told it was received, and a
    // retried receive took the next one in its place (until 2026-11-28). It stays pending;
    // its owner fails the group and cuts the peer off (boundPeer()).
    if (req.matchedFrom_ >= 0) return;
    posted_.erase(std::remove_if(posted_.begin(), posted_.end(),
                                 [&](const auto& r) { return r.get() == &req; }),
                  posted_.end());
  }
  if (req.deferredFailure_.empty()) req.deferredFailure_ = why;
  // Settled in the next progress(), as ucx settles a cancel: the caller holds the request.
  for (const auto& r : settling_) {
    if (r.get() == &req) return;
  }
  settling_.push_back(req.self_.lock());
}

}  // namespace ucxb::shm
