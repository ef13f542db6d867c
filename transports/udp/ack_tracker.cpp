#include "transports/udp/ack_tracker.h"

#include <algorithm>

namespace ucxb::udp {

AckTracker::AckTracker(const UdpConfig& config)
    : ackEvery_(config.ackEvery), maxAckDelay_(config.maxAckDelayUs), timestamped_(config.paths > 1) {}

AckTracker::Arrival AckTracker::classify(PacketNumber pn) const {
  if (pn < floor_) return Arrival::kStale;
  return received_.contains(pn) ? Arrival::kDuplicate : Arrival::kNew;
}

bool AckTracker::plausible(PacketNumber pn) const {
  const PacketNumber reach = largest_ ? *largest_ : 0;
  return pn <= reach + kMaxJump;
}

bool AckTracker::record(PacketNumber pn, TimeUs now, uint32_t path) {
  const bool outOfOrder = largest_ && pn < *largest_;
  if (timestamped_) {
    Newest& n = newest_[path % newest_.size()];
    if (!n.pending || pn > n.pn) n = {pn, now, true};
  }
  // A gap before this packet means loss (or reordering): tell the sender at once.
  const bool gap = largest_ ? pn > *largest_ + 1 : pn > 0;
  received_.insert(pn);
  if (!largest_ || pn > *largest_) {
    largest_ = pn;
    largestTime_ = now;
  }
  if (unacked_++ == 0) firstUnackedTime_ = now;
  if (outOfOrder || gap || unacked_ >= ackEvery_) immediate_ = true;
  if (received_.rangeCount() > kMaxTrackedRanges) {
    // Forget the lowest range and everything below it. Its packets have been acknowledged
    // many times over; a very late copy of one of them is dropped as stale, which is safe:
    // the sender resends content under new packet numbers, and the message layer discards
    // bytes it already has.
    received_.forEachAscending([this](const RangeSet::Range& r) {
      floor_ = r.end;
      return false;
    });
    received_.eraseBelow(floor_);
  }
  return outOfOrder;
}

bool AckTracker::ackWanted(TimeUs now) const {
  return immediate_ || (unacked_ > 0 && now >= firstUnackedTime_ + maxAckDelay_);
}

std::optional<TimeUs> AckTracker::ackDeadline() const {
  if (immediate_) return firstUnackedTime_;  // overdue: whenever the caller next looks
  if (unacked_ > 0) return firstUnackedTime_ + maxAckDelay_;
  return std::nullopt;
}

size_t AckTracker::timestampsPending() const {
  return static_cast<size_t>(
      std::count_if(newest_.begin(), newest_.end(), [](const Newest& n) { return n.pending; }));
}

void AckTracker::buildAck(TimeUs now, size_t maxRanges, AckFrame& out) {
  out.rangeCount = 0;
  out.ackDelayUs = 0;
  out.ackTimeUs = now;
  out.timestampCount = 0;
  for (Newest& n : newest_) {
    if (!n.pending) continue;
    n.pending = false;
    const uint64_t age = now > n.at ? now - n.at : 0;
    out.timestamps[out.timestampCount++] = {n.pn,
                                            static_cast<uint32_t>(std::min<uint64_t>(age, UINT32_MAX))};
  }
  if (largest_) {
    out.ackDelayUs = static_cast<uint32_t>(std::min<uint64_t>(now - largestTime_, UINT32_MAX));
  }
  const size_t limit = std::min(maxRanges, kMaxAckRanges);
  received_.forEachDescending([&](const RangeSet::Range& r) {
    if (out.rangeCount >= limit) return false;
    PacketRange pr{r.begin, r.end - 1};
    if (out.rangeCount > 0) {
      // The gap to the range above must fit the wire's u32; stop listing if it does not.
      const PacketRange& above = out.ranges[out.rangeCount - 1];
      if (above.smallest - pr.largest - 1 > UINT32_MAX) return false;
    }
    // A range longer than a u32 can express is reported by its top part only (acknowledging
    // less than what arrived is always safe).
    if (pr.largest - pr.smallest > UINT32_MAX) pr.smallest = pr.largest - UINT32_MAX;
    out.ranges[out.rangeCount++] = pr;
    // A clipped range cannot be followed by lower ones: the gap would be misread.
    return pr.smallest == r.begin;
  });
  unacked_ = 0;
  immediate_ = false;
}

}  // namespace ucxb::udp
