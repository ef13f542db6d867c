#include "transports/udp/congestion_delay.h"

#include <algorithm>

namespace ucxb::udp {
namespace {

// A cut never takes more than half the window (Swift's max_mdf): one noisy sample must not
// collapse it.
constexpr double kMaxDecrease = 0.5;
// Packets added per round trip below the target.
constexpr double kAdditiveIncrease = 1.0;

}  // namespace

DelayCongestionControl::DelayCongestionControl(uint64_t initialWindow, uint64_t minWindow,
                                               DurationUs targetDelayUs, double beta)
    : targetDelayUs_(targetDelayUs), beta_(beta), window_(initialWindow, minWindow) {}

void DelayCongestionControl::onAck(const AckSignal& ack) {
  window_.setRoundTrip(ack.smoothedRttUs);
  const DurationUs queueing = ack.rttSampleUs > ack.minRttUs ? ack.rttSampleUs - ack.minRttUs : 0;
  // Without a sample (queueing 0) the window grows as below the target.
  if (queueing <= targetDelayUs_) {
    window_.grow(kAdditiveIncrease * static_cast<double>(ack.ackedPackets) / window_.size());
    return;
  }
  const double excess = static_cast<double>(queueing - targetDelayUs_) / queueing;
  window_.cut(std::max(1.0 - beta_ * excess, 1.0 - kMaxDecrease), ack.now);
}

void DelayCongestionControl::onPacketsLost(TimeUs, TimeUs now) {
  window_.cut(1.0 - kMaxDecrease, now);
}

}  // namespace ucxb::udp
