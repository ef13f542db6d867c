// Round-trip time estimation and the retransmission timeout derived from it (RFC 6298's
// smoothing, with RFC 9002's use of the peer's reported ACK delay and a minimum RTT).
#pragma once

#include "transports/udp/udp_types.h"

namespace ucxb::udp {

class RttEstimator {
 public:
  explicit RttEstimator(DurationUs initialRtt);

  // One sample: the time from sending a packet to receiving the first ACK of it, and the delay
  // the peer reports having held that ACK (capped at `maxAckDelay`: a peer cannot inflate it).
  void onSample(DurationUs rtt, DurationUs ackDelay, DurationUs maxAckDelay);

  bool hasSample() const { return samples_ > 0; }
  uint64_t samples() const { return samples_; }
  DurationUs smoothed() const { return smoothed_; }
  DurationUs variation() const { return variation_; }
  DurationUs min() const { return min_; }  // 0 before the first sample
  DurationUs latest() const { return latest_; }

  // srtt + max(4 * rttvar, 1 us) + maxAckDelay, clamped to [floor, cap].
  DurationUs retransmissionTimeout(DurationUs maxAckDelay, DurationUs floor, DurationUs cap) const;

 private:
  DurationUs smoothed_;
  DurationUs variation_;
  DurationUs min_ = 0;
  DurationUs latest_ = 0;
  uint64_t samples_ = 0;
};

}  // namespace ucxb::udp
