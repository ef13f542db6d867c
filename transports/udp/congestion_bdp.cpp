#include "transports/udp/congestion_bdp.h"

#include <algorithm>

namespace ucxb::udp {

BdpCapCongestionControl::BdpCapCongestionControl(uint64_t initialWindow, uint64_t minWindow,
                                                 uint64_t linkMbps, uint64_t packetBytes)
    : minWindow_(std::max<uint64_t>(1, minWindow)),
      linkMbps_(linkMbps),
      packetBytes_(std::max<uint64_t>(1, packetBytes)),
      window_(std::max(initialWindow, minWindow_)) {}

void BdpCapCongestionControl::onAck(const AckSignal& ack) {
  if (ack.minRttUs == 0) return;
  // Mbit/s x us = bits; one more packet than the product rounds down to keeps the pipe full.
  const uint64_t bdpBytes = linkMbps_ * ack.minRttUs / 8;
  window_ = std::max(minWindow_, bdpBytes / packetBytes_ + 1);
}

}  // namespace ucxb::udp
