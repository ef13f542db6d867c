// What a point-to-point request whose caller's wait() gave up becomes: withdrawn, so that a
// retried op is not robbed by it, or, where the transport cannot take it back, the end of the
// group. Runs on the progress thread (a task the timed-out wait posts).
#pragma once

#include <chrono>
#include <memory>

#include "csrc/engine/progress_engine.h"
#include "csrc/errors.hpp"
#include "transports/transport.h"

namespace ucxb {

// Progress rounds a cancellation gets to complete: both transports complete a cancelled
// receive in the next one.
constexpr int kWithdrawRounds = 16;

// Cancels `request`; if it is still pending after kWithdrawRounds rounds of progress (a send:
// neither transport can take one back once queued, as the peer may hold its announcement or
// part of its data), fails the group and cuts its peer off. Left as it was, the peer's next
// matching receive would take the withdrawn message, read from a buffer its caller believes
// free, for the one it waits for: wrong data without an error. `ctx` names the op.
void withdrawRequest(ProgressEngine& engine, Request& request, const OpContext& ctx);

// How long a timed-out wait() of a point-to-point op waits, at most, for its withdrawal to
// run. The thread gets to it at once when idle, but only after the op it runs when busy (a
// long collective, up to that op's timeout): a caller's wait(timeout) must not turn into
// that. Past the cap the wait raises anyway, and getError() may read SUCCESS until the
// withdrawal has run.
constexpr std::chrono::milliseconds kWithdrawWaitCap{1000};

// What a timed-out wait() of a point-to-point op calls: queues withdrawRequest for the request
// `posted` names (not yet posted: nothing to withdraw) on the engine's thread and returns once
// it has run, or after kWithdrawWaitCap, so that a group it failed has recorded that when the
// wait raises (getError() is TIMEOUT at once, not SUCCESS for a moment). Never waits on the
// progress thread itself (a Future callback), which runs the task later.
void withdrawAndWait(const std::shared_ptr<ProgressEngine>& engine,
                     const std::shared_ptr<std::weak_ptr<Request>>& posted, const OpContext& ctx);

}  // namespace ucxb
