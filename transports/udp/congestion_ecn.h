// `ecn`: a DCQCN/DCTCP-style window driven by the switch's Congestion Experienced marks that
// the receiver echoes in its ACKs. alpha, an EWMA of the marked fraction per window of ACKs
// (alpha = (1 - g) alpha + g F, g = cc_ecn_gain), says how congested the queue is; once per
// round trip with marks the window shrinks by alpha / 2 (a lightly marked queue costs little,
// a saturated one half the window). Without marks: slow start until the first mark or loss,
// then one packet per round trip. Loss halves it, a timeout resets it to the floor.
#pragma once

#include "transports/udp/congestion.h"

namespace ucxb::udp {

class EcnCongestionControl final : public CongestionControl {
 public:
  EcnCongestionControl(uint64_t initialWindow, uint64_t minWindow, double gain);
  const char* name() const override { return "ecn"; }
  uint64_t windowPackets() const override { return window_.packets(); }
  void onPacketAcked(TimeUs, TimeUs) override {}
  void onAck(const AckSignal& ack) override;
  void onPacketsLost(TimeUs newestLostSentTime, TimeUs now) override;
  void onRetransmissionTimeout(TimeUs now) override;

  double alpha() const { return alpha_; }

 private:
  const double gain_;
  PacketWindow window_;
  double alpha_ = 1.0;  // DCTCP's start: assume congestion until the marks say otherwise
  bool slowStart_ = true;
  uint64_t ackedInRound_ = 0, markedInRound_ = 0;  // the current observation window
};

}  // namespace ucxb::udp
