#include "transports/udp/loss_recovery_rack.h"

#include <algorithm>

namespace ucxb::udp {
namespace {

constexpr uint32_t kMaxSteps = 64;
constexpr uint32_t kRecoveriesBeforeReset = 16;  // RFC 8985's reo_wnd_persist
constexpr DurationUs kMinLossDelayUs = 10;

}  // namespace

DurationUs Rack::lossDelay(const RttEstimator& rtt) const {
  const DurationUs window = std::min<DurationUs>(steps_ * (rtt.min() / 4), rtt.smoothed());
  return std::max(kMinLossDelayUs, rtt.latest() + window);
}

void Rack::onSpuriousRetransmission() {
  steps_ = std::min(steps_ + 1, kMaxSteps);
  recoveriesSinceGrowth_ = 0;
}

void Rack::onLossDeclared() {
  if (++recoveriesSinceGrowth_ >= kRecoveriesBeforeReset) {
    steps_ = 1;
    recoveriesSinceGrowth_ = 0;
  }
}

}  // namespace ucxb::udp
