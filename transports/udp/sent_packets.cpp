#include "transports/udp/sent_packets.h"

#include <algorithm>
#include <array>

#include "transports/udp/path_selector.h"

namespace ucxb::udp {
static_assert(kMaxPaths <= 16, "SentPackets keeps 16 paths' loss delays and bytes in flight");
}

namespace ucxb::udp {

PacketNumber SentPackets::record(TimeUs now, uint32_t bytes, PacketContent content,
                                 uint32_t path) {
  SentPacket p;
  p.number = next_;
  p.sentTime = now;
  p.bytes = bytes;
  p.path = path;
  p.pathBytes = pathBytesSent_[path % kPathSlots] += bytes;
  p.content = std::move(content);
  countInFlight(p, +1);
  packets_.push_back(std::move(p));
  return next_++;
}

void SentPackets::countInFlight(const SentPacket& p, int change) {
  InFlight& path = pathInFlight_[p.path % kPathSlots];
  if (p.content.kind == PacketContent::Kind::kPing) {
    inFlightProbes_ = change > 0 ? inFlightProbes_ + 1 : inFlightProbes_ - 1;
  }
  if (change > 0) {
    ++inFlight_;
    inFlightBytes_ += p.bytes;
    ++path.packets;
    path.bytes += p.bytes;
  } else {
    --inFlight_;
    inFlightBytes_ -= p.bytes;
    --path.packets;
    path.bytes -= p.bytes;
  }
}

SentPacket* SentPackets::find(PacketNumber pn) {
  if (pn < base_ || pn >= next_) return nullptr;
  return &packets_[pn - base_];
}

bool SentPackets::onAck(const AckFrame& ack, AckResult& out) {
  out.newlyAcked.clear();
  out.lateAcks = 0;
  out.lateDataAcks = 0;
  out.spuriousLossPaths.clear();
  out.rttSampleSentTime.reset();
  out.timestampedPaths.clear();
  if (ack.rangeCount == 0) return true;
  // Ranges are descending: the first one holds the largest number.
  if (ack.ranges[0].largest >= next_) return false;
  // A packet declared lost is still a clean sample when its ACK comes at last (numbers are
  // never reused). Taking it matters: when the RTT grows past the RTO, every ACK would be
  // late, and without samples the estimate, and the RTO, would never catch up.
  if (const SentPacket* largest = find(ack.ranges[0].largest);
      largest != nullptr && largest->state != SentPacket::State::kAcked) {
    out.rttSampleSentTime = largest->sentTime;
  }
  for (uint16_t i = 0; i < ack.rangeCount; ++i) {
    const PacketRange& r = ack.ranges[i];
    if (r.largest < base_) break;  // this range and all below it are settled already
    for (PacketNumber pn = std::max(r.smallest, base_); pn <= r.largest; ++pn) {
      SentPacket& p = packets_[pn - base_];
      if (p.state == SentPacket::State::kInFlight) {
        p.state = SentPacket::State::kAcked;
        countInFlight(p, -1);
        out.newlyAcked.push_back(p);
      } else if (p.state == SentPacket::State::kLost) {
        // Its content is already on its way again; the copy in flight will be a duplicate.
        p.state = SentPacket::State::kAcked;
        ++out.lateAcks;
      }
    }
  }
  for (uint16_t i = 0; i < ack.rangeCount && !lostData_.empty(); ++i) {
    auto it = lostData_.lower_bound(ack.ranges[i].smallest);
    while (it != lostData_.end() && it->first <= ack.ranges[i].largest) {
      ++out.lateDataAcks;
      if (it->second != kByTimeout) out.spuriousLossPaths.push_back(it->second);
      it = lostData_.erase(it);
    }
  }
  if (!largestAcked_ || ack.ranges[0].largest > *largestAcked_) {
    largestAcked_ = ack.ranges[0].largest;
  }
  takeTimestamps(ack, out);
  trimFront();
  return true;
}

void SentPackets::takeTimestamps(const AckFrame& ack, AckResult& out) {
  if (ack.timestampCount == 0) return;
  for (uint16_t i = 0; i < ack.timestampCount; ++i) {
    const AckTimestamp& t = ack.timestamps[i];
    // Only a packet the frame acknowledged (a timestamp of anything else is no news: an old
    // one, or one whose range did not fit), and still on record.
    const SentPacket* p = find(t.packetNumber);
    if (p == nullptr || p->state != SentPacket::State::kAcked) continue;
    delays_.onTimestamp(p->path, p->pathBytes, p->sentTime, ack.ackTimeUs - t.ageUs);
    out.timestampedPaths.push_back(p->path);
  }
}

void SentPackets::markLost(SentPacket& p, std::vector<SentPacket>& lost, bool byTimeout) {
  p.state = SentPacket::State::kLost;
  countInFlight(p, -1);
  if (p.content.kind == PacketContent::Kind::kData) {
    lostData_.emplace(p.number, byTimeout ? kByTimeout : p.path);
    if (lostData_.size() > kRememberedLost) lostData_.erase(lostData_.begin());
  }
  lost.push_back(std::move(p));
  p.content = {};  // moved out; the record only needs its state now
}

void SentPackets::detectLosses(TimeUs now, DurationUs lossDelay, uint32_t reorderThreshold,
                               std::vector<SentPacket>& lost) {
  if (!largestAcked_) return;
  if (perPath_) {
    detectLossesPerPath(now, lossDelay, reorderThreshold, lost);
    trimFront();
    return;
  }
  const PacketNumber largest = *largestAcked_;
  for (SentPacket& p : packets_) {
    if (p.number >= largest) break;
    if (p.state != SentPacket::State::kInFlight) continue;
    if (largest - p.number >= reorderThreshold || p.sentTime + lossDelay <= now) {
      markLost(p, lost);
    }
  }
  trimFront();
}

std::optional<TimeUs> SentPackets::nextLossTime(DurationUs lossDelay) const {
  if (!largestAcked_) return std::nullopt;
  if (perPath_) return nextLossTimePerPath(lossDelay);
  // Send times grow with packet numbers: the first in-flight packet below the largest
  // acknowledged one is the first to cross the time threshold.
  for (const SentPacket& p : packets_) {
    if (p.number >= *largestAcked_) break;
    if (p.state == SentPacket::State::kInFlight) return p.sentTime + lossDelay;
  }
  return std::nullopt;
}

// Newest to oldest. The packet threshold counts, once a path's largest acknowledged packet is
// passed, the packets of that path sent after it. The time threshold needs a later packet on
// any path acknowledged, but waits out the packet's own path's RTT: a path that carries few
// packets (adaptive moves traffic off a lossy one) may have no later packet of its own, and
// its losses would wait for a timeout.
void SentPackets::detectLossesPerPath(TimeUs now, DurationUs lossDelay,
                                      uint32_t reorderThreshold, std::vector<SentPacket>& lost) {
  std::array<bool, kMaxPaths> ackedLater{};
  std::array<uint64_t, kMaxPaths> sentLater{};
  bool anyAckedLater = false;
  for (auto it = packets_.rbegin(); it != packets_.rend(); ++it) {
    SentPacket& p = *it;
    const uint32_t path = p.path % kMaxPaths;
    if (p.state == SentPacket::State::kInFlight && anyAckedLater) {
      const DurationUs delay = std::max(lossDelay, pathLossDelay_[path]);
      if ((ackedLater[path] && sentLater[path] >= reorderThreshold) ||
          p.sentTime + delay <= now) {
        markLost(p, lost);
      }
    }
    if (ackedLater[path]) ++sentLater[path];
    if (p.state == SentPacket::State::kAcked) ackedLater[path] = anyAckedLater = true;
  }
}

std::optional<TimeUs> SentPackets::nextLossTimePerPath(DurationUs lossDelay) const {
  bool anyAckedLater = false;
  std::optional<TimeUs> next;
  for (auto it = packets_.rbegin(); it != packets_.rend(); ++it) {
    const SentPacket& p = *it;
    if (p.state == SentPacket::State::kAcked) anyAckedLater = true;
    if (p.state != SentPacket::State::kInFlight || !anyAckedLater) continue;
    const TimeUs due = p.sentTime + std::max(lossDelay, pathLossDelay_[p.path % kMaxPaths]);
    if (!next || due < *next) next = due;
  }
  return next;
}

void SentPackets::expireSentAtOrBefore(TimeUs cutoff, std::vector<SentPacket>& lost) {
  for (SentPacket& p : packets_) {
    if (p.sentTime > cutoff) break;
    if (p.state == SentPacket::State::kInFlight) markLost(p, lost, /*byTimeout=*/true);
  }
  trimFront();
}

void SentPackets::expireOldest(std::vector<SentPacket>& lost) {
  for (SentPacket& p : packets_) {
    if (p.state != SentPacket::State::kInFlight) continue;
    markLost(p, lost, /*byTimeout=*/true);
    break;
  }
  trimFront();
}

void SentPackets::declareLost(std::span<const PacketNumber> numbers,
                              std::vector<SentPacket>& lost) {
  for (PacketNumber pn : numbers) {
    SentPacket* p = find(pn);
    if (p != nullptr && p->state == SentPacket::State::kInFlight) markLost(*p, lost);
  }
  trimFront();
}

std::optional<TimeUs> SentPackets::oldestInFlightSentTime() const {
  for (const SentPacket& p : packets_) {
    if (p.state == SentPacket::State::kInFlight) return p.sentTime;
  }
  return std::nullopt;
}

void SentPackets::inFlightNumbers(std::vector<PacketNumber>& out) const {
  out.clear();
  for (const SentPacket& p : packets_) {
    if (p.state == SentPacket::State::kInFlight) out.push_back(p.number);
  }
}

void SentPackets::trimFront() {
  while (!packets_.empty() && packets_.front().state != SentPacket::State::kInFlight) {
    packets_.pop_front();
    ++base_;
  }
}

}  // namespace ucxb::udp
