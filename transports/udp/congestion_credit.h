// `credit`: receiver-driven congestion control (EQDS/NDP style), for the incast of a
// many-to-one step, where every sender's window-based control reacts only after the shared
// downlink's queue has overflowed. Here the receiver decides: its CreditScheduler
// (credit_scheduler.h) grants each sender credit, bytes on the wire it may send, at the
// downlink's rate and shared equally among the senders that want some. A sender sends
// unsolicited only its first cc_credit_initial_bytes (one unsolicited window, so a short
// exchange costs no round trip), and after that only against credit; retransmissions spend
// credit like anything else, because they use the same downlink.
//
// This class is the sending side. It tells the receiver what it wants (the bytes sent so far
// plus its backlog) in a CREDIT packet whenever that grows, and learns what it was granted
// from the receiver's CREDIT packets. Both counts are cumulative, so a lost or reordered
// CREDIT is superseded by the next one; the only packet whose loss would stall it is the
// last one either way, and for that a sender with a backlog and no credit asks again after
// cc_credit_timeout_us without news (a request is answered at once), but only once the
// receiver has been heard from since it was asked: a receiver that sends nothing at all,
// not even ACKs, is not running (a loaded host deschedules it for milliseconds) or is gone,
// and asking it again only adds to what it must read when it wakes. With nothing in flight
// whose ACK would say so, the connection sends a PING instead (reliability_credit.cpp). The
// window in packets is unlimited: credit, not a window, limits what goes out (and
// send_window_bytes as usual). Losses and timeouts change nothing: a receiver that paces at
// its rate has no queue to drain. Credit not used is kept only up to maxUnusedBytes:
// grants that piled up while the sender was descheduled (a loaded host) describe a time long
// past, and sending them at once would overflow the queue the receiver paced them to avoid;
// the excess is forfeited, which raises the demand, so the receiver grants it again at its
// pace. One exception: a CREDIT the receiver marks kCatchUp carries its catch-up after a
// stall of its own (credit_scheduler.h), which it sized for its queue: that is kept whole.
#pragma once

#include <optional>

#include "transports/udp/congestion.h"

namespace ucxb::udp {

class CreditCongestionControl final : public CongestionControl {
 public:
  CreditCongestionControl(uint64_t initialBytes, DurationUs timeoutUs, uint64_t maxUnusedBytes);
  const char* name() const override { return "credit"; }
  uint64_t windowPackets() const override { return UINT64_MAX; }
  void onPacketAcked(TimeUs, TimeUs) override {}
  void onPacketsLost(TimeUs, TimeUs) override {}
  bool cutsOnLoss() const override { return false; }
  void onRetransmissionTimeout(TimeUs) override {}
  CreditCongestionControl* credits() override { return this; }

  // Whether DATA may go now: some credit is left (a datagram may overshoot it by less than
  // its own size; what it overshoots is spent, so the overshoot never accumulates).
  bool maySend() const { return spent_ < granted_; }
  void onDataSent(uint64_t wireBytes);
  // The cumulative grant of a CREDIT from the receiver (a smaller, older one changes nothing).
  // `catchUp`: the CREDIT was marked credit_flags::kCatchUp.
  void onGrant(uint64_t granted, TimeUs now, bool catchUp = false);
  // What is waiting to be sent (bytes on the wire), recounted when it may have grown.
  void setBacklog(uint64_t wireBytes) { backlog_ = wireBytes; }
  // The demand reported to the receiver: bytes sent plus the backlog.
  uint64_t wanted() const { return spent_ + backlog_; }
  // Whether a request must go out now: the demand grew past what the receiver was last told,
  // or the sender waited cc_credit_timeout_us for credit without news (the last grant or
  // request was lost) and `mayTimeOut` (the connection heard from the receiver since
  // lastNews()). `timedOut` says which.
  bool requestDue(TimeUs now, bool mayTimeOut, bool& timedOut) const;
  void onRequestSent(TimeUs now);
  // When a waiting sender asks again, or nullopt while it is not waiting.
  std::optional<TimeUs> nextRequestTime() const;
  TimeUs lastNews() const { return lastNews_; }

  uint64_t granted() const { return granted_; }
  uint64_t spent() const { return spent_; }  // forfeited credit included
  uint64_t reported() const { return reported_; }  // the demand the receiver was last told

 private:
  bool blocked() const { return backlog_ > 0 && !maySend(); }

  const DurationUs timeoutUs_;
  const uint64_t maxUnused_;
  uint64_t granted_;      // cumulative, the unsolicited window included
  uint64_t spent_ = 0;    // cumulative, retransmissions and forfeited credit included
  uint64_t backlog_ = 0;
  uint64_t reported_ = 0;  // the demand last sent to the receiver
  TimeUs lastNews_ = 0;    // the last request sent or grant that raised the credit
  uint64_t catchUpLeft_ = 0;  // unused credit beyond maxUnused kept from a catch-up grant
};

}  // namespace ucxb::udp
