#include "transports/udp/congestion_coupled.h"

#include <algorithm>

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

double CoupledAimdCongestionControl::coupledIncrease() const {
  // RFC 6356 section 3, with the windows in packets: alpha / total =
  // max_j(w_j / rtt_j^2) / (sum_j w_j / rtt_j)^2. A path without an RTT yet is left out.
  double best = 0;
  double sum = 0;
  for (const Path& p : paths_) {
    if (p.rttUs == 0) continue;
    const double rtt = static_cast<double>(p.rttUs);
    best = std::max(best, p.window / (rtt * rtt));
    sum += p.window / rtt;
  }
  return sum > 0 ? best / (sum * sum) : 0;
}

void CoupledAimdCongestionControl::onPathAcked(uint32_t path, TimeUs sentTime, TimeUs) {
  Path& p = paths_[path % paths_.size()];
  // Packets sent before the last cut describe the old window: they do not grow the new one.
  if (p.cut && sentTime <= p.cutAt) return;
  double grow;
  if (p.window < p.slowStartThreshold) {
    grow = 1;
  } else {
    const double coupled = coupledIncrease();
    grow = coupled > 0 ? std::min(coupled, 1.0 / p.window) : 1.0 / p.window;
  }
  p.window = std::min(p.window + grow, static_cast<double>(kMaxCongestionWindow));
}

void CoupledAimdCongestionControl::onPathLost(uint32_t path, TimeUs newestLostSentTime, TimeUs now,
                                              uint64_t count) {
  Path& p = paths_[path % paths_.size()];
  if (p.cut && newestLostSentTime <= p.cutAt) {
    // Already reacted to this round; the losses join the cut's, for its undo.
    if (p.lossesSinceCut > 0) p.lossesSinceCut += count;
    return;
  }
  p.windowBeforeCut = p.window;
  p.thresholdBeforeCut = p.slowStartThreshold;
  p.lossesSinceCut = count;
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
