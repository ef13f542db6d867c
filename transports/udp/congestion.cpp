#include "transports/udp/congestion.h"

#include <algorithm>

#include "transports/udp/congestion_bdp.h"
#include "transports/udp/congestion_coupled.h"
#include "transports/udp/congestion_credit.h"
#include "transports/udp/congestion_delay.h"
#include "transports/udp/congestion_ecn.h"
#include "transports/udp/faults.h"
#include "transports/udp/policy_registry.h"

namespace ucxb::udp {
namespace {

struct Registration {
  const char* name;
  std::unique_ptr<CongestionControl> (*make)(const UdpConfig&);
};

// Adding a policy: write its class in a file of its own (congestion_delay.h is the example),
// add its row here.
const Registration kRegistry[] = {
    {"none", [](const UdpConfig&) -> std::unique_ptr<CongestionControl> {
       return std::make_unique<NoCongestionControl>();
     }},
    {"aimd", [](const UdpConfig& c) -> std::unique_ptr<CongestionControl> {
       // adaptive over several paths keeps a window per path (congestion_coupled.h): one
       // lossy path then cuts its own window, not the connection's.
       if (c.paths > 1 && c.pathPolicy == "adaptive") {
         return std::make_unique<CoupledAimdCongestionControl>(c.paths, c.initialCwndPackets,
                                                               c.minCwndPackets);
       }
       return std::make_unique<AimdCongestionControl>(c.initialCwndPackets, c.minCwndPackets);
     }},
    {"delay", [](const UdpConfig& c) -> std::unique_ptr<CongestionControl> {
       return std::make_unique<DelayCongestionControl>(c.initialCwndPackets, c.minCwndPackets,
                                                       c.ccTargetDelayUs, c.ccBeta);
     }},
    {"ecn", [](const UdpConfig& c) -> std::unique_ptr<CongestionControl> {
       return std::make_unique<EcnCongestionControl>(c.initialCwndPackets, c.minCwndPackets,
                                                     c.ccEcnGain);
     }},
    {"bdp", [](const UdpConfig& c) -> std::unique_ptr<CongestionControl> {
       return std::make_unique<BdpCapCongestionControl>(c.initialCwndPackets, c.minCwndPackets,
                                                        c.ccLinkMbps, c.mtuPayload);
     }},
    {"credit", [](const UdpConfig& c) -> std::unique_ptr<CongestionControl> {
       // Unused credit kept: four unsolicited windows (a receiver catching up after a late
       // wake-up grants more at once than one), and never less than two datagrams.
       const uint64_t datagram = c.mtuPayload + kFramingOverheadBytes;
       return std::make_unique<CreditCongestionControl>(
           c.ccCreditInitialBytes, c.ccCreditTimeoutUs,
           std::max<uint64_t>(4 * c.ccCreditInitialBytes, 2 * datagram));
     }},
};

}  // namespace

PacketWindow::PacketWindow(uint64_t initial, uint64_t minimum)
    : minimum_(static_cast<double>(std::max<uint64_t>(1, minimum))),
      window_(std::max(static_cast<double>(initial), minimum_)) {}

void PacketWindow::grow(double packets) {
  window_ = std::min(static_cast<double>(kMaxCongestionWindow), window_ + packets);
}

void PacketWindow::cut(double factor, TimeUs now) {
  if (cutBefore_ && now < lastCut_ + roundTripUs_) return;
  window_ = std::max(minimum_, window_ * factor);
  lastCut_ = now;
  cutBefore_ = true;
}

void PacketWindow::reset(TimeUs now) {
  window_ = minimum_;
  lastCut_ = now;
  cutBefore_ = true;
}

AimdCongestionControl::AimdCongestionControl(uint64_t initialWindow, uint64_t minWindow)
    : minWindow_(std::max<uint64_t>(1, minWindow)),
      window_(std::max(initialWindow, minWindow_)) {}

void AimdCongestionControl::onPacketAcked(TimeUs sentTime, TimeUs) {
  // Packets sent before the last reduction describe the old window: they do not grow the new one.
  if (reduced_ && sentTime <= recoveryStart_) return;
  if (window_ < slowStartThreshold_) {
    window_ = std::min(window_ + 1, kMaxCongestionWindow);
  } else if (++ackedTowardsIncrease_ >= window_) {
    ackedTowardsIncrease_ = 0;
    window_ = std::min(window_ + 1, kMaxCongestionWindow);
  }
}

void AimdCongestionControl::onPacketsLost(TimeUs newestLostSentTime, TimeUs now) {
  if (reduced_ && newestLostSentTime <= recoveryStart_) return;  // already reacted to this round
  reduce(now, std::max(window_ / 2, minWindow_));
}

void AimdCongestionControl::onRetransmissionTimeout(TimeUs now) {
  const uint64_t half = std::max(window_ / 2, minWindow_);
  reduce(now, minWindow_);
  slowStartThreshold_ = half;  // slow start back up to half the window that timed out
}

void AimdCongestionControl::reduce(TimeUs now, uint64_t newWindow) {
  window_ = newWindow;
  slowStartThreshold_ = newWindow;
  ackedTowardsIncrease_ = 0;
  reduced_ = true;
  recoveryStart_ = now;
}

const std::vector<std::string>& congestionControlNames() {
  static const std::vector<std::string> names = policyNames(kRegistry);
  return names;
}

std::unique_ptr<CongestionControl> makeCongestionControl(const UdpConfig& config) {
  return policyNamed(kRegistry, "congestion", config.congestion).make(config);
}

}  // namespace ucxb::udp
