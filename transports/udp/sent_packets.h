// The sender's record of reliable packets (DATA, CTS, PING) from sending until acknowledged or
// declared lost, and loss detection over it (RFC 9002 section 6): a packet is lost once
// `reorderThreshold` later packets are acknowledged, or once it is `lossDelay` older than an
// acknowledged later packet, or when the retransmission timeout expires for it.
//
// Lost packets are never resent as such: their content goes back to whoever produced it and
// leaves in a new packet with a new number.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <map>
#include <span>
#include <vector>

#include "transports/udp/one_way_delay.h"
#include "transports/udp/udp_types.h"
#include "transports/udp/wire_format.h"

namespace ucxb::udp {

// What a reliable packet carried: enough to send it again.
struct PacketContent {
  enum class Kind : uint8_t { kData, kCts, kPing };
  Kind kind = Kind::kPing;
  MessageId messageId = 0;        // kData
  uint64_t offset = 0;            // kData
  uint32_t length = 0;            // kData: payload bytes
  uint8_t flags = 0;              // kData: data_flags
  std::vector<MessageId> ctsIds;  // kCts
};

struct SentPacket {
  enum class State : uint8_t { kInFlight, kAcked, kLost };
  PacketNumber number = 0;
  TimeUs sentTime = 0;
  uint32_t bytes = 0;  // datagram size
  State state = State::kInFlight;
  uint32_t path = 0;  // which of the peer's paths it took (path_selector.h)
  uint64_t pathBytes = 0;  // bytes sent on its path so far, its own included (one_way_delay.h)
  PacketContent content;
};

class SentPackets {
 public:
  PacketNumber nextNumber() const { return next_; }
  // Records a packet of `bytes` just sent with number nextNumber(); returns that number.
  PacketNumber record(TimeUs now, uint32_t bytes, PacketContent content, uint32_t path = 0);

  size_t inFlightCount() const { return inFlight_; }
  // Of those, the PINGs: probes, which carry nothing the peer needs.
  size_t inFlightProbes() const { return inFlightProbes_; }
  uint64_t inFlightBytes() const { return inFlightBytes_; }
  // The same, of the packets that took `path` (< kMaxPaths).
  uint64_t pathInFlightCount(uint32_t path) const { return pathInFlight_[path % kPathSlots].packets; }
  uint64_t pathInFlightBytes(uint32_t path) const { return pathInFlight_[path % kPathSlots].bytes; }

  struct AckResult {
    std::vector<SentPacket> newlyAcked;
    uint64_t lateAcks = 0;  // acknowledged after being declared lost
    // DATA declared lost (among the last kRememberedLost) and acknowledged after all: their
    // content was resent for nothing (spurious retransmissions). Counted even after the
    // record itself is gone, which for a loss at the front of the window is at once.
    uint64_t lateDataAcks = 0;
    // The path of each of those that loss detection (not a timeout) had declared lost: a
    // path that was blamed for a loss it did not cause (path_selector.h takes it back).
    std::vector<uint32_t> spuriousLossPaths;
    // Send time of the frame's largest packet if this frame is the first to acknowledge it:
    // the one RTT sample the frame yields (RFC 9002 5.1).
    std::optional<TimeUs> rttSampleSentTime;
    // Paths whose one-way delay the frame's receive timestamps updated (oneWayDelays()).
    std::vector<uint32_t> timestampedPaths;
  };
  // Applies an ACK frame. Returns false, changing nothing, if it acknowledges a packet number
  // never sent (a confused or forged peer).
  bool onAck(const AckFrame& ack, AckResult& out);

  // Multipath (packets sprayed over several paths): the thresholds count per path, i.e. a
  // packet is lost only once later packets on its own path are acknowledged. Paths of
  // different delay, or a receiver that reads one path's socket after another's, reorder
  // packets across paths, and counted globally that reordering looks like loss.
  void setPerPathDetection(bool on) { perPath_ = on; }
  // The time threshold of one path, when its RTT is above the connection's (spraying over
  // paths of unequal delay): at least the lossDelay passed to detectLosses() is used.
  void setPathLossDelay(uint32_t path, DurationUs delay) {
    pathLossDelay_[path % pathLossDelay_.size()] = delay;
  }

  // Each path's one-way delay and queue, from the peer's receive timestamps in the ACKs.
  const OneWayDelays& oneWayDelays() const { return delays_; }

  // Moves to `lost` every in-flight packet below the largest acknowledged one that the
  // packet or time threshold declares lost.
  void detectLosses(TimeUs now, DurationUs lossDelay, uint32_t reorderThreshold,
                    std::vector<SentPacket>& lost);
  // When detectLosses() would next declare a packet lost by time alone, if ever.
  std::optional<TimeUs> nextLossTime(DurationUs lossDelay) const;

  // Moves to `lost` every in-flight packet sent at or before `cutoff` (retransmission timeout).
  void expireSentAtOrBefore(TimeUs cutoff, std::vector<SentPacket>& lost);
  // Moves the oldest in-flight packet, if any, to `lost` as a timeout does (a timeout whose
  // verdict is still open resends only that one: PeerConnection::onTimeout).
  void expireOldest(std::vector<SentPacket>& lost);
  // Moves the given in-flight packets to `lost` (loss recovery's give-ups).
  void declareLost(std::span<const PacketNumber> numbers, std::vector<SentPacket>& lost);

  std::optional<TimeUs> oldestInFlightSentTime() const;
  // Numbers of the in-flight packets, ascending.
  void inFlightNumbers(std::vector<PacketNumber>& out) const;

 private:
  SentPacket* find(PacketNumber pn);
  void markLost(SentPacket& p, std::vector<SentPacket>& lost, bool byTimeout = false);
  // Drops settled packets from the front, so that the front is the oldest in flight.
  void trimFront();

  std::deque<SentPacket> packets_;  // packets_[i].number == base_ + i
  PacketNumber base_ = 0;
  PacketNumber next_ = 0;
  // One in-flight packet more (+1) or less (-1), on the whole and on its path.
  void countInFlight(const SentPacket& p, int change);

  size_t inFlight_ = 0;
  size_t inFlightProbes_ = 0;
  uint64_t inFlightBytes_ = 0;
  static constexpr size_t kPathSlots = 16;  // kMaxPaths (path_selector.h)
  struct InFlight {
    uint64_t packets = 0;
    uint64_t bytes = 0;
  };
  std::array<InFlight, kPathSlots> pathInFlight_{};
  std::array<uint64_t, kPathSlots> pathBytesSent_{};
  OneWayDelays delays_;
  // Feeds the frame's receive timestamps of packets it acknowledged to delays_.
  void takeTimestamps(const AckFrame& ack, AckResult& out);
  std::optional<PacketNumber> largestAcked_;
  bool perPath_ = false;
  std::array<DurationUs, kPathSlots> pathLossDelay_{};
  void detectLossesPerPath(TimeUs now, DurationUs lossDelay, uint32_t reorderThreshold,
                           std::vector<SentPacket>& lost);
  std::optional<TimeUs> nextLossTimePerPath(DurationUs lossDelay) const;
  // Numbers of the DATA packets declared lost most recently, to tell a spurious
  // retransmission when one of them is acknowledged after all, with the path each took
  // (kByTimeout: a timeout declared it, which blamed no path).
  static constexpr size_t kRememberedLost = 1024;
  static constexpr uint32_t kByTimeout = UINT32_MAX;
  std::map<PacketNumber, uint32_t> lostData_;
};

}  // namespace ucxb::udp
