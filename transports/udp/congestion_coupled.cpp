#include "transports/udp/congestion_coupled.h"

#include <algorithm>
#include <cmath>

namespace ucxb::udp {

CoupledAimdCongestionControl::CoupledAimdCongestionControl(uint32_t paths, uint64_t initialWindow,
                                                           uint64_t minWindow)
    : minWindow_(static_cast<double>(std::max<uint64_t>(1, minWindow))) {
  const uint32_t n = std::max<uint32_t>(1, paths);
  const double start =
      std::max(minWindow_, static_cast<double>(initialWindow) / static_cast<double>(n));
  paths_.assign(n, Path{start, static_cast<double>(kMaxCongestionWindow)});
}

uint64_t CoupledAimdCongestionControl::windowPackets() const {
  uint64_t total = 0;
  for (uint32_t p = 0; p < paths(); ++p) total += pathWindowPackets(p);
  return total;
}

uint64_t CoupledAimdCongestionControl::pathWindowPackets(uint32_t path) const {
  return static_cast<uint64_t>(paths_[path % paths_.size()].window);
}

void CoupledAimdCongestionControl::setPathRtt(uint32_t path, DurationUs rttUs) {
  if (rttUs > 0) paths_[path % paths_.size()].rttUs = rttUs;
}

double CoupledAimdCongestionControl::coupledIncrease(uint32_t path) const {
  // Windows in packets, RTTs in us; a path without an RTT yet is left out.
  double rate = 0;        // sum_p w_p / rtt_p
  double bestQuality = 0;  // max_p l_p / rtt_p^2, l_p packets acknowledged between cuts
  double largest = 0;      // max_p w_p, in whole packets
  for (const Path& p : paths_) {
    if (p.rttUs == 0) continue;
    const double rtt = static_cast<double>(p.rttUs);
    rate += p.window / rtt;
    bestQuality = std::max(bestQuality, quality(p));
    largest = std::max(largest, std::floor(p.window));
  }
  const Path& r = paths_[path % paths_.size()];
  if (r.rttUs == 0 || rate <= 0) return 1.0 / r.window;  // uncoupled Reno until RTTs are known
  // M: the paths of the largest window; B \ M: the best paths that are not in M. Windows
  // count in whole packets here, as the window the path may fill does: compared as real
  // numbers, the largest would change hands with every fraction of a packet, and each path
  // in turn would gain as "best but not largest" what it never gives back as the largest.
  uint32_t largestCount = 0;
  uint32_t bestNotLargest = 0;
  for (const Path& p : paths_) {
    if (p.rttUs == 0) continue;
    if (std::floor(p.window) >= largest) {
      ++largestCount;
    } else if (quality(p) >= bestQuality) {
      ++bestNotLargest;
    }
  }
  const double n = static_cast<double>(paths_.size());
  double shift = 0;  // OLIA's epsilon_r
  if (bestNotLargest > 0) {
    if (std::floor(r.window) >= largest) {
      shift = -1.0 / (n * largestCount);
    } else if (quality(r) >= bestQuality) {
      shift = 1.0 / (n * bestNotLargest);
    }
  }
  const double rtt = static_cast<double>(r.rttUs);
  return r.window / (rtt * rtt) / (rate * rate) + shift / r.window;
}

double CoupledAimdCongestionControl::quality(const Path& p) {
  const double rtt = static_cast<double>(p.rttUs);
  return std::max(p.ackedBetweenCuts, p.ackedSinceCut) / (rtt * rtt);
}

void CoupledAimdCongestionControl::onPathAcked(uint32_t path, TimeUs sentTime, TimeUs) {
  Path& p = paths_[path % paths_.size()];
  // Packets sent before the last cut describe the old window: they do not grow the new one.
  if (p.cut && sentTime <= p.cutAt) return;
  p.ackedSinceCut += 1;
  const double grow = p.window < p.slowStartThreshold ? 1 : coupledIncrease(path);
  p.window = std::clamp(p.window + grow, minWindow_, static_cast<double>(kMaxCongestionWindow));
  // A window that OLIA shrinks stays in congestion avoidance: below its threshold it would
  // slow-start back by a packet per ACK.
  if (grow < 0) p.slowStartThreshold = std::min(p.slowStartThreshold, p.window);
}

bool CoupledAimdCongestionControl::onPathLost(uint32_t path, TimeUs newestLostSentTime, TimeUs now,
                                              uint64_t count) {
  Path& p = paths_[path % paths_.size()];
  if (p.cut && newestLostSentTime <= p.cutAt) {
    // Already reacted to this round; the losses join the cut's, for its undo.
    if (p.lossesSinceCut > 0) p.lossesSinceCut += count;
    return false;
  }
  cut(p, now, count);
  return true;
}

bool CoupledAimdCongestionControl::onPathQueue(uint32_t path, TimeUs sentTime, TimeUs now,
                                               double floorPackets) {
  Path& p = paths_[path % paths_.size()];
  if (p.cut && sentTime <= p.cutAt) return false;  // the queue of a round already cut for
  if (p.window <= floorPackets) return false;
  cut(p, now, 0);  // nothing a late ACK could show spurious: never undone
  p.window = std::max(p.window, floorPackets);
  p.slowStartThreshold = p.window;
  return true;
}

void CoupledAimdCongestionControl::cut(Path& p, TimeUs now, uint64_t losses) {
  p.windowBeforeCut = p.window;
  p.thresholdBeforeCut = p.slowStartThreshold;
  p.lossesSinceCut = losses;
  p.ackedBetweenCutsBeforeCut = p.ackedBetweenCuts;
  p.ackedBetweenCuts = p.ackedSinceCut;
  p.ackedSinceCut = 0;
  p.window = std::max(minWindow_, p.window / 2);
  p.slowStartThreshold = p.window;
  p.cut = true;
  p.cutAt = now;
}

void CoupledAimdCongestionControl::onPathSpuriousLoss(uint32_t path) {
  Path& p = paths_[path % paths_.size()];
  if (p.lossesSinceCut == 0 || --p.lossesSinceCut > 0) return;
  // Every loss the last cut reacted to was a late packet: the path was not congested.
  p.window = std::max(p.window, p.windowBeforeCut);
  p.slowStartThreshold = std::max(p.slowStartThreshold, p.thresholdBeforeCut);
  // Nor did the interval between losses end.
  p.ackedSinceCut += p.ackedBetweenCuts;
  p.ackedBetweenCuts = p.ackedBetweenCutsBeforeCut;
}

void CoupledAimdCongestionControl::onRetransmissionTimeout(TimeUs now) {
  for (Path& p : paths_) {
    p.slowStartThreshold = std::max(minWindow_, p.window / 2);
    p.window = minWindow_;
    p.lossesSinceCut = 0;  // a timeout is not undone
    p.cut = true;
    p.cutAt = now;
  }
}

}  // namespace ucxb::udp
