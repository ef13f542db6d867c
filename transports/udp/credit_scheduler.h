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

class CreditScheduler {
 public:
  // rateMbps: the downlink's rate. quantumBytes: the grant handed out per turn, one full
  // datagram on the wire. Credit earned while nobody wants any is not kept, and while the
  // rank is too busy to hand it out, at most 300 us worth (or one unsolicited window, if
  // more) is (kCatchUpUs).
  CreditScheduler(uint64_t rateMbps, uint64_t initialBytes, uint64_t quantumBytes);
  CreditScheduler(const CreditScheduler&) = delete;
  CreditScheduler& operator=(const CreditScheduler&) = delete;

  // The rate the emulated downlink (the fault layer's bottleneck) in front of this rank has.
  void setRateMbps(uint64_t rateMbps);
  uint64_t rateMbps() const { return rateMbps_; }
  uint64_t initialBytes() const { return initialBytes_; }

  // One slot per sending peer (each connection joins once).
  size_t join();
  // A sender's cumulative demand, from its CREDIT packet (older, smaller ones are ignored).
  void onWanted(size_t slot, uint64_t wanted, TimeUs now);
  // Whether the peer of `slot` ever asked for credit (only those are sent grants).
  bool wants(size_t slot) const { return slots_[slot].wanted > 0; }
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
  // The most credit kept unhanded (kCatchUpUs at the rate, or one window), and the most debt.
  double keptCredit() const;
  void share();

  uint64_t rateMbps_;
  const uint64_t initialBytes_;
  const uint64_t quantumBytes_;
  std::vector<Slot> slots_;
  size_t turn_ = 0;      // the slot that gets the next quantum, if it wants it
  double tokens_ = 0;    // credit earned and not handed out yet (bytes)
  TimeUs last_ = 0;      // when tokens_ was last brought up to date
};

// A rank's scheduler under `config`: granting at cc_link_mbps (setRateMbps corrects it for an
// emulated downlink), cc_credit_initial_bytes of unsolicited window, a quantum of one full
// mtu_payload datagram on the wire.
std::unique_ptr<CreditScheduler> makeCreditScheduler(const UdpConfig& config);

}  // namespace ucxb::udp
