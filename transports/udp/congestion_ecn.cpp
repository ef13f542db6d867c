#include "transports/udp/congestion_ecn.h"

#include <algorithm>
#include <cmath>

namespace ucxb::udp {
namespace {

constexpr double kMaxWindow = double(uint64_t{1} << 24);

}  // namespace

EcnCongestionControl::EcnCongestionControl(uint64_t initialWindow, uint64_t minWindow,
                                           double gain)
    : minWindow_(static_cast<double>(std::max<uint64_t>(1, minWindow))),
      gain_(gain),
      window_(std::max(static_cast<double>(initialWindow), minWindow_)) {}

uint64_t EcnCongestionControl::windowPackets() const {
  return static_cast<uint64_t>(std::floor(window_));
}

void EcnCongestionControl::onAck(const AckSignal& ack) {
  if (ack.smoothedRttUs > 0) roundTripUs_ = ack.smoothedRttUs;
  ackedInRound_ += ack.ackedPackets;
  markedInRound_ += ack.markedPackets;
  if (static_cast<double>(ackedInRound_) >= window_) {
    const double fraction =
        std::min(1.0, static_cast<double>(markedInRound_) / static_cast<double>(ackedInRound_));
    alpha_ = (1.0 - gain_) * alpha_ + gain_ * fraction;
    ackedInRound_ = 0;
    markedInRound_ = 0;
  }
  if (ack.markedPackets > 0) {
    slowStart_ = false;
    decrease(1.0 - alpha_ / 2.0, ack.now);
    return;
  }
  const double growth = slowStart_ ? 1.0 : 1.0 / window_;
  window_ = std::min(kMaxWindow, window_ + growth * static_cast<double>(ack.ackedPackets));
}

void EcnCongestionControl::onPacketsLost(TimeUs, TimeUs now) {
  slowStart_ = false;
  decrease(0.5, now);
}

void EcnCongestionControl::onRetransmissionTimeout(TimeUs now) {
  slowStart_ = false;
  window_ = minWindow_;
  lastDecrease_ = now;
  decreased_ = true;
}

void EcnCongestionControl::decrease(double factor, TimeUs now) {
  if (decreased_ && now < lastDecrease_ + roundTripUs_) return;
  window_ = std::max(minWindow_, window_ * factor);
  lastDecrease_ = now;
  decreased_ = true;
}

}  // namespace ucxb::udp
