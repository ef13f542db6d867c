#include "csrc/p2p_withdraw.hpp"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

namespace ucxb {

void withdrawRequest(ProgressEngine& engine, Request& request, const OpContext& ctx) {
  if (!request.pending()) return;
  Transport& transport = engine.transport();
  try {
    request.cancel();
    for (int i = 0; i < kWithdrawRounds && request.pending(); ++i) transport.progress();
    if (!request.pending()) return;
    // An any-source receive is tied to the peer whose message it has begun to take.
    const int peer = request.boundPeer();
    const std::string who =
        peer >= 0 ? "rank " + std::to_string(peer) : std::string("its peer");
    // The group fails first: the request's own completion (abortPeer below) then reports
    // this as the first failure.
    const std::string reason =
        request.isSend()
            ? "the send to " + who + " could not be withdrawn (" + who +
                  " may already hold part of it, and a later receive there would take it for "
                  "another message)"
            : "the receive from " + who + " could not be withdrawn (it had begun to take a "
                  "message of " + who + "'s, which " + who + " counts as received: dropping "
                  "the rest would lose it, and a retried receive would take the next one)";
    const std::string why = messageOf(toDistError(
        ctx, std::make_exception_ptr(OpFailed("its wait() gave up, and " + reason +
                                              ": the connection to " + who +
                                              " is closed and the group failed"))));
    engine.fail(why, FailureKind::kTimeout);
    if (peer >= 0) transport.abortPeer(peer, why);
  } catch (const std::exception& e) {
    engine.fail(messageOf(toDistError(
                    ctx, std::make_exception_ptr(OpFailed(
                             std::string("withdrawing the request after its wait() gave up "
                                         "failed: ") + e.what())))),
                FailureKind::kLocal);
  }
}

void withdrawAndWait(const std::shared_ptr<ProgressEngine>& engine,
                     const std::shared_ptr<std::weak_ptr<Request>>& posted, const OpContext& ctx) {
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    void set() {
      {
        std::lock_guard<std::mutex> lock(mu);
        done = true;
      }
      cv.notify_all();
    }
  };
  auto done = std::make_shared<Done>();
  Task withdraw;
  // The task runs on the engine's thread, which holds the engine.
  withdraw.run = [engine = engine.get(), posted, ctx, done]() {
    if (auto r = posted->lock()) withdrawRequest(*engine, *r, ctx);
    done->set();
  };
  // Not run (the engine stopped): nothing is left to withdraw.
  withdraw.abandon = [done](const std::string&) { done->set(); };
  engine->post(std::move(withdraw));
  if (engine->onThread()) return;
  std::unique_lock<std::mutex> lock(done->mu);
  done->cv.wait_for(lock, kWithdrawWaitCap, [&] { return done->done; });
}

}  // namespace ucxb
