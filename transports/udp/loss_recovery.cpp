#include "transports/udp/loss_recovery.h"

#include <algorithm>

#include "transports/udp/loss_recovery_rack.h"
#include "transports/udp/policy_registry.h"

namespace ucxb::udp {
namespace {

struct Registration {
  const char* name;
  std::unique_ptr<LossRecovery> (*make)();
};

// Adding a policy: write its class in loss_recovery.h or a file of its own, add its row here.
const Registration kRegistry[] = {
    {"selective_repeat", []() -> std::unique_ptr<LossRecovery> {
       return std::make_unique<SelectiveRepeat>();
     }},
    {"go_back_n", []() -> std::unique_ptr<LossRecovery> { return std::make_unique<GoBackN>(); }},
    {"rack", []() -> std::unique_ptr<LossRecovery> { return std::make_unique<Rack>(); }},
};

// Floor of the time threshold: below this, timer and scheduling noise would declare packets
// lost that are merely a little late.
constexpr DurationUs kMinLossDelayUs = 10;

}  // namespace

DurationUs LossRecovery::lossDelay(const RttEstimator& rtt) const {
  const DurationUs r = std::max(rtt.smoothed(), rtt.latest());
  return std::max(kMinLossDelayUs, r + r / 8);  // 9/8 RTT (RFC 9002's kTimeThreshold)
}

void GoBackN::chooseResends(std::span<const PacketNumber> lost,
                            std::span<const PacketNumber> inFlight,
                            std::vector<PacketNumber>& alsoResend) const {
  const PacketNumber firstLost = lost.front();
  // inFlight is ascending: everything after the first loss goes back out.
  auto it = std::upper_bound(inFlight.begin(), inFlight.end(), firstLost);
  alsoResend.insert(alsoResend.end(), it, inFlight.end());
}

const std::vector<std::string>& lossRecoveryNames() {
  static const std::vector<std::string> names = policyNames(kRegistry);
  return names;
}

std::unique_ptr<LossRecovery> makeLossRecovery(const UdpConfig& config) {
  return policyNamed(kRegistry, "loss_recovery", config.lossRecovery).make();
}

}  // namespace ucxb::udp
