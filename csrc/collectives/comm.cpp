#include "csrc/collectives/comm.h"

#include <string>

#include "transports/tag.h"

namespace ucxb {

namespace {

void checkStep(uint32_t step) {
  if (step >= tag::kMaxSteps) {
    throw OpFailed("algorithm step " + std::to_string(step) + " does not fit the tag layout");
  }
}

}  // namespace

RequestPtr Comm::send(int peer, uint32_t step, const void* data, size_t bytes) {
  checkStep(step);
  const Tag t = tag::collective(group_, seq_, step, static_cast<uint32_t>(rank()));
  return transport_.send(peer, t, data, bytes);
}

RequestPtr Comm::recv(int peer, uint32_t step, void* data, size_t bytes) {
  checkStep(step);
  const Tag t = tag::collective(group_, seq_, step, static_cast<uint32_t>(peer));
  return transport_.recv(peer, t, tag::kFullMask, data, bytes);
}

void Comm::wait(const std::vector<RequestPtr>& requests) {
  driver_.waitAll(requests, deadline_);
  for (const auto& r : requests) {
    if (!r->isSend() && r->receivedBytes() != r->postedBytes()) {
      throw OpFailed("expected " + std::to_string(r->postedBytes()) + " bytes from rank " +
                     std::to_string(r->peer()) + " but received " +
                     std::to_string(r->receivedBytes()) +
                     ": the ranks passed tensors of different sizes");
    }
  }
}

}  // namespace ucxb
