#include "transports/udp/path_selector.h"

#include <algorithm>

namespace ucxb::udp {
namespace {

// adaptive: a loss halves a path's weight; each ACK gives back kRecover of what it lacks. At
// loss rate p the weight settles near 2 kRecover (1 - p) / p: about 0.2 at 5% loss, so a lossy
// path of four carries some 6% of the packets instead of 25%, and still enough of them to
// notice when it heals.
constexpr double kLossFactor = 0.5;
constexpr double kRecover = 0.005;
constexpr double kMinWeight = 0.02;
// A path's RTT this many times the best path's halves its share (in proportion beyond 1x).
constexpr double kRttSlack = 2.0;

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

double PathSelector::effectiveWeight(const Path& p, DurationUs bestRtt) const {
  double w = p.weight;
  if (bestRtt > 0 && p.stats.rttSmoothedUs > 0) {
    const double ratio = static_cast<double>(p.stats.rttSmoothedUs) /
                         (kRttSlack * static_cast<double>(bestRtt));
    if (ratio > 1.0) w /= ratio;
  }
  return std::max(w, kMinWeight);
}

uint32_t PathSelector::next(uint32_t avoid) {
  const uint32_t n = paths();
  if (n == 1 || policy_ == Policy::kSingle) return 0;
  if (policy_ == Policy::kSpray) {
    uint32_t p = turn_;
    turn_ = (turn_ + 1) % n;
    if (p == avoid) {
      p = turn_;
      turn_ = (turn_ + 1) % n;
    }
    return p;
  }
  // Smooth weighted round-robin (deterministic, interleaves paths rather than bursting).
  DurationUs bestRtt = 0;
  for (const Path& p : paths_) {
    if (p.stats.rttSmoothedUs > 0 && (bestRtt == 0 || p.stats.rttSmoothedUs < bestRtt)) {
      bestRtt = p.stats.rttSmoothedUs;
    }
  }
  double total = 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (i == avoid) continue;
    Path& p = paths_[i];
    const double w = effectiveWeight(p, bestRtt);
    p.credit += w;
    total += w;
  }
  uint32_t best = avoid == 0 ? 1 : 0;
  for (uint32_t i = 0; i < n; ++i) {
    if (i != avoid && paths_[i].credit > paths_[best].credit) best = i;
  }
  paths_[best].credit -= total;
  return best;
}

uint32_t PathSelector::choose(bool retransmission) {
  return next(retransmission ? lastLost_ : UINT32_MAX);
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
    if (paths_[i].weight > paths_[best].weight) best = i;
  }
  return best;
}

void PathSelector::onSent(uint32_t path, bool retransmission) {
  PathStats& s = paths_[path].stats;
  ++s.packetsSent;
  if (retransmission) ++s.retransmitted;
}

void PathSelector::onAcked(uint32_t path, DurationUs rttUs) {
  Path& p = paths_[path];
  ++p.stats.acked;
  // RFC 6298's 1/8 gain, per path.
  p.stats.rttSmoothedUs =
      p.stats.rttSmoothedUs == 0 ? rttUs : (7 * p.stats.rttSmoothedUs + rttUs) / 8;
  p.weight += kRecover * (1.0 - p.weight);
  p.stats.weightPermille = static_cast<uint64_t>(p.weight * 1000.0 + 0.5);
}

void PathSelector::onLost(uint32_t path) {
  Path& p = paths_[path];
  ++p.stats.lost;
  lastLost_ = path;
  p.weight = std::max(kMinWeight, p.weight * kLossFactor);
  p.stats.weightPermille = static_cast<uint64_t>(p.weight * 1000.0 + 0.5);
}

}  // namespace ucxb::udp
