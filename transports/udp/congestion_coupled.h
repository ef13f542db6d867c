// `aimd` under path_policy=adaptive with several paths: one Reno window per path, their
// increases coupled as MPTCP's LIA couples them (RFC 6356), so that a loss on one path
// halves that path's window only, and the connection as a whole takes no more of a shared
// bottleneck than one Reno flow on its best path would.
//
// Why per path: with one window for the connection, the 5% random loss of one path of four
// halves the window that all four share, and moving the packets off that path gives up its
// capacity (a path that loses 5% at random still delivers 95% of its rate). With a window of
// its own, the lossy path runs at what its loss allows (Reno: about sqrt(3/2 / p) packets per
// round trip, 5-6 at 5%) and the three others are not cut by it; the path selector
// (path_selector.h) sends each packet on a path whose window has room.
//
// Per path: slow start (+1 per ACK) up to its threshold, then LIA's coupled increase, for
// each ACK on path i, min(alpha / total, 1 / w_i) packets, where total is the sum of the
// windows and alpha = total x max_j(w_j / rtt_j^2) / (sum_j w_j / rtt_j)^2; halved once per
// round trip of its own with losses (losses of packets sent before the last cut do not cut
// again). A cut whose every loss a late ACK shows was none (the packet was held up, not
// lost) is undone: the per-path time threshold takes packets late behind a queue for lost,
// and a window that halves for them keeps a loaded path below its link's rate. A
// retransmission timeout, which blames no path, takes every window to the floor.
#pragma once

#include <cstdint>
#include <vector>

#include "transports/udp/congestion.h"

namespace ucxb::udp {

class CoupledAimdCongestionControl final : public CongestionControl {
 public:
  // Every path starts at `initialWindow` / paths (at least `minWindow`): the connection's
  // first flight is as large as with one window, whatever the number of paths.
  CoupledAimdCongestionControl(uint32_t paths, uint64_t initialWindow, uint64_t minWindow);
  const char* name() const override { return "aimd"; }
  // The sum of the paths' windows; whether one path has room is pathHasRoom().
  uint64_t windowPackets() const override;
  CoupledAimdCongestionControl* pathWindows() override { return this; }

  // The connection calls the per-path forms below; the shared ones map onto them (a packet
  // without a path is path 0's) so that the class stands alone as a policy.
  void onPacketAcked(TimeUs sentTime, TimeUs now) override { onPathAcked(0, sentTime, now); }
  void onPacketsLost(TimeUs newestLostSentTime, TimeUs now) override {
    onPathLost(0, newestLostSentTime, now, 1);
  }
  void onRetransmissionTimeout(TimeUs now) override;

  uint32_t paths() const { return static_cast<uint32_t>(paths_.size()); }
  uint64_t pathWindowPackets(uint32_t path) const;
  bool pathHasRoom(uint32_t path, uint64_t pathInFlight) const {
    return pathInFlight < pathWindowPackets(path);
  }
  // The path's smoothed RTT (what LIA weighs the paths by); ignored while 0.
  void setPathRtt(uint32_t path, DurationUs rttUs);
  void onPathAcked(uint32_t path, TimeUs sentTime, TimeUs now);
  // `count` packets of `path` declared lost at once, the newest sent at newestLostSentTime.
  void onPathLost(uint32_t path, TimeUs newestLostSentTime, TimeUs now, uint64_t count);
  // A packet of `path` that loss detection declared lost was acknowledged after all.
  void onPathSpuriousLoss(uint32_t path);

 private:
  struct Path {
    double window;
    double slowStartThreshold;
    DurationUs rttUs = 0;
    bool cut = false;       // whether cutAt is meaningful
    TimeUs cutAt = 0;       // when the window was last cut
    // What the last cut took, for its undo: the window and threshold before it, and how many
    // of the losses it reacted to are not yet shown spurious (0: nothing to undo).
    double windowBeforeCut = 0;
    double thresholdBeforeCut = 0;
    uint64_t lossesSinceCut = 0;
  };
  // LIA's alpha / total: the coupled increase per ACK, before the per-path cap 1 / w_i.
  double coupledIncrease() const;

  const double minWindow_;
  std::vector<Path> paths_;
};

}  // namespace ucxb::udp
