#include "tests/cpp/inproc/thread_driver.h"

#include <poll.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace ucxb::inproc {

namespace {

std::string describePending(const std::vector<RequestPtr>& requests) {
  std::string what;
  for (const auto& r : requests) {
    if (!r->pending()) continue;
    what += what.empty() ? "" : "; ";
    what += (r->isSend() ? "send of " : "receive of ") + std::to_string(r->postedBytes()) +
            (r->isSend() ? " bytes to rank " : " bytes from rank ") + std::to_string(r->peer());
  }
  return what;
}

}  // namespace

void ThreadDriver::waitAll(const std::vector<RequestPtr>& requests, Clock::time_point deadline) {
  for (;;) {
    bool done = true;
    for (const auto& r : requests) {
      if (r->failed()) {
        const std::string why = r->error();
        abandon(requests);
        throw OpFailed(why);
      }
      done = done && !r->pending();
    }
    if (done) return;
    if (transport_.progress()) continue;
    const auto now = Clock::now();
    if (now >= deadline) {
      const std::string what = describePending(requests);
      abandon(requests);
      throw OpTimeout("no progress before the timeout; still waiting for: " + what);
    }
    if (!transport_.arm()) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    pollfd fd{transport_.eventFd(), POLLIN, 0};
    poll(&fd, 1, static_cast<int>(std::clamp<int64_t>(left.count() + 1, 1, 100)));
  }
}

void ThreadDriver::abandon(const std::vector<RequestPtr>& requests) {
  for (const auto& r : requests) {
    if (r->pending()) r->cancel();
  }
  transport_.progress();
  // What a cancel could not stop (a message the peer is receiving) ends with its peer.
  for (const auto& r : requests) {
    if (r->pending() && r->peer() >= 0) {
      transport_.abortPeer(r->peer(), "an earlier op with rank " + std::to_string(r->peer()) +
                                          " failed");
    }
  }
}

thread_local size_t ThreadDriver::scratchLimit = SIZE_MAX;

uint8_t* ThreadDriver::scratch(size_t bytes) {
  if (bytes > scratchLimit) {
    throw OpFailed("asked for " + std::to_string(bytes) + " bytes of scratch, " +
                   std::to_string(scratchLimit) + " were sized at issue (algo::scratchBytes)");
  }
  if (bytes > scratch_.size()) scratch_.resize(bytes);
  return scratch_.data();
}

}  // namespace ucxb::inproc
