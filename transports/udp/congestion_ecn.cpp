#include "transports/udp/congestion_ecn.h"

#include <algorithm>

namespace ucxb::udp {

EcnCongestionControl::EcnCongestionControl(uint64_t initialWindow, uint64_t minWindow,
                                           double gain)
    : gain_(gain), window_(initialWindow, minWindow) {}

void EcnCongestionControl::onAck(const AckSignal& ack) {
  window_.setRoundTrip(ack.smoothedRttUs);
  ackedInRound_ += ack.ackedPackets;
  markedInRound_ += ack.markedPackets;
  if (static_cast<double>(ackedInRound_) >= window_.size()) {
    const double fraction =
        std::min(1.0, static_cast<double>(markedInRound_) / static_cast<double>(ackedInRound_));
    alpha_ = (1.0 - gain_) * alpha_ + gain_ * fraction;
    ackedInRound_ = 0;
    markedInRound_ = 0;
  }
  if (ack.markedPackets > 0) {
    slowStart_ = false;
    window_.cut(1.0 - alpha_ / 2.0, ack.now);
    return;
  }
  const double perAck = slowStart_ ? 1.0 : 1.0 / window_.size();
  window_.grow(perAck * static_cast<double>(ack.ackedPackets));
}

void EcnCongestionControl::onPacketsLost(TimeUs, TimeUs now) {
  slowStart_ = false;
  window_.cut(0.5, now);
}

void EcnCongestionControl::onRetransmissionTimeout(TimeUs now) {
  slowStart_ = false;
  window_.reset(now);
}

}  // namespace ucxb::udp
