// Congestion control: how many reliable packets may be in flight. A policy is one small class
// (in its own file beside this one: congestion_delay.h is the worked example) plus one row in
// the registry (congestion.cpp), chosen by name with `congestion=` in the config. The
// connection also caps the bytes in flight at send_window_bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transports/udp/udp_config.h"
#include "transports/udp/udp_types.h"

namespace ucxb::udp {

class CreditCongestionControl;      // congestion_credit.h
class CoupledAimdCongestionControl;  // congestion_coupled.h

// Far beyond any send window; only keeps an application-limited window from growing forever.
constexpr uint64_t kMaxCongestionWindow = uint64_t{1} << 24;

// What one ACK frame told the sender, after the per-packet onPacketAcked calls.

struct AckSignal {
  TimeUs now = 0;
  uint64_t ackedPackets = 0;  // newly acknowledged reliable packets
  uint64_t markedPackets = 0; // newly echoed Congestion Experienced marks (the ECN echo)
  // This frame's RTT sample (its largest packet's, less the peer's ACK delay), 0 if it gave
  // none; the connection's minimum and smoothed RTT so far (0 before the first sample).
  DurationUs rttSampleUs = 0;
  DurationUs minRttUs = 0;
  DurationUs smoothedRttUs = 0;
};

class CongestionControl {
 public:
  virtual ~CongestionControl() = default;
  virtual const char* name() const = 0;
  // Reliable packets that may be in flight now.
  virtual uint64_t windowPackets() const = 0;
  // Once per newly acknowledged reliable packet.
  virtual void onPacketAcked(TimeUs sentTime, TimeUs now) = 0;
  // Once per ACK frame that acknowledged something or echoed marks: RTT and ECN signals.
  virtual void onAck(const AckSignal&) {}
  // Once per batch of packets declared lost; `newestLostSentTime` lets a policy react once per
  // round trip rather than once per packet.
  virtual void onPacketsLost(TimeUs newestLostSentTime, TimeUs now) = 0;
  // Once per batch of packets the peer NACKed because a switch trimmed them: congestion, but
  // news of it one queue earlier than a loss. By default the same reaction as to a loss.
  virtual void onPacketsTrimmed(TimeUs newestTrimmedSentTime, TimeUs now) {
    onPacketsLost(newestTrimmedSentTime, now);
  }
  virtual void onRetransmissionTimeout(TimeUs now) = 0;
  // Whether onPacketsLost() cuts what may be sent (a spurious loss then costs rate, not only
  // a resend; the per-path time threshold weighs that: PathSelector::lossDelay).
  virtual bool cutsOnLoss() const { return true; }
  // A receiver-driven policy (congestion_credit.h) sends DATA only against the receiver's
  // credit, which the connection exchanges for it; the window-based ones have none.
  virtual CreditCongestionControl* credits() { return nullptr; }
  // A policy with a window per path (congestion_coupled.h: `aimd` under path_policy=adaptive)
  // is told of ACKs and losses per path, and the path selector sends only where a path's
  // window has room; the others have one window for the connection.
  virtual CoupledAimdCongestionControl* pathWindows() { return nullptr; }
};

// A window in (fractional) packets, between a floor and a ceiling far beyond any send window,
// cut at most once per round trip: a cut reacts to the queue the last window built, not to
// every ACK that reports it again. The building block of the delay and ecn policies.
class PacketWindow {
 public:
  PacketWindow(uint64_t initial, uint64_t minimum);
  uint64_t packets() const { return static_cast<uint64_t>(window_); }
  double size() const { return window_; }
  void grow(double packets);
  // The spacing of cuts; ignored while 0 (no RTT sample yet).
  void setRoundTrip(DurationUs rtt) {
    if (rtt > 0) roundTripUs_ = rtt;
  }
  // Multiplies the window by `factor`, unless it was cut less than a round trip ago.
  void cut(double factor, TimeUs now);
  // Back to the floor (a retransmission timeout), and a cut now.
  void reset(TimeUs now);

 private:
  const double minimum_;
  double window_;
  DurationUs roundTripUs_ = 0;
  TimeUs lastCut_ = 0;
  bool cutBefore_ = false;
};

// `none`: no limit beyond the connection's fixed send window. For links known to be
// uncongested, and as the baseline of experiments.
class NoCongestionControl final : public CongestionControl {
 public:
  const char* name() const override { return "none"; }
  uint64_t windowPackets() const override { return UINT64_MAX; }
  void onPacketAcked(TimeUs, TimeUs) override {}
  void onPacketsLost(TimeUs, TimeUs) override {}
  void onRetransmissionTimeout(TimeUs) override {}
  bool cutsOnLoss() const override { return false; }
};

// `aimd`: TCP Reno's window in packets. Slow start (+1 per ACK) up to ssthresh, then +1 per
// window's worth of ACKs; halved once per round trip with losses (losses of packets sent
// before the last reduction do not reduce it again); back to the minimum on a timeout.
class AimdCongestionControl final : public CongestionControl {
 public:
  AimdCongestionControl(uint64_t initialWindow, uint64_t minWindow);
  const char* name() const override { return "aimd"; }
  uint64_t windowPackets() const override { return window_; }
  void onPacketAcked(TimeUs sentTime, TimeUs now) override;
  void onPacketsLost(TimeUs newestLostSentTime, TimeUs now) override;
  void onRetransmissionTimeout(TimeUs now) override;

 private:
  void reduce(TimeUs now, uint64_t newWindow);

  const uint64_t minWindow_;
  uint64_t window_;
  uint64_t slowStartThreshold_ = UINT64_MAX;
  uint64_t ackedTowardsIncrease_ = 0;
  bool reduced_ = false;     // whether recoveryStart_ is meaningful
  TimeUs recoveryStart_ = 0;  // when the window was last reduced
};

// The names `congestion=` accepts, in registry order.
const std::vector<std::string>& congestionControlNames();
// Builds the policy config.congestion names. Throws ConfigError for an unknown name.
std::unique_ptr<CongestionControl> makeCongestionControl(const UdpConfig& config);

}  // namespace ucxb::udp
