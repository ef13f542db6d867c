#include "csrc/collectives/comm.h"

#include <algorithm>
#include <string>

#include "csrc/engine/streaming_copy.h"
#include "transports/tag.h"

namespace ucxb {

namespace {

void checkStep(uint32_t step) {
  if (step >= tag::kMaxSteps) {
    throw OpFailed("algorithm step " + std::to_string(step) + " does not fit the tag layout");
  }
}

}  // namespace

Comm::~Comm() {
  std::vector<RequestPtr> pending;
  for (const auto& r : posted_) {
    if (r->pending()) pending.push_back(r);
  }
  if (pending.empty()) return;
  try {
    abandon(pending);
  } catch (...) {
    // The driver records its own failures; a destructor must not throw.
  }
}

void Comm::track(const RequestPtr& request) {
  // Keep the list short in long chunked exchanges: drop what has completed.
  if (posted_.size() >= 64) {
    posted_.erase(std::remove_if(posted_.begin(), posted_.end(),
                                 [](const RequestPtr& r) { return !r->pending(); }),
                  posted_.end());
  }
  // Room for a small op's requests at once: growing one at a time cost it two allocations.
  if (posted_.capacity() == 0) posted_.reserve(4);
  posted_.push_back(request);
  // A tripwire that fired before this post (the other path's message was already here when
  // the wire was posted, or arrived while earlier requests were waited for) cancelled what
  // was pending then; a request posted after it would wait out the deadline unmatched.
  if (!tripped_.empty() && request->pending()) request->cancel();
}

RequestPtr Comm::send(int peer, uint32_t step, const void* data, size_t bytes) {
  checkStep(step);
  const Tag t = tag::collective(group_, seq_, step, static_cast<uint32_t>(rank()));
  memory_.settle();
  if (memory_.transportCarries()) {
    // A message of no bytes touches no memory: host, whatever the op's memory is.
    RequestPtr req =
        transport_.send(peer, t, data, bytes, bytes > 0 ? memory_.type() : MemoryType::kHost);
    track(req);
    return req;
  }
  std::shared_ptr<void> owner;
  uint8_t* host = memory_.hostBuffer(bytes, owner);
  memory_.toHost(host, data, bytes);
  RequestPtr req = transport_.send(peer, t, host, bytes, MemoryType::kHost);
  req->keepAlive(std::move(owner));
  track(req);
  return req;
}

RequestPtr Comm::recv(int peer, uint32_t step, void* data, size_t bytes) {
  checkStep(step);
  const Tag t = tag::collective(group_, seq_, step, static_cast<uint32_t>(peer));
  memory_.settle();
  if (memory_.transportCarries()) {
    RequestPtr req = transport_.recv(peer, t, tag::kFullMask, data, bytes,
                                     bytes > 0 ? memory_.type() : MemoryType::kHost);
    track(req);
    return req;
  }
  std::shared_ptr<void> owner;
  uint8_t* host = memory_.hostBuffer(bytes, owner);
  RequestPtr req = transport_.recv(peer, t, tag::kFullMask, host, bytes, MemoryType::kHost);
  req->keepAlive(std::move(owner));
  bounced_.push_back({req, data, host});
  track(req);
  return req;
}

RequestPtr Comm::recvFolded(int peer, uint32_t step, void* acc, size_t bytes,
                           const Reduction& red) {
  // HostMemory::reduce is red.fn itself (swapped kernels included): the fold is the same.
  if (!takesHostPaths(memory_.type()) || red.fn == nullptr || bytes == 0) return nullptr;
  checkStep(step);
  const Tag t = tag::collective(group_, seq_, step, static_cast<uint32_t>(peer));
  RequestPtr req =
      transport_.recvFolded(peer, t, tag::kFullMask, acc, bytes, red.elementSize, red.fn);
  if (req) track(req);
  return req;
}

RequestPtr Comm::recvStreamed(int peer, uint32_t step, void* dst, size_t bytes) {
  if (!takesHostPaths(memory_.type()) || bytes == 0) return nullptr;
  checkStep(step);
  const Tag t = tag::collective(group_, seq_, step, static_cast<uint32_t>(peer));
  // One-byte "elements": a copy has no element to keep whole across pieces.
  RequestPtr req = transport_.recvFolded(peer, t, tag::kFullMask, dst, bytes, 1, &streamingCopy);
  if (req) track(req);
  return req;
}

RequestPtr Comm::sendNotice(int peer, uint32_t step, const void* data, size_t bytes) {
  checkStep(step);
  const Tag t = tag::collective(group_, seq_, step, static_cast<uint32_t>(rank()));
  RequestPtr req = transport_.send(peer, t, data, bytes, MemoryType::kHost);
  track(req);
  return req;
}

RequestPtr Comm::recvNotice(int peer, uint32_t step, void* data, size_t bytes) {
  checkStep(step);
  const Tag t = tag::collective(group_, seq_, step, static_cast<uint32_t>(peer));
  RequestPtr req = transport_.recv(peer, t, tag::kFullMask, data, bytes, MemoryType::kHost);
  track(req);
  return req;
}

std::unique_ptr<ExposedMemory> Comm::expose(void* data, size_t bytes, std::string& why) {
  memory_.settle();
  return transport_.exposeMemory(data, bytes, memory_.type(), why);
}

std::unique_ptr<PeerMapping> Comm::mapPeer(int peer, const std::vector<uint8_t>& blob,
                                           size_t bytes, std::string& why) {
  return transport_.mapPeerMemory(peer, blob, bytes, memory_.type(), why);
}

void Comm::wait(const std::vector<RequestPtr>& requests) {
  try {
    driver_.waitAll(requests, deadline_);
  } catch (const OpFailed&) {
    // A request the tripwire cancelled: say why, not "cancelled".
    if (!tripped_.empty()) throw OpFailed(tripped_);
    throw;
  } catch (const OpTimeout&) {
    // A wire that tripped names the cause; the timeout is its consequence.
    if (!tripped_.empty()) throw OpFailed(tripped_);
    throw;
  }
  if (!tripped_.empty()) throw OpFailed(tripped_);
  completed(requests);
}

RequestPtr Comm::tripwire(int peer, uint32_t step, void* data, size_t bytes,
                          std::function<std::string(const Request&)> why) {
  RequestPtr wire = recv(peer, step, data, bytes);
  Request* self = wire.get();
  // Runs on the owner thread during progress(), until the wire is given up: abandon() (which
  // the destructor calls for what is still pending) drops it from a wire it could not stop.
  wire->onComplete([this, self, step, why = std::move(why)](Request& r) {
    if (!caught(r) || !tripped_.empty()) return;
    tripped_ = why(r);
    trippedBy_ = r.peer();
    trippedStep_ = step;
    for (const auto& other : posted_) {
      if (other.get() != self && other->pending()) other->cancel();
    }
  });
  return wire;
}

void Comm::completed(const std::vector<RequestPtr>& requests) {
  for (const auto& r : requests) {
    if (!r->isSend() && r->receivedBytes() != r->postedBytes()) {
      throw OpFailed("expected " + std::to_string(r->postedBytes()) + " bytes from rank " +
                     std::to_string(r->peer()) + " but received " +
                     std::to_string(r->receivedBytes()) +
                     ": the ranks passed tensors of different sizes");
    }
  }
  if (bounced_.empty()) return;
  // Staged receives among these have arrived whole: into the op's memory with them.
  auto arrived = [&](const Bounced& b) {
    return std::find(requests.begin(), requests.end(), b.request) != requests.end();
  };
  for (const auto& b : bounced_) {
    if (arrived(b)) memory_.fromHost(b.dst, b.host, b.request->receivedBytes());
  }
  bounced_.erase(std::remove_if(bounced_.begin(), bounced_.end(), arrived), bounced_.end());
}

void Comm::abandon(const std::vector<RequestPtr>& requests) {
  try {
    driver_.abandon(requests);
  } catch (...) {
    orphan(requests);
    throw;
  }
  orphan(requests);
  // Their host buffers stay with the requests (keepAlive); nothing is copied in.
  bounced_.erase(std::remove_if(bounced_.begin(), bounced_.end(),
                                [&](const Bounced& b) {
                                  return std::find(requests.begin(), requests.end(),
                                                   b.request) != requests.end();
                                }),
                 bounced_.end());
}

void Comm::orphan(const std::vector<RequestPtr>& requests) {
  for (const auto& r : requests) {
    if (!r->pending()) continue;
    // A tripwire's callback writes into this Comm (a heap corruption, until 2026-11-27); a
    // wire that settled during the abandon has tripped already, as it should.
    r->dropOnComplete();
    // The memory the op's caller frees once the op has gone (until 2026-11-27 freed under
    // the receive).
    for (const auto& owner : kept_) r->keepAlive(owner);
  }
}

}  // namespace ucxb
