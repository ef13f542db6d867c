// Per path, the queue on the way to the peer as the peer's receive timestamps show it (ACK
// timestamps, wire_format.h): loss detection's test of whether a packet not yet acknowledged
// can still be on its way.
//
// Sprayed over paths that each have a bottleneck queue, a path's RTT swings with its queue,
// and a time threshold of 9/8 of an RTT measured a round trip ago takes a packet behind a
// queue that grew since for lost (udp-protocol.md, "Adaptive: how it weighs a path"). The
// timestamps say, in the peer's clock, when the newest packet of each path arrived; a path's
// queue is FIFO and drains at the path's rate, so a packet sent after it arrives no sooner
// than that arrival plus the time the bytes sent on the path in between take to drain, and no
// sooner than its own send time plus the path's least one-way delay. An ACK written after that
// forecast (plus a slack) that does not acknowledge the packet says it is lost; one written
// before says nothing, however long ago the packet was sent.
//
// Only differences of one clock are used: each one-way delay is the peer's receive time less
// our send time, offset by the difference of the two clocks, which cancels against the least
// one-way delay and never enters a forecast (send time + least delay is in the peer's clock).
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
  // The peer's clock when it wrote the newest ACK: what arrived by then, that ACK listed.
  void onAckTime(TimeUs peerNow);
  // Whether a packet of `path` (as onTimestamp's arguments) that the newest ACK did not
  // acknowledge should have arrived `slack` before that ACK was written. True where nothing
  // is known yet (no timestamp of the path), or where a later packet of the path arrived first.
  bool overdue(uint32_t path, uint64_t pathBytes, TimeUs sentTime, DurationUs slack) const;

  // The path's queueing delay at its newest timestamp (its one-way delay less its least), and
  // how long a byte takes to drain from its queue (0 until measured), for statistics.
  DurationUs queueDelayUs(uint32_t path) const;
  bool known(uint32_t path) const { return paths_[path % kPaths].known; }
  // When the path's newest timestamped packet was sent (our clock).
  TimeUs lastSentTime(uint32_t path) const { return paths_[path % kPaths].lastSent; }
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
  TimeUs peerNow_ = 0;
};

}  // namespace ucxb::udp
