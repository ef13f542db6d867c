#include "tests/cpp/inproc/inproc_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace ucxb::inproc {

namespace {

// Requests complete only from InprocTransport (on the owner thread); cancel() only asks.
class InprocRequest : public Request {
 public:
  InprocRequest(bool isSend, int peer, size_t bytes, Tag tag, Tag mask, uint8_t* into)
      : Request(isSend, peer, bytes), tag(tag), mask(mask), into(into) {}
  void cancel() override { cancelRequested = true; }
  void succeed(size_t bytes, Tag senderTag) { complete(bytes, senderTag); }
  void failWith(std::string why) { fail(std::move(why)); }

  const Tag tag;
  const Tag mask;               // receives only
  uint8_t* const into;          // receives only
  std::shared_ptr<Message> message;  // sends only
  bool cancelRequested = false;
};

using InprocRequestPtr = std::shared_ptr<InprocRequest>;

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
  bool progress() override;
  bool arm() override;
  int eventFd() const override { return fabric_.ranks_[rank_].wake.fd(); }
  std::string peerError(int peer) const override;
  void abortPeer(int peer, const std::string& why) override;

 private:
  bool matchReceives();
  bool settleSends();
  // Takes `message` back from the peer's inbox, or waits until the peer is done copying out
  // of it. Caller holds the lock; returns with it held.
  void withdrawOrAwait(Message& message, std::unique_lock<std::mutex>& lock);

  Fabric& fabric_;
  const int rank_;
  std::vector<InprocRequestPtr> receives_;  // posted, in posting order
  std::vector<InprocRequestPtr> sends_;     // not yet completed
  uint64_t seenEvents_ = 0;                 // Fabric::Rank::events at the last progress()
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

Fabric::Fabric(int size) : ranks_(size) {
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
  for (auto& s : sends_) withdrawOrAwait(*s->message, lock);
  for (int p = 0; p < size(); ++p) {
    if (p == rank_) continue;
    fabric_.ranks_[p].cut[rank_] = "rank " + std::to_string(rank_) + " closed its transport";
    fabric_.notify(p);
  }
}

RequestPtr InprocTransport::send(int peer, Tag tag, const void* data, size_t bytes, MemoryType) {
  auto r = std::make_shared<InprocRequest>(true, peer, bytes, tag, 0, nullptr);
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
  sends_.push_back(r);
  return r;
}

RequestPtr InprocTransport::recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                                 MemoryType) {
  auto r = std::make_shared<InprocRequest>(false, peer, bytes, tag, mask,
                                           static_cast<uint8_t*>(data));
  if (peer >= 0) {
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
  {
    std::lock_guard<std::mutex> lock(fabric_.mu_);
    seenEvents_ = fabric_.ranks_[rank_].events;
  }
  const bool received = matchReceives();
  const bool sent = settleSends();
  return received || sent;
}

bool InprocTransport::matchReceives() {
  bool any = false;
  // Completion callbacks may post receives: they land in the emptied receives_.
  std::vector<InprocRequestPtr> posted;
  posted.swap(receives_);
  std::vector<InprocRequestPtr> still;
  for (auto& r : posted) {
    if (r->cancelRequested) {
      r->failWith("receive cancelled");
      any = true;
      continue;
    }
    std::shared_ptr<Message> m;
    std::string cut;
    {
      std::lock_guard<std::mutex> lock(fabric_.mu_);
      auto& rank = fabric_.ranks_[rank_];
      if (r->peer() >= 0) cut = rank.cut[r->peer()];
      auto it = std::find_if(rank.inbox.begin(), rank.inbox.end(), [&](const auto& msg) {
        return (msg->tag & r->mask) == (r->tag & r->mask);
      });
      if (cut.empty() && it != rank.inbox.end()) {
        m = *it;
        rank.inbox.erase(it);
        m->state = Message::State::kTaken;
      }
    }
    if (!cut.empty()) {
      r->failWith(cut);  // outside the lock: callbacks may post requests
      any = true;
      continue;
    }
    if (m == nullptr) {
      still.push_back(r);
      continue;
    }
    // The sender's buffer stays valid until its send completes, which waits for kDelivered.
    const size_t n = std::min(m->bytes, r->postedBytes());
    if (n > 0) std::memcpy(r->into, m->data, n);
    {
      std::lock_guard<std::mutex> lock(fabric_.mu_);
      m->state = Message::State::kDelivered;
      fabric_.notify(m->source);
      fabric_.delivered_.notify_all();
    }
    if (m->bytes > r->postedBytes()) {
      r->failWith("message truncated: " + std::to_string(m->bytes) + " bytes from rank " +
                  std::to_string(m->source) + " into a receive of " +
                  std::to_string(r->postedBytes()));
    } else {
      r->succeed(m->bytes, m->tag);
    }
    any = true;
  }
  // Receives posted by callbacks come after the ones still waiting.
  still.insert(still.end(), receives_.begin(), receives_.end());
  receives_ = std::move(still);
  return any;
}

bool InprocTransport::settleSends() {
  std::vector<InprocRequestPtr> still;
  std::vector<std::pair<InprocRequestPtr, std::string>> failed;
  std::vector<InprocRequestPtr> done;
  {
    std::unique_lock<std::mutex> lock(fabric_.mu_);
    for (auto& s : sends_) {
      Message& m = *s->message;
      const std::string cut = fabric_.ranks_[rank_].cut[s->peer()];
      // A cut link must leave no request pointing into a buffer; a cancel only withdraws
      // what no receive has taken yet (a taken message completes, as with UCX).
      if (!cut.empty() || (s->cancelRequested && m.state == Message::State::kQueued)) {
        withdrawOrAwait(m, lock);
      }
      if (m.state == Message::State::kDelivered) {
        done.push_back(s);
      } else if (m.state == Message::State::kWithdrawn) {
        failed.emplace_back(s, cut.empty() ? "send cancelled" : cut);
      } else {
        still.push_back(s);
      }
    }
  }
  sends_ = std::move(still);
  // Callbacks run outside the lock and may post more sends (appended to sends_).
  for (auto& s : done) s->succeed(s->postedBytes(), s->tag);
  for (auto& [s, why] : failed) s->failWith(why);
  return !done.empty() || !failed.empty();
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
    if (mine.cut[peer].empty()) mine.cut[peer] = why;
    auto& theirs = fabric_.ranks_[peer];
    if (theirs.cut[rank_].empty()) {
      theirs.cut[rank_] = "rank " + std::to_string(rank_) + " closed its connection: " + why;
    }
    fabric_.notify(peer);
    fabric_.notify(rank_);
  }
  // Everything outstanding with `peer` completes now, as the contract asks.
  matchReceives();
  settleSends();
}

}  // namespace ucxb::inproc
