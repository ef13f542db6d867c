// `aimd` under path_policy=adaptive with several paths: one Reno window per path, their
// increases coupled as MPTCP's OLIA couples them (Khalili et al., "MPTCP is not
// Pareto-optimal", 2012), so that a loss on one path halves that path's window only, and the
// connection as a whole takes no more of a shared bottleneck than one Reno flow on its best
// path would.
//
// Why per path: with one window for the connection, the 5% random loss of one path of four
// halves the window that all four share, and moving the packets off that path gives up its
// capacity (a path that loses 5% at random still delivers 95% of its rate). With a window of
// its own, the lossy path runs at what its loss allows and the three others are not cut by
// it; the path selector (path_selector.h) sends each packet on a path whose window has room.
//
// Per path: slow start (+1 per ACK) up to its threshold, then OLIA's increase, for each ACK
// on path r, (w_r / rtt_r^2) / (sum_p w_p / rtt_p)^2 + e_r / w_r. The first term is what
// keeps the connection as gentle as one Reno flow; e_r moves window between paths: with n
// paths, the paths that look best (the most packets acknowledged between two cuts per RTT
// squared: Reno's rate there would be highest) but whose window is not the largest gain
// 1 / (n x their count) per round trip, taken from the paths of the largest window. Why
// OLIA rather than LIA (RFC 6356): LIA hands every path the increase of the paths of the
// largest window per RTT squared, so a path halved by random loss regrows at a fraction of
// a packet per round trip and sits at the floor (docs/udp-protocol.md has the figures).
// Halved once per round trip of its own with losses (losses of packets sent before the last
// cut do not cut again). A cut whose every loss a late ACK shows was none (the packet was
// held up, not lost) is undone: the per-path time threshold takes packets late behind a queue
// for lost, and a window that halves for them keeps a loaded path below its link's rate. A
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
  // The path's smoothed RTT (what OLIA weighs the paths by); ignored while 0.
  void setPathRtt(uint32_t path, DurationUs rttUs);
  void onPathAcked(uint32_t path, TimeUs sentTime, TimeUs now);
  // `count` packets of `path` declared lost at once, the newest sent at newestLostSentTime.
  // True if the window was cut (not for a round already cut for).
  bool onPathLost(uint32_t path, TimeUs newestLostSentTime, TimeUs now, uint64_t count);
  // A packet of `path` that loss detection declared lost was acknowledged after all.
  void onPathSpuriousLoss(uint32_t path);
  // The peer's receive timestamps show a standing queue on `path` (a packet sent at
  // `sentTime` waited in it longer than the connection allows, reliability.cpp): cut as for
  // a loss, once per round trip, before the queue overflows and a loss costs a resend; not
  // below `floorPackets` (the path's bandwidth-delay product: a window that it fills keeps no
  // queue standing). True if the window was cut.
  bool onPathQueue(uint32_t path, TimeUs sentTime, TimeUs now, double floorPackets = 0);

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
    // Packets acknowledged between the last two cuts, and since the last one: OLIA's measure
    // of how far apart the path's losses are.
    double ackedBetweenCuts = 0;
    double ackedSinceCut = 0;
    double ackedBetweenCutsBeforeCut = 0;  // for the undo: the interval the cut ended
  };
  // Halves the window (a congestion event); `losses`: how many lost packets it answers, for
  // its undo (0: not undone).
  void cut(Path& p, TimeUs now, uint64_t losses);
  // OLIA's increase per ACK on `path` in congestion avoidance (packets; may be negative).
  double coupledIncrease(uint32_t path) const;
  // OLIA's measure of a path: packets acknowledged between cuts (the larger of the last
  // interval and the current one) per RTT squared, what Reno's rate there grows with.
  static double quality(const Path& p);

  const double minWindow_;
  std::vector<Path> paths_;
};

}  // namespace ucxb::udp
