// The receiving side of reliability: which reliable packets arrived (duplicate suppression at
// the packet level), and when to acknowledge them. ACK frames list the highest ranges
// received (SACK), so one lost ACK costs nothing: the next one repeats it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "transports/udp/range_set.h"
#include "transports/udp/udp_config.h"
#include "transports/udp/wire_format.h"

namespace ucxb::udp {

class AckTracker {
 public:
  explicit AckTracker(const UdpConfig& config);

  enum class Arrival { kNew, kDuplicate, kStale };
  // kStale: below the history kept (see record()); treated as a duplicate by the caller.
  Arrival classify(PacketNumber pn) const;
  // False for a number no honest peer could have reached yet (far beyond the largest seen):
  // recording it would make our ACKs acknowledge packets the peer never sent.
  bool plausible(PacketNumber pn) const;

  // The smallest number >= `from` not received (numbers below the history count as received).
  PacketNumber firstMissingFrom(PacketNumber from) const {
    return received_.firstMissingFrom(from < floor_ ? floor_ : from);
  }

  // Records an accepted, new packet that came over `path`. Returns true if it arrived out of
  // order (after a higher-numbered one).
  bool record(PacketNumber pn, TimeUs now, uint32_t path = 0);

  // Acknowledge at the next opportunity: a duplicate arrived (our last ACK may have been
  // lost), a PING asks for news, a packet completed a message (its sender waits for the ACK
  // to finish the send), or a flow-control update is due.
  void ackSoon() { immediate_ = true; }
  bool anyReceived() const { return largest_.has_value(); }
  bool ackWanted(TimeUs now) const;
  // When the delayed-ACK timer fires, if an ACK is pending.
  std::optional<TimeUs> ackDeadline() const;

  // How many receive timestamps the next ACK carries (buildAck): one per path that brought a
  // new packet since the last ACK, with several paths; none with one.
  size_t timestampsPending() const;
  // Fills `out` (all but creditLimit) with up to `maxRanges` of the highest ranges received
  // and the pending timestamps, and resets the pending state.
  void buildAck(TimeUs now, size_t maxRanges, AckFrame& out);

 private:
  // More ranges than any ACK can carry: beyond this many, the lowest ones are forgotten.
  static constexpr size_t kMaxTrackedRanges = 4 * kMaxAckRanges;
  // A packet number this far beyond the largest received is implausible.
  static constexpr PacketNumber kMaxJump = PacketNumber{1} << 30;

  const uint32_t ackEvery_;
  const DurationUs maxAckDelay_;
  RangeSet received_;
  PacketNumber floor_ = 0;  // numbers below were forgotten: stale
  std::optional<PacketNumber> largest_;
  TimeUs largestTime_ = 0;  // when the largest arrived: the ACK delay is measured from it
  uint32_t unacked_ = 0;    // packets received since the last ACK
  TimeUs firstUnackedTime_ = 0;
  bool immediate_ = false;
  // Per path, the newest packet (highest number) received on it since the last ACK, and when:
  // the sender reads each path's one-way delay and queue from these (one_way_delay.h).
  const bool timestamped_;
  struct Newest {
    PacketNumber pn = 0;
    TimeUs at = 0;
    bool pending = false;
  };
  std::array<Newest, kMaxAckTimestamps> newest_{};
};

}  // namespace ucxb::udp
