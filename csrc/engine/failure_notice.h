// A group's failure notices (docs/failure-model.md#what-a-failed-group-does): the rank whose
// group fails first sends the text of its first failure to every other rank of the group, and
// a rank that finds such a notice fails its group at once with that peer's reason, instead of
// waiting out an op's timeout for a message that the peer will never send (ranks that passed
// sizes either side of an algorithm switch, where no peer sends the waiting rank anything).
//
// A rank that is told passes the notice on to the ranks other than the failing one and the
// one that told it (once: it tells nothing else), since the failing rank may be cut off from
// some of them: an op that gives up a send the transport cannot take back closes the
// connection to that peer before the notice could go (a rank whose rendezvous send to a
// finished peer timed out). Each rank so sends at most one notice to each peer in the
// group's lifetime, and only after the group failed.
//
// A notice travels on a tag no op uses (tag::notice, from the sending rank). Nothing is
// posted for it: the transport keeps it as an unexpected message, and whoever drives the
// transport looks for one with Transport::probe only where it waits anyway (before it sleeps,
// and every kCheckEvery while it polls without progress: ProgressEngine). A receive left
// posted for the group's lifetime would cost every op's matching on ucx and keep a keepalive
// running to every peer of an idle udp group, failing it when a peer exits.
//
// Torch-free; owner thread of the transport only (the transport threading contract).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "transports/transport.h"

namespace ucxb {

// A notice: the rank that failed first (`failed`), its first failure's text (at most
// kMaxBytes), and the rank that sent it (`from`: the failing rank, or one passing it on).
struct FailureNotice {
  int failed = -1;
  int from = -1;
  std::string text;
};

class FailureNotices {
 public:
  // The longest text a notice carries: a first failure's message fits (they run to a few
  // hundred bytes), and a notice stays one eager message on ucx and one datagram on udp.
  static constexpr size_t kMaxBytes = 1024;
  // How often a wait that polls without progress (progress mode "poll", or a spin) looks for
  // a notice; a wait that sleeps looks before each sleep. A rank told is failed within this
  // (plus its spin) of the notice's arrival, at the cost of one probe per interval.
  static constexpr std::chrono::milliseconds kCheckEvery{5};
  // How long a rank whose group ends (destroy, exit) drives the transport for notices it sent
  // that are not out yet (a new ucx endpoint's wire-up), so that they are not lost with it.
  static constexpr std::chrono::milliseconds kFlushBound{200};

  // `group`: the group's field of the notice tag (tag::groupHash of the group id).
  explicit FailureNotices(uint32_t group) : group_(group) {}

  // Sends `notice` (its text's first kMaxBytes) to every rank but this one, notice.failed
  // and notice.from, best effort and without waiting: a send that fails or throws (a peer
  // gone, a connection closed) is dropped.
  void tell(Transport& transport, const FailureNotice& notice);
  // A notice that has arrived, taken off the transport; none if none has.
  std::optional<FailureNotice> take(Transport& transport);
  // Before the transport goes: drives it until the notices sent are out, for at most
  // kFlushBound, and takes the notices still here (a rank whose group had failed already
  // ignores them), so that none is left unmatched (UCX warns of each at its worker's end).
  void finish(Transport& transport);

 private:
  const uint32_t group_;
  std::vector<RequestPtr> sent_;  // sends not out yet when last looked at
};

}  // namespace ucxb
