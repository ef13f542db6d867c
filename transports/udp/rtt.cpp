#include "transports/udp/rtt.h"

#include <algorithm>

namespace ucxb::udp {

RttEstimator::RttEstimator(DurationUs initialRtt)
    : smoothed_(initialRtt), variation_(initialRtt / 2) {}

void RttEstimator::onSample(DurationUs rtt, DurationUs ackDelay, DurationUs maxAckDelay) {
  latest_ = rtt;
  // min RTT ignores the ACK delay: it is the best the path has ever shown.
  min_ = samples_ == 0 ? rtt : std::min(min_, rtt);
  // Subtract the peer's ACK delay, but never below min RTT (a bogus delay cannot make the
  // path look faster than it has ever been).
  const DurationUs delay = std::min(ackDelay, maxAckDelay);
  const DurationUs adjusted = rtt >= min_ + delay ? rtt - delay : rtt;
  if (samples_ == 0) {
    smoothed_ = adjusted;
    variation_ = adjusted / 2;
  } else {
    const DurationUs deviation = smoothed_ > adjusted ? smoothed_ - adjusted : adjusted - smoothed_;
    variation_ = (3 * variation_ + deviation + 2) / 4;  // rttvar = 3/4 rttvar + 1/4 |srtt - rtt|
    smoothed_ = (7 * smoothed_ + adjusted + 4) / 8;     // srtt = 7/8 srtt + 1/8 rtt
  }
  ++samples_;
}

DurationUs RttEstimator::retransmissionTimeout(DurationUs maxAckDelay, DurationUs floor,
                                               DurationUs cap) const {
  const DurationUs rto = smoothed_ + std::max<DurationUs>(4 * variation_, 1) + maxAckDelay;
  return std::clamp(rto, floor, std::max(floor, cap));
}

}  // namespace ucxb::udp
