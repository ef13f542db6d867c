// Per path, the queue on the way to the peer as the peer's receive timestamps show it (ACK
// timestamps, wire_format.h): how long the newest packet waited in it, and how long a byte
// takes to drain from it. Adaptive's windows per path (reliability.cpp) cut a window for a
// standing queue, before it overflows, and leave it alone for a loss that met no queue (a
// path's own random loss, not congestion).
//
// Only differences of one clock are used: each one-way delay is the peer's receive time less
// our send time, offset by the difference of the two clocks, which cancels against the least
// one-way delay of the same path.
#pragma once

#include <array>
#include <cstdint>

#include "transports/udp/udp_types.h"

namespace ucxb::udp {

class OneWayDelays {
 public:
  static constexpr size_t kPaths = 16;  // kMaxPaths (path_selector.h)

  // A timestamp: a packet that took `path`, sent at `sentTime` (our clock) with `pathBytes`
  // bytes sent on the path up to and including it, arrived at `receivedAt` (the peer's clock).
  void onTimestamp(uint32_t path, uint64_t pathBytes, TimeUs sentTime, TimeUs receivedAt);

  bool known(uint32_t path) const { return paths_[path % kPaths].known; }
  // The path's queueing delay at its newest timestamp: its one-way delay less its least.
  DurationUs queueDelayUs(uint32_t path) const;
  // When the path's newest timestamped packet was sent (our clock).
  TimeUs lastSentTime(uint32_t path) const { return paths_[path % kPaths].lastSent; }
  // How long a byte takes to drain from the path's queue (0 until measured).
  double drainUsPerByte(uint32_t path) const { return paths_[path % kPaths].usPerByte; }

 private:
  // The drain time per byte is an average over pairs of consecutive timestamps of a path in
  // which the later packet waited in the queue at least as long as the gap between the two
  // arrivals: it was queued while the earlier one drained, so the gap is drain time alone (a
  // gap with the queue empty in between would count idle time as drain).
  static constexpr double kDrainGain = 1.0 / 8;

  struct Path {
    bool known = false;
    int64_t leastDelay = 0;  // least (peer receive time - our send time); clock offset included
    int64_t lastDelay = 0;
    uint64_t lastBytes = 0;  // pathBytes of the newest packet timestamped
    TimeUs lastReceived = 0;
    double usPerByte = 0;
    TimeUs lastSent = 0;
  };
  std::array<Path, kPaths> paths_{};
};

}  // namespace ucxb::udp
