// Test-only: a Transport decorator whose progress() or arm() throws TransportError once a
// test asks for it, so that tests can reach the failure paths of the thread that drives a
// transport (csrc/engine/progress_engine.cpp) without breaking a real transport. A group
// wraps its transport in one only when UCXBACKEND_TEST_FAULT_INJECTION=1 is set at creation
// (csrc/transport_backend.cpp); Python arms it with ucxbackend._C._inject_transport_fault.
// Everything else is forwarded unchanged, recvFolded included (so that such a group folds as
// its transport would, and faults reach folding receives too); the folds it sees are counted
// (ucxbackend._C._transport_fault_counts) so that a test can tell that they did happen.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transports/transport.h"

namespace ucxb {

// Where the next injected fault is thrown. Armed from any thread; read by the owner thread.
class FaultSwitch {
 public:
  enum class Where : int { kNone = 0, kProgress = 1, kArm = 2 };
  void arm(Where where) { where_.store(static_cast<int>(where), std::memory_order_release); }
  // Receives the transport folded (recvFolded gave a request). Counted by the owner thread,
  // read from any.
  void countFold() { folds_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t folds() const { return folds_.load(std::memory_order_relaxed); }
  // Throws, once, if armed for `where`.
  void maybeThrow(Where where, const char* call) {
    int expected = static_cast<int>(where);
    if (where_.load(std::memory_order_acquire) == expected &&
        where_.compare_exchange_strong(expected, static_cast<int>(Where::kNone))) {
      throw TransportError(std::string("injected transport fault in ") + call + " (test hook)");
    }
  }

 private:
  std::atomic<int> where_{0};
  std::atomic<uint64_t> folds_{0};
};

class FaultInjectingTransport : public Transport {
 public:
  FaultInjectingTransport(std::unique_ptr<Transport> inner, std::shared_ptr<FaultSwitch> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)) {}

  std::string name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::vector<uint8_t> localAddress() const override { return inner_->localAddress(); }
  void connect(int peer, const std::vector<uint8_t>& address) override {
    inner_->connect(peer, address);
  }
  RequestPtr send(int peer, Tag tag, const void* data, size_t bytes,
                  MemoryType mem = MemoryType::kHost) override {
    return inner_->send(peer, tag, data, bytes, mem);
  }
  RequestPtr recv(int peer, Tag tag, Tag mask, void* data, size_t bytes,
                  MemoryType mem = MemoryType::kHost) override {
    return inner_->recv(peer, tag, mask, data, bytes, mem);
  }
  RequestPtr recvFolded(int peer, Tag tag, Tag mask, void* dst, size_t bytes, size_t elementSize,
                        Fold fold) override {
    RequestPtr req = inner_->recvFolded(peer, tag, mask, dst, bytes, elementSize, std::move(fold));
    if (req) faults_->countFold();
    return req;
  }
  bool progress() override {
    faults_->maybeThrow(FaultSwitch::Where::kProgress, "progress()");
    return inner_->progress();
  }
  bool arm() override {
    faults_->maybeThrow(FaultSwitch::Where::kArm, "arm()");
    return inner_->arm();
  }
  int eventFd() const override { return inner_->eventFd(); }
  int probe(Tag tag, Tag mask) override { return inner_->probe(tag, mask); }
  std::string peerError(int peer) const override { return inner_->peerError(peer); }
  void abortPeer(int peer, const std::string& why) override { inner_->abortPeer(peer, why); }
  bool permitsSharedMemory() const override { return inner_->permitsSharedMemory(); }
  bool carriesDeviceMemory() const override { return inner_->carriesDeviceMemory(); }
  bool reachesAll(const std::vector<std::vector<uint8_t>>& addresses) const override {
    return inner_->reachesAll(addresses);
  }
  std::vector<std::string> lowerTransports() const override { return inner_->lowerTransports(); }
  std::vector<Counters> peerCounters() const override { return inner_->peerCounters(); }
  Counters transportCounters() const override { return inner_->transportCounters(); }
  // Not the base's "does not map": a fault-injecting group's peer-mapped all_reduce would
  // fall back (device_peer_map=auto) or fail (on) where its transport maps.
  std::unique_ptr<ExposedMemory> exposeMemory(void* data, size_t bytes, MemoryType memory,
                                              std::string& why) override {
    return inner_->exposeMemory(data, bytes, memory, why);
  }
  std::unique_ptr<PeerMapping> mapPeerMemory(int peer, const std::vector<uint8_t>& blob,
                                             size_t bytes, MemoryType memory,
                                             std::string& why) override {
    return inner_->mapPeerMemory(peer, blob, bytes, memory, why);
  }

 private:
  std::unique_ptr<Transport> inner_;
  std::shared_ptr<FaultSwitch> faults_;
};

}  // namespace ucxb
