#include "transports/udp/congestion_delay.h"

#include <algorithm>
#include <cmath>

namespace ucxb::udp {
namespace {

// A decrease never takes more than half the window (Swift's max_mdf): one noisy sample must
// not collapse it.
constexpr double kMaxDecrease = 0.5;
// Packets added per round trip below the target.
constexpr double kAdditiveIncrease = 1.0;
// Far beyond any send window; only keeps an application-limited window from growing forever.
constexpr double kMaxWindow = double(uint64_t{1} << 24);

}  // namespace

DelayCongestionControl::DelayCongestionControl(uint64_t initialWindow, uint64_t minWindow,
                                               DurationUs targetDelayUs, double beta)
    : minWindow_(static_cast<double>(std::max<uint64_t>(1, minWindow))),
      targetDelayUs_(targetDelayUs),
      beta_(beta),
      window_(std::max(static_cast<double>(initialWindow), minWindow_)) {}

uint64_t DelayCongestionControl::windowPackets() const {
  return static_cast<uint64_t>(std::floor(window_));
}

void DelayCongestionControl::onAck(const AckSignal& ack) {
  if (ack.smoothedRttUs > 0) roundTripUs_ = ack.smoothedRttUs;
  if (ack.rttSampleUs == 0) {
    // No delay measured: grow as below the target, the window's share of a round trip.
    window_ = std::min(kMaxWindow, window_ + kAdditiveIncrease * ack.ackedPackets / window_);
    return;
  }
  const DurationUs queueing = ack.rttSampleUs > ack.minRttUs ? ack.rttSampleUs - ack.minRttUs : 0;
  if (queueing <= targetDelayUs_) {
    window_ = std::min(kMaxWindow, window_ + kAdditiveIncrease * ack.ackedPackets / window_);
    return;
  }
  const double excess = static_cast<double>(queueing - targetDelayUs_) / queueing;
  decrease(std::max(1.0 - beta_ * excess, 1.0 - kMaxDecrease), ack.now);
}

void DelayCongestionControl::onPacketsLost(TimeUs, TimeUs now) {
  decrease(1.0 - kMaxDecrease, now);
}

void DelayCongestionControl::onRetransmissionTimeout(TimeUs now) {
  window_ = minWindow_;
  lastDecrease_ = now;
  decreased_ = true;
}

void DelayCongestionControl::decrease(double factor, TimeUs now) {
  if (decreased_ && now < lastDecrease_ + roundTripUs_) return;
  window_ = std::max(minWindow_, window_ * factor);
  lastDecrease_ = now;
  decreased_ = true;
}

}  // namespace ucxb::udp
