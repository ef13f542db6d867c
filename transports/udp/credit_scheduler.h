// The receiving side of congestion=credit (congestion_credit.h): one per rank, shared by its
// connections, because what it shares out is the rank's downlink. The senders report how many
// bytes they want to send it (cumulative, in their CREDIT packets); it grants them credit at
// the downlink's rate, round-robin one datagram's worth at a time among those still wanting,
// so that what arrives never outruns the port and each sender gets an equal share of it.
//
// A sender starts with `initialBytes` granted (its unsolicited window, which both ends know).
// The scheduler grants each sender up to what it wants plus that window again: a sender that
// has sent everything it wanted keeps one window of credit in hand, so its next burst starts
// at once, as a new flow does in NDP and EQDS, instead of waiting a round trip for a grant.
//
// Sans-IO like the connections: the time goes in (advance), grants come out (granted), and
// nextGrantTime says when the next one is earned.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "transports/udp/udp_config.h"
#include "transports/udp/udp_types.h"

namespace ucxb::udp {

// How long a stall of the receiving rank its scheduler makes up for afterwards, by the kind
// of queue the grants released at once then meet (credit_scheduler.cpp says how these were
// found). Emulated: the fault layer's queue, run as the rank reads, so a stall's backlog
// meets it in one burst and overflows it beyond a few hundred microseconds at the rate.
// A port the fault layer does not emulate: on loopback the datagrams of a burst wait in the
// kernel's socket buffer (several MB) until the rank reads them (across real switches they
// meet the switch's queue first, which this cannot know). A sender keeps this much unused credit too
// (congestion_credit.h), or a catch-up grant would be forfeited as soon as it arrived.
constexpr DurationUs kEmulatedCatchUpUs = 300;
constexpr DurationUs kPortCatchUpUs = 4000;

class CreditScheduler {
 public:
  // rateMbps: the downlink's rate. quantumBytes: the grant handed out per turn, one full
  // datagram on the wire. Credit earned while nobody wants any is not kept; credit earned
  // while the rank is too busy to hand it out (a late timer, a descheduled thread) is kept
  // up to kPortCatchUpUs at the rate, or kEmulatedCatchUpUs once setEmulatedDownlinkMbps
  // was called (at least one unsolicited window either way).
  CreditScheduler(uint64_t rateMbps, uint64_t initialBytes, uint64_t quantumBytes);
  CreditScheduler(const CreditScheduler&) = delete;
  CreditScheduler& operator=(const CreditScheduler&) = delete;

  // The fault layer emulates this rank's downlink (its bottleneck, at `rateMbps`): grant at
  // its rate, and keep only kEmulatedCatchUpUs of credit through a stall, because that queue
  // is run when the rank reads, so whatever a stall let pile up meets it as one burst.
  void setEmulatedDownlinkMbps(uint64_t rateMbps);
  uint64_t rateMbps() const { return rateMbps_; }
  DurationUs catchUpUs() const { return catchUpUs_; }
  uint64_t initialBytes() const { return initialBytes_; }

  // One slot per sending peer (each connection joins once).
  size_t join();
  // A sender's cumulative demand, from its CREDIT packet (older, smaller ones are ignored).
  void onWanted(size_t slot, uint64_t wanted, TimeUs now);
  // Whether the peer of `slot` ever asked for credit (only those are sent grants).
  bool wants(size_t slot) const { return slots_[slot].wanted > 0; }
  // The cumulative demand the peer of `slot` reported (0 before it asked).
  uint64_t wanted(size_t slot) const { return slots_[slot].wanted; }
  // The cumulative credit granted to the peer of `slot` (initialBytes at first).
  uint64_t granted(size_t slot) const { return slots_[slot].granted; }
  // Whether the peer of `slot` has all it wants (and its window ahead): its last grant.
  bool satisfied(size_t slot) const { return !active(slots_[slot]); }
  // How much a grant must have grown before it is worth a CREDIT packet of its own: up to
  // four quanta (bounded by the unsolicited window, at least one quantum). One packet per
  // quantum would send the senders' downlinks as many CREDITs as DATA, and a receiver's queue
  // counts packets: a rank descheduled for a few ms on a loaded host found a queue full of
  // grants when it woke.
  uint64_t grantBatch() const {
    return std::max(quantumBytes_, std::min(initialBytes_, 4 * quantumBytes_));
  }
  // A datagram that is not granted DATA used the downlink too (the ACKs and CREDITs of this
  // rank's own sending, CTS, PING): its wire bytes are taken from the credit, so that the
  // grants plus everything else fit the downlink. Without it a rank that sends as well as
  // receives (an all-to-all) had its queue grow by the ACKs of its own traffic until it
  // overflowed.
  void onOtherArrival(uint64_t wireBytes);
  // Earns credit for the time since the last call and shares it out.
  void advance(TimeUs now);
  // When the next grant is earned, or nullopt while nobody wants credit.
  std::optional<TimeUs> nextGrantTime() const;

 private:
  struct Slot {
    uint64_t wanted = 0;
    uint64_t granted = 0;
  };
  bool active(const Slot& s) const { return s.wanted + initialBytes_ > s.granted; }
  bool anyActive() const;
  // The most credit kept unhanded (catchUpUs_ at the rate, or one window), and the most debt.
  double keptCredit() const;
  void share();

  uint64_t rateMbps_;
  DurationUs catchUpUs_;
  const uint64_t initialBytes_;
  const uint64_t quantumBytes_;
  std::vector<Slot> slots_;
  size_t turn_ = 0;      // the slot that gets the next quantum, if it wants it
  double tokens_ = 0;    // credit earned and not handed out yet (bytes)
  TimeUs last_ = 0;      // when tokens_ was last brought up to date
};

// A rank's scheduler under `config`: granting at cc_link_mbps (setEmulatedDownlinkMbps
// corrects it for an emulated downlink), cc_credit_initial_bytes of unsolicited window, a quantum of one full
// mtu_payload datagram on the wire.
std::unique_ptr<CreditScheduler> makeCreditScheduler(const UdpConfig& config);

}  // namespace ucxb::udp
