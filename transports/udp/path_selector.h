// Which path (socket pair) a connection's next datagram takes, when a peer is reachable over
// several (udp_config `paths`). The connection tells it what each path's packets met (acked
// with an RTT, declared lost) and asks it for a path per datagram; the Endpoint and the socket
// loop only carry the choice out (one socket per path on each rank). Sans-IO, deterministic.
//
// Policies (udp_config `path_policy`):
//   single   - everything on path 0 (one path, as without multipath);
//   spray    - round-robin over every path (packet spraying, as AWS SRD and UET do);
//   adaptive - weighted round-robin whose weights follow what each path's packets met: a
//              path's weight falls with its estimated loss rate beyond the best path's
//              (1 / (1 + 400 x excess); the losses loss detection declares, not a timeout's,
//              and not those that a late ACK shows were none), and a path whose smoothed RTT
//              is well above the best path's is weighted down in proportion (the per-path signals of UET's NSCC and
//              UCCL's path selection, in miniature). Under congestion=aimd each path has a
//              window of its own (congestion_coupled.h): choose() is given the paths with
//              room, and weighs them by RTT alone.
// Under every policy a retransmission avoids the path its content was last lost on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transports/udp/stats.h"
#include "transports/udp/udp_types.h"
#include "transports/udp/wire_format.h"

namespace ucxb::udp {


// Most paths (sockets per rank) a group may use.
constexpr uint32_t kMaxPaths = 16;
static_assert(kMaxPaths <= kMaxAckTimestamps, "an ACK carries a receive timestamp per path");
// A set of paths as a bit mask (bit p: path p); every path.
constexpr uint32_t kAllPaths = (uint32_t{1} << kMaxPaths) - 1;

class PathSelector {
 public:
  // `policy` is one of pathPolicyNames() (validated by the config schema).
  PathSelector(uint32_t paths, const std::string& policy);

  uint32_t paths() const { return static_cast<uint32_t>(paths_.size()); }
  // The path of the next reliable packet, among the paths whose bit is set in `allowed` (those
  // whose window has room, when the congestion policy keeps one per path; at least one bit of
  // the first paths() set). A retransmission avoids the path of the last loss when another
  // is allowed.
  uint32_t choose(bool retransmission, uint32_t allowed = kAllPaths);
  // The path of an ACK or NACK: the best path (adaptive), else the next in turn.
  uint32_t chooseControl();
  void onSent(uint32_t path, bool retransmission);
  // `sentTime`: when the acknowledged packet was sent (the path's latest RTT is that of the
  // newest-sent packet acknowledged on it, as RACK's is, not of the one acknowledged last).
  void onAcked(uint32_t path, DurationUs rttUs, TimeUs sentTime = 0);
  // byTimeout: declared by the retransmission timeout, which blames no path in particular.
  void onLost(uint32_t path, bool byTimeout);
  // A packet that loss detection declared lost on `path` was acknowledged after all (it was
  // late, e.g. held up by the receiving host): the loss is taken back.
  void onSpuriousLoss(uint32_t path);
  // The time threshold of loss detection on `path` (SentPackets::setPathLossDelay): RFC
  // 9002's 9/8 of the path's smoothed RTT or, with `latestCounts`, of the larger of its
  // smoothed and latest RTT. The latest RTT follows a queue that is building at once, where
  // the smoothed one lags it by several round trips and a packet still queued there looks
  // lost as soon as another path acknowledges a later one.
  DurationUs lossDelay(uint32_t path, bool latestCounts) const;

  const PathStats& stats(uint32_t path) const { return paths_[path].stats; }
  // The congestion policy keeps a window per path (congestion_coupled.h), and choose() is
  // given the paths with room: adaptive then weighs paths by RTT only, since each path's
  // window already answers for its losses.
  void setWindowPerPath() { windowPerPath_ = true; }

 private:
  enum class Policy : uint8_t { kSingle, kSpray, kAdaptive };
  struct Path {
    PathStats stats;
    double lossRate = 0.0;  // adaptive: estimated fraction of this path's packets lost
    double credit = 0.0;  // smooth weighted round-robin's running score
    DurationUs latestRttUs = 0;  // of the newest-sent packet acknowledged on the path
    TimeUs latestSentTime = 0;
  };
  double effectiveWeight(const Path& p, DurationUs bestRtt, double bestLoss) const;
  uint32_t next(uint32_t allowed);

  Policy policy_;
  bool windowPerPath_ = false;
  std::vector<Path> paths_;
  uint32_t turn_ = 0;
  uint32_t controlTurn_ = 0;
  uint32_t lastLost_ = UINT32_MAX;
};

// "single", "spray", "adaptive".
const std::vector<std::string>& pathPolicyNames();

}  // namespace ucxb::udp
