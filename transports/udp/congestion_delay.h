// `delay`: a Swift/TIMELY-style window driven by the queueing delay each ACK measures (its RTT
// sample less the path's minimum RTT), the worked example of a policy in one file
// (docs/udp-protocol.md#writing-a-congestion-policy-in-one-file). Below the target delay the
// window grows by one packet per round trip; above it, it shrinks at most once per round
// trip, in proportion to how far the delay overshoots: w *= 1 - beta * (delay - target) /
// delay, never by more than half. Loss halves it (once per round trip), a timeout resets it
// to the floor. A queue that never builds past the target drops nothing, which is what an
// incast wants.
#pragma once

#include "transports/udp/congestion.h"

namespace ucxb::udp {

class DelayCongestionControl final : public CongestionControl {
 public:
  DelayCongestionControl(uint64_t initialWindow, uint64_t minWindow, DurationUs targetDelayUs,
                         double beta);
  const char* name() const override { return "delay"; }
  uint64_t windowPackets() const override { return window_.packets(); }
  void onPacketAcked(TimeUs, TimeUs) override {}
  void onAck(const AckSignal& ack) override;
  void onPacketsLost(TimeUs newestLostSentTime, TimeUs now) override;
  void onRetransmissionTimeout(TimeUs now) override { window_.reset(now); }

 private:
  const DurationUs targetDelayUs_;
  const double beta_;
  PacketWindow window_;
};

}  // namespace ucxb::udp
