// `rack`: selective repeat with RACK-style time-based loss detection (RFC 8985). A packet is
// lost only when a packet sent after it has been acknowledged and it is still unacknowledged
// the latest RTT plus a reordering window later; no count of later packets declares it lost,
// so reordering (a sprayed, multipath network's normal state) within the window costs no
// spurious retransmission. The window starts at a quarter of the minimum RTT, grows by as
// much for every ACK that reveals a spurious retransmission (up to the smoothed RTT), and
// falls back after 16 loss recoveries without one.
#pragma once

#include <cstdint>

#include "transports/udp/loss_recovery.h"

namespace ucxb::udp {

class Rack final : public LossRecovery {
 public:
  const char* name() const override { return "rack"; }
  void chooseResends(std::span<const PacketNumber>, std::span<const PacketNumber>,
                     std::vector<PacketNumber>&) const override {}
  uint32_t reorderThreshold(uint32_t) const override { return UINT32_MAX; }
  DurationUs lossDelay(const RttEstimator& rtt) const override;
  void onSpuriousRetransmission() override;
  void onLossDeclared() override;

  uint32_t windowSteps() const { return steps_; }

 private:
  uint32_t steps_ = 1;               // the reordering window in quarters of the min RTT
  uint32_t recoveriesSinceGrowth_ = 0;
};

}  // namespace ucxb::udp
