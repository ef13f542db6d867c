// Closing UCP endpoints with a bounded wait, for every worker that owns endpoints: the
// transport's own and the send lane's. A flushed close waits for the peer's acknowledgement,
// which a peer that exited never sends, so every wait here has a limit; a forced close
// completes every request on the endpoint as cancelled.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <vector>

namespace ucxb::ucx {

// Progresses `worker` until `done()` or `limit` has passed.
template <typename Pred>
void progressUntil(ucp_worker_h worker, Pred done, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done() && std::chrono::steady_clock::now() < deadline) ucp_worker_progress(worker);
}

// Starts closing `ep` (flushed, or forced) and sets it to null; appends the close request to
// `closing` when it did not complete at once.
void startClose(ucp_ep_h& ep, bool force, std::vector<void*>& closing);

// Waits up to `limit` for every request in `closing` to finish, then frees them all.
void finishCloses(ucp_worker_h worker, std::vector<void*>& closing,
                  std::chrono::milliseconds limit);

// Force-closes `ep` (if any) and waits up to a second for the close: a peer gone for good.
void forceClose(ucp_worker_h worker, ucp_ep_h& ep);

}  // namespace ucxb::ucx
