#include "transports/udp/path_selector.h"

#include <algorithm>

namespace ucxb::udp {
namespace {

// adaptive: each path keeps an estimate of the fraction of its packets that are lost (an
// exponentially weighted average over its own packets, acked 0, lost 1, gain kLossGain), and
// its weight is 1 / (1 + kLossPenalty x the estimate's excess over the best path's): 0.9 at
// 0.02% more loss, 0.2 at 1%, 0.05 at 5% (a lossy path of four then carries some 1.6% of the
// packets instead of 25%). The excess, because what every path suffers alike (a loaded host
// delaying packets past the time threshold) tells no path from another. The estimate
// is per connection and outlives ops, so what one op learned serves the next. A path never
// drops below kMinWeight, so it keeps a trickle of packets whose ACKs show when it heals:
// each ACK takes kLossGain of the estimate away, and 50 ACKs in a row bring a 5% path back
// above half weight.
constexpr double kLossGain = 1.0 / 16;
constexpr double kLossPenalty = 400.0;
constexpr double kMinWeight = 0.005;
// A path's RTT this many times the best path's halves its share (in proportion beyond 1x).
constexpr double kRttSlack = 2.0;

double lossWeight(double lossRate) { return 1.0 / (1.0 + kLossPenalty * lossRate); }

// The loss-driven weight as the stats show it (1000 = full).
uint64_t permille(double lossRate) {
  return static_cast<uint64_t>(1000.0 * lossWeight(lossRate) + 0.5);
}

}  // namespace

const std::vector<std::string>& pathPolicyNames() {
  static const std::vector<std::string> names = {"single", "spray", "adaptive"};
  return names;
}

PathSelector::PathSelector(uint32_t paths, const std::string& policy)
    : policy_(policy == "spray"      ? Policy::kSpray
              : policy == "adaptive" ? Policy::kAdaptive
                                     : Policy::kSingle),
      paths_(std::max<uint32_t>(paths, 1)) {}

double PathSelector::effectiveWeight(const Path& p, DurationUs bestRtt, double bestLoss) const {
  // With a window per path, the window already prices the path's loss (a 5% path runs at
  // what Reno allows it); weighing it down as well would give up that rate.
  double w = windowPerPath_ ? 1.0 : lossWeight(p.lossRate - bestLoss);
  if (bestRtt > 0 && p.stats.rttSmoothedUs > 0) {
    const double ratio = static_cast<double>(p.stats.rttSmoothedUs) /
                         (kRttSlack * static_cast<double>(bestRtt));
    if (ratio > 1.0) w /= ratio;
  }
  return std::max(w, kMinWeight);
}

uint32_t PathSelector::next(uint32_t allowed) {
  const uint32_t n = paths();
  if (n == 1 || policy_ == Policy::kSingle) return 0;
  const auto isAllowed = [allowed](uint32_t p) { return ((allowed >> p) & 1u) != 0; };
  if (policy_ == Policy::kSpray) {
    // The next allowed path in turn (choose() leaves at least one allowed).
    for (;;) {
      const uint32_t p = turn_;
      turn_ = (turn_ + 1) % n;
      if (isAllowed(p)) return p;
    }
  }
  // Smooth weighted round-robin (deterministic, interleaves paths rather than bursting).
  DurationUs bestRtt = 0;
  double bestLoss = 1.0;
  for (const Path& p : paths_) {
    if (p.stats.rttSmoothedUs > 0 && (bestRtt == 0 || p.stats.rttSmoothedUs < bestRtt)) {
      bestRtt = p.stats.rttSmoothedUs;
    }
    bestLoss = std::min(bestLoss, p.lossRate);
  }
  double total = 0;
  uint32_t best = UINT32_MAX;
  for (uint32_t i = 0; i < n; ++i) {
    if (!isAllowed(i)) continue;
    Path& p = paths_[i];
    const double w = effectiveWeight(p, bestRtt, bestLoss);
    p.credit += w;
    total += w;
    if (best == UINT32_MAX || p.credit > paths_[best].credit) best = i;
  }
  paths_[best].credit -= total;
  return best;
}

uint32_t PathSelector::choose(bool retransmission, uint32_t allowed) {
  const uint32_t n = paths();
  const uint32_t every = (uint32_t{1} << n) - 1;  // n <= kMaxPaths < 32
  allowed &= every;
  if (allowed == 0) allowed = every;
  if (retransmission && lastLost_ < n) {
    const uint32_t others = allowed & ~(uint32_t{1} << lastLost_);
    if (others != 0) allowed = others;
  }
  return next(allowed);
}

uint32_t PathSelector::chooseControl() {
  const uint32_t n = paths();
  if (n == 1 || policy_ == Policy::kSingle) return 0;
  if (policy_ == Policy::kSpray) {
    const uint32_t p = controlTurn_;
    controlTurn_ = (controlTurn_ + 1) % n;
    return p;
  }
  uint32_t best = 0;
  for (uint32_t i = 1; i < n; ++i) {
    if (paths_[i].lossRate < paths_[best].lossRate) best = i;
  }
  return best;
}

void PathSelector::onSent(uint32_t path, bool retransmission) {
  PathStats& s = paths_[path].stats;
  ++s.packetsSent;
  if (retransmission) ++s.retransmitted;
}

void PathSelector::onAcked(uint32_t path, DurationUs rttUs, TimeUs sentTime) {
  Path& p = paths_[path];
  ++p.stats.acked;
  // A packet held up and acknowledged after later ones says nothing of the queue now.
  if (sentTime >= p.latestSentTime) {
    p.latestRttUs = rttUs;
    p.latestSentTime = sentTime;
  }
  // RFC 6298's 1/8 gain, per path.
  p.stats.rttSmoothedUs =
      p.stats.rttSmoothedUs == 0 ? rttUs : (7 * p.stats.rttSmoothedUs + rttUs) / 8;
  p.lossRate -= kLossGain * p.lossRate;
  p.stats.weightPermille = permille(p.lossRate);
}

void PathSelector::onLost(uint32_t path, bool byTimeout) {
  Path& p = paths_[path];
  ++p.stats.lost;
  // A timeout declares everything in flight lost, on every path at once: it says the peer (or
  // this host's scheduler) went quiet, not which path loses packets. Counted, it reset what
  // adaptive had learned whenever a loaded host starved the progress thread.
  if (byTimeout) return;
  lastLost_ = path;
  p.lossRate += kLossGain * (1.0 - p.lossRate);
  p.stats.weightPermille = permille(p.lossRate);
}

void PathSelector::onSpuriousLoss(uint32_t path) {
  // What onLost added, about kLossGain; the ACKs since have shrunk it a little, so this takes
  // back slightly more, which the floor at 0 bounds.
  Path& p = paths_[path % paths_.size()];
  p.lossRate = std::max(0.0, p.lossRate - kLossGain);
  p.stats.weightPermille = permille(p.lossRate);
}

DurationUs PathSelector::lossDelay(uint32_t path, bool latestCounts) const {
  const Path& p = paths_[path % paths_.size()];
  const DurationUs rtt =
      latestCounts ? std::max(p.stats.rttSmoothedUs, p.latestRttUs) : p.stats.rttSmoothedUs;
  return rtt + rtt / 8;
}

}  // namespace ucxb::udp
