#include "csrc/p2p_withdraw.hpp"

#include <exception>
#include <string>

namespace ucxb {

void withdrawRequest(ProgressEngine& engine, Request& request, const OpContext& ctx) {
  if (!request.pending()) return;
  Transport& transport = engine.transport();
  const int peer = request.peer();
  const std::string who = peer >= 0 ? "rank " + std::to_string(peer) : std::string("its peer");
  try {
    request.cancel();
    for (int i = 0; i < kWithdrawRounds && request.pending(); ++i) transport.progress();
    if (!request.pending()) return;
    // The group fails first: the request's own completion (abortPeer below) then reports
    // this as the first failure.
    const std::string what = request.isSend() ? "send to " : "receive from ";
    const std::string why = messageOf(toDistError(
        ctx, std::make_exception_ptr(OpFailed(
                 "its wait() gave up, and the " + what + who + " could not be withdrawn (" +
                 who + " may already hold part of it, and a later receive there would take "
                 "it for another message): the connection to " + who +
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

}  // namespace ucxb
