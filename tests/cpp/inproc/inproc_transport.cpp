#include "tests/cpp/inproc/inproc_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <thread>
#include <unordered_map>
#include <utility>

#include "transports/fold_target.h"

namespace ucxb::inproc {

namespace {

// Requests complete only from InprocTransport (on the owner thread); cancel() only asks.
class InprocRequest : public Request {
 public:
  InprocRequest(bool isSend, int peer, size_t bytes, Tag tag, Tag mask, uint8_t* into,
                std::shared_ptr<bool> cancelAsked)
      : Request(isSend, peer, bytes), tag(tag), mask(mask), into(into),
        cancelAsked_(std::move(cancelAsked)) {}
  // Owner thread, like everything else: the transport's next progress() acts on it.
  void cancel() override {
    cancelRequested = true;
    *cancelAsked_ = true;
  }
  void succeed(size_t bytes, Tag senderTag) { complete(bytes, senderTag); }
  void failWith(std::string why) { fail(std::move(why)); }

  const Tag tag;
  const Tag mask;               // receives only
  uint8_t* const into;          // receives only
  std::shared_ptr<Message> message;  // sends only
  std::shared_ptr<FoldTarget> fold;  // folding receives only (`into` is then null)
  bool cancelRequested = false;
  size_t received = 0;  // receives: the message's length and tag, once matched
  Tag senderTag = 0;

 private:
  std::shared_ptr<bool> cancelAsked_;  // the transport's "some request was cancelled"
};

using InprocRequestPtr = std::shared_ptr<InprocRequest>;

// Hands `n` bytes to a folding receive the way UCX may: in pieces cut at offsets that split
// elements of every size (n/3 + 1 bytes: a single 8-byte element goes as 3 + 3 + 2), the last
// piece first, each from a copy at an odd address (as UCX's receive buffer may hold it).
void deliverInPieces(FoldTarget& target, const uint8_t* data, size_t n) {
  const size_t piece = n / 3 + 1;
  std::vector<uint8_t> odd(piece + 1);
  std::vector<size_t> starts;
  for (size_t at = 0; at < n; at += piece) starts.push_back(at);
  for (auto at = starts.rbegin(); at != starts.rend(); ++at) {
    const size_t length = std::min(piece, n - *at);
    std::memcpy(odd.data() + 1, data + *at, length);
    target.unpack(*at, odd.data() + 1, length);
  }
}

}  // namespace

class InprocTransport : public Transport {
 public:
  InprocTransport(Fabric& fabric, int rank) : fabric_(fabric), rank_(rank) {}
  ~InprocTransport() override;

  std::string name() const override { return "inproc"; }
  int rank() const override { return rank_; }
  int size() const override { return fabric_.size(); }
  std::vector<uint8_t> localAddress() const override {
    return {static_cast<uint8_t>(rank_), static_cast<uint8_t>(rank_ >> 8)};
  }
  void connect(int peer, const std::vector<uint8_t>& address) override {
    if (address.size() != 2 || address[0] + (address[1] << 8) != peer) {
      throw TransportError("inproc: address of another rank", peer);
    }
  }

  RequestPtr send(int peer, Tag tag, const void* data, size_t bytes, MemoryType mem) override;
  RequestPtr recv(int peer, Tag tag, Tag mask, void* data, size_t bytes, MemoryType mem) override;
  RequestPtr recvFolded(int peer, Tag tag, Tag mask, void* dst, size_t bytes, size_t elementSize,
                        Fold fold) override;
  bool progress() override;
  bool arm() override;
  int eventFd() const override { return fabric_.ranks_[rank_].wake.fd(); }
  std::string peerError(int peer) const override;
  void abortPeer(int peer, const std::string& why) override;
  std::unique_ptr<ExposedMemory> exposeMemory(void* data, size_t bytes, MemoryType memory,
                                              std::string& why) override;
  std::unique_ptr<PeerMapping> mapPeerMemory(int peer, const std::vector<uint8_t>& blob,
                                             size_t bytes, MemoryType memory,
                                             std::string& why) override;

 private:
  using Outcome = std::pair<InprocRequestPtr, std::string>;  // "" = done, else why it failed

  RequestPtr post(const InprocRequestPtr& r);
  bool matchReceives();
  bool completeDelivered(const std::vector<std::shared_ptr<Message>>& delivered);
  // Fails cancelled requests and those of cut links. Every pending request is looked at, so
  // only when a cancel or a cut happened since the last call.
  bool settleCancelledAndCut();
  // Takes `message` back from the peer's inbox, or waits until the peer is done copying out
  // of it. Caller holds the lock; returns with it held.
  void withdrawOrAwait(Message& message, std::unique_lock<std::mutex>& lock);
  // Outside the lock: a completion callback may post requests.
  static void finish(std::vector<Outcome>& outcomes);

  Fabric& fabric_;
  const int rank_;
  std::list<InprocRequestPtr> receives_;  // posted, in posting order
  std::unordered_map<const Message*, InprocRequestPtr> sends_;  // not yet completed
  std::shared_ptr<bool> cancelAsked_ = std::make_shared<bool>(false);  // by any request
  uint64_t seenEvents_ = 0;  // Fabric::Rank::events at the last progress()
  uint64_t seenCuts_ = 0;    // Fabric::Rank::cuts at the last settleCancelledAndCut()
};

EventFd::EventFd() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) throw TransportError("inproc: eventfd failed");
}

EventFd::~EventFd() {
  if (fd_ >= 0) close(fd_);
}

void EventFd::signal() const {
  const uint64_t one = 1;
  (void)!write(fd_, &one, sizeof(one));
}

void EventFd::drain() const {
  uint64_t count;
  (void)!read(fd_, &count, sizeof(count));
}

Fabric::Fabric(int size, bool folds, bool carriesDevice)
    : ranks_(size), folds_(folds), carriesDevice_(carriesDevice) {
  for (auto& r : ranks_) r.cut.assign(size, "");
}

std::unique_ptr<Transport> Fabric::transport(int rank) {
  return std::make_unique<InprocTransport>(*this, rank);
}

void Fabric::notify(int rank) {
  ++ranks_[rank].events;
  ranks_[rank].wake.signal();
}

InprocTransport::~InprocTransport() {
  // Peers may still be copying out of this rank's buffers, or about to: none may after this.
  std::unique_lock<std::mutex> lock(fabric_.mu_);
  for (auto& [message, s] : sends_) withdrawOrAwait(*s->message, lock);
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    fabric_.ranks_[p].cut[rank_] = "rank " + std::to_string(rank_) + " closed its transport";
    ++fabric_.ranks_[p].cuts;
    fabric_.notify(p);
  }
}

namespace {

// Like udp, this transport moves host memory only unless its Fabric carries device memory:
// a device buffer handed to it then means Comm skipped the host staging of an OpMemory that
// needs it (device_stand_ins.h).
void hostOnly(MemoryType mem, bool carriesDevice) {
  if (mem != MemoryType::kHost && !carriesDevice) {
    throw TransportError("the in-process transport carries host memory only");
  }
}

}  // namespace

RequestPtr InprocTransport::send(int peer, Tag tag, const void* data, size_t bytes,
                                 MemoryType mem) {
  hostOnly(mem, fabric_.carriesDevice_);
  ++fabric_.sendsPosted_;
  auto r = std::make_shared<InprocRequest>(true, peer, bytes, tag, 0, nullptr, cancelAsked_);
  std::lock_guard<std::mutex> lock(fabric_.mu_);
  if (const std::string& why = fabric_.ranks_[rank_].cut[peer]; !why.empty()) {
    r->failWith(why);
    return r;
  }
  r->message = std::make_shared<Message>();
  r->message->source = rank_;
  r->message->destination = peer;
  r->message->tag = tag;
  r->message->data = static_cast<const uint8_t*>(data);
  r->message->bytes = bytes;
  fabric_.ranks_[peer].inbox.push_back(r->message);
  fabric_.notify(peer);
  sends_.emplace(r->message.get(), r);
  return r;
}

RequestPtr InprocTransport::recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                                 MemoryType mem) {
  hostOnly(mem, fabric_.carriesDevice_);
  return post(std::make_shared<InprocRequest>(false, peer, bytes, tag, mask,
                                              static_cast<uint8_t*>(data), cancelAsked_));
}

RequestPtr InprocTransport::recvFolded(int peer, Tag tag, Tag mask, void* dst, size_t bytes,
                                       size_t elementSize, Fold fold) {
  if (!fabric_.folds_) return nullptr;
  auto r = std::make_shared<InprocRequest>(false, peer, bytes, tag, mask, nullptr, cancelAsked_);
  r->fold = std::make_shared<FoldTarget>(dst, bytes, elementSize, std::move(fold));
  ++fabric_.foldsPosted_;
  return post(r);
}

RequestPtr InprocTransport::post(const InprocRequestPtr& r) {
  if (const int peer = r->peer(); peer >= 0) {
    std::lock_guard<std::mutex> lock(fabric_.mu_);
    if (const std::string& why = fabric_.ranks_[rank_].cut[peer]; !why.empty()) {
      r->failWith(why);
      return r;
    }
  }
  receives_.push_back(r);
  return r;
}

bool InprocTransport::progress() {
  std::vector<std::shared_ptr<Message>> delivered;
  bool cutsChanged;
  {
    std::lock_guard<std::mutex> lock(fabric_.mu_);
    auto& mine = fabric_.ranks_[rank_];
    seenEvents_ = mine.events;
    cutsChanged = mine.cuts != seenCuts_;
    delivered.swap(mine.delivered);
  }
  bool any = false;
  if (*cancelAsked_ || cutsChanged) any = settleCancelledAndCut();
  any = matchReceives() || any;
  return completeDelivered(delivered) || any;
}

bool InprocTransport::matchReceives() {
  std::vector<std::pair<InprocRequestPtr, std::shared_ptr<Message>>> matched;
  {
    std::lock_guard<std::mutex> lock(fabric_.mu_);
    auto& inbox = fabric_.ranks_[rank_].inbox;
    for (auto it = inbox.begin(); it != inbox.end() && !receives_.empty();) {
      const Message& m = **it;
      auto r = std::find_if(receives_.begin(), receives_.end(), [&](const auto& rq) {
        return !rq->cancelRequested && (m.tag & rq->mask) == (rq->tag & rq->mask);
      });
      if (r == receives_.end()) {
        ++it;  // unexpected: it waits for a matching receive
        continue;
      }
      (*it)->state = Message::State::kTaken;
      matched.emplace_back(std::move(*r), std::move(*it));
      receives_.erase(r);
      it = inbox.erase(it);
    }
  }
  if (matched.empty()) return false;
  // The senders' buffers stay valid until their sends complete, which waits for kDelivered.
  for (auto& [r, m] : matched) {
    const size_t n = std::min(m->bytes, r->postedBytes());
    if (n > 0 && r->fold) {
      deliverInPieces(*r->fold, static_cast<const uint8_t*>(m->data), n);
    } else if (n > 0) {
      std::memcpy(r->into, m->data, n);
    }
  }
  {
    std::lock_guard<std::mutex> lock(fabric_.mu_);
    for (auto& [r, m] : matched) {
      m->state = Message::State::kDelivered;
      fabric_.ranks_[m->source].delivered.push_back(m);
      fabric_.notify(m->source);
    }
  }
  fabric_.delivered_.notify_all();
  std::vector<Outcome> outcomes;
  for (auto& [r, m] : matched) {
    if (m->bytes > r->postedBytes()) {
      outcomes.emplace_back(r, "message truncated: " + std::to_string(m->bytes) +
                                   " bytes from rank " + std::to_string(m->source) +
                                   " into a receive of " + std::to_string(r->postedBytes()));
    } else {
      r->received = m->bytes;
      r->senderTag = m->tag;
      outcomes.emplace_back(r, "");
    }
  }
  finish(outcomes);
  return true;
}

bool InprocTransport::completeDelivered(const std::vector<std::shared_ptr<Message>>& delivered) {
  std::vector<Outcome> outcomes;
  for (const auto& m : delivered) {
    auto it = sends_.find(m.get());
    if (it == sends_.end()) continue;  // already settled (its link was cut meanwhile)
    outcomes.emplace_back(std::move(it->second), "");
    sends_.erase(it);
  }
  finish(outcomes);
  return !outcomes.empty();
}

bool InprocTransport::settleCancelledAndCut() {
  std::vector<Outcome> outcomes;
  {
    std::unique_lock<std::mutex> lock(fabric_.mu_);
    *cancelAsked_ = false;
    auto& mine = fabric_.ranks_[rank_];
    seenCuts_ = mine.cuts;
    for (auto it = receives_.begin(); it != receives_.end();) {
      const auto& r = *it;
      std::string why = r->cancelRequested ? "receive cancelled"
                                           : (r->peer() >= 0 ? mine.cut[r->peer()] : "");
      if (why.empty()) {
        ++it;
        continue;
      }
      outcomes.emplace_back(r, std::move(why));
      it = receives_.erase(it);
    }
    for (auto it = sends_.begin(); it != sends_.end();) {
      const auto& s = it->second;
      Message& m = *s->message;
      const std::string cut = mine.cut[s->peer()];
      // A cut link must leave no request pointing into a buffer; a cancel only withdraws
      // what no receive has taken yet (a taken message completes, as with UCX).
      if (cut.empty() && !(s->cancelRequested && m.state == Message::State::kQueued)) {
        ++it;
        continue;
      }
      withdrawOrAwait(m, lock);
      const bool withdrawn = m.state == Message::State::kWithdrawn;
      outcomes.emplace_back(s, withdrawn ? (cut.empty() ? "send cancelled" : cut) : "");
      it = sends_.erase(it);
    }
  }
  finish(outcomes);
  return !outcomes.empty();
}

void InprocTransport::finish(std::vector<Outcome>& outcomes) {
  for (auto& [r, why] : outcomes) {
    if (!why.empty()) {
      r->failWith(std::move(why));
    } else if (r->isSend()) {
      r->succeed(r->postedBytes(), r->tag);
    } else {
      r->succeed(r->received, r->senderTag);
    }
  }
}

void InprocTransport::withdrawOrAwait(Message& message, std::unique_lock<std::mutex>& lock) {
  if (message.state == Message::State::kQueued) {
    auto& inbox = fabric_.ranks_[message.destination].inbox;
    inbox.erase(std::find_if(inbox.begin(), inbox.end(),
                             [&](const auto& m) { return m.get() == &message; }));
    message.state = Message::State::kWithdrawn;
    return;
  }
  // Taken: the receiver is copying out of the buffer right now and marks it delivered next.
  fabric_.delivered_.wait(lock, [&] { return message.state != Message::State::kTaken; });
}

bool InprocTransport::arm() {
  fabric_.ranks_[rank_].wake.drain();
  std::lock_guard<std::mutex> lock(fabric_.mu_);
  // A notify() after the last progress() may have been drained above: progress again.
  return fabric_.ranks_[rank_].events == seenEvents_;
}

std::string InprocTransport::peerError(int peer) const {
  std::lock_guard<std::mutex> lock(fabric_.mu_);
  return fabric_.ranks_[rank_].cut[peer];
}

void InprocTransport::abortPeer(int peer, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(fabric_.mu_);
    auto& mine = fabric_.ranks_[rank_];
    if (mine.cut[peer].empty()) {
      mine.cut[peer] = why;
      ++mine.cuts;
    }
    auto& theirs = fabric_.ranks_[peer];
    if (theirs.cut[rank_].empty()) {
      theirs.cut[rank_] = "rank " + std::to_string(rank_) + " closed its connection: " + why;
      ++theirs.cuts;
    }
    fabric_.notify(peer);
  }
  // Everything outstanding with `peer` completes now, as the contract asks.
  settleCancelledAndCut();
}

namespace {

// The blob of an exposed buffer: its address and length, which every rank of the process can
// use as they are.
struct ExposedBlob {
  uint64_t address;
  uint64_t bytes;
};

class InprocExposed final : public ExposedMemory {
 public:
  InprocExposed(void* data, size_t bytes) : blob_(sizeof(ExposedBlob)) {
    const ExposedBlob b{reinterpret_cast<uintptr_t>(data), bytes};
    std::memcpy(blob_.data(), &b, sizeof(b));
  }
  const std::vector<uint8_t>& blob() const override { return blob_; }

 private:
  std::vector<uint8_t> blob_;
};

class InprocMapping final : public PeerMapping {
 public:
  explicit InprocMapping(void* data) : data_(data) {}
  void* data() const override { return data_; }

 private:
  void* data_;
};

}  // namespace

std::unique_ptr<ExposedMemory> InprocTransport::exposeMemory(void* data, size_t bytes,
                                                             MemoryType memory,
                                                             std::string& why) {
  if (!fabric_.peerMaps_) return Transport::exposeMemory(data, bytes, memory, why);
  hostOnly(memory, fabric_.carriesDevice_);
  return std::make_unique<InprocExposed>(data, bytes);
}

std::unique_ptr<PeerMapping> InprocTransport::mapPeerMemory(int peer,
                                                            const std::vector<uint8_t>& blob,
                                                            size_t bytes, MemoryType memory,
                                                            std::string& why) {
  if (!fabric_.peerMaps_) return Transport::mapPeerMemory(peer, blob, bytes, memory, why);
  hostOnly(memory, fabric_.carriesDevice_);
  if (rank_ == fabric_.peerMapStallingRank_) std::this_thread::sleep_for(fabric_.peerMapStall_);
  if (rank_ == fabric_.peerMapRefusingRank_) {
    why = "inproc: rank " + std::to_string(rank_) + " refuses to map " + peerLabel(peer) +
          "'s memory (a test's choice)";
    return nullptr;
  }
  if (rank_ == fabric_.peerMapThrowingRank_) {
    throw TransportError("inproc: mapping " + peerLabel(peer) + "'s memory failed (a test's choice)",
                         peer);
  }
  ExposedBlob b{};
  if (blob.size() != sizeof(b)) {
    throw TransportError("inproc: " + peerLabel(peer) + " sent a blob of " +
                             std::to_string(blob.size()) + " bytes, not an exposed buffer's",
                         peer);
  }
  std::memcpy(&b, blob.data(), sizeof(b));
  if (bytes > b.bytes) {
    throw TransportError("inproc: " + peerLabel(peer) + " exposed " + std::to_string(b.bytes) +
                             " bytes, " + std::to_string(bytes) + " asked for",
                         peer);
  }
  ++fabric_.peerMapsMade_;
  return std::make_unique<InprocMapping>(reinterpret_cast<void*>(static_cast<uintptr_t>(b.address)));
}

}  // namespace ucxb::inproc
