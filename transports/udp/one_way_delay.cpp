#include "transports/udp/one_way_delay.h"

#include <algorithm>

namespace ucxb::udp {

void OneWayDelays::onTimestamp(uint32_t path, uint64_t pathBytes, TimeUs sentTime,
                               TimeUs receivedAt) {
  Path& p = paths_[path % kPaths];
  const int64_t delay = static_cast<int64_t>(receivedAt) - static_cast<int64_t>(sentTime);
  if (!p.known) {
    p = Path{true, delay, delay, pathBytes, receivedAt, 0, sentTime};
    return;
  }
  // Only a packet sent after the newest one known moves the path on (an ACK reordered on the
  // way, or a path the network reorders, brings an older one).
  if (pathBytes <= p.lastBytes) return;
  p.leastDelay = std::min(p.leastDelay, delay);
  if (receivedAt >= p.lastReceived) {
    const TimeUs gap = receivedAt - p.lastReceived;
    const int64_t waited = delay - p.leastDelay;
    if (waited >= static_cast<int64_t>(gap)) {
      const double sample = static_cast<double>(gap) / static_cast<double>(pathBytes - p.lastBytes);
      p.usPerByte = p.usPerByte == 0 ? sample : p.usPerByte + kDrainGain * (sample - p.usPerByte);
    }
  }
  p.lastDelay = delay;
  p.lastBytes = pathBytes;
  p.lastReceived = receivedAt;
  p.lastSent = sentTime;
}

DurationUs OneWayDelays::queueDelayUs(uint32_t path) const {
  const Path& p = paths_[path % kPaths];
  return p.known ? static_cast<DurationUs>(p.lastDelay - p.leastDelay) : 0;
}

}  // namespace ucxb::udp
