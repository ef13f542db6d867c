// Loss recovery: once loss detection (sent_packets.h) has declared packets lost, which content
// to send again. A policy is one small class plus one row in the registry
// (loss_recovery.cpp), chosen by name with `loss_recovery=` in the config.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "transports/udp/rtt.h"
#include "transports/udp/udp_config.h"
#include "transports/udp/udp_types.h"

namespace ucxb::udp {

class LossRecovery {
 public:
  virtual ~LossRecovery() = default;
  virtual const char* name() const = 0;
  // `lost`: the packets just declared lost (ascending, non-empty); their content is always
  // sent again. `inFlight`: the packets still awaiting an ACK (ascending). Appends to
  // `alsoResend` the in-flight packets the policy gives up on as well, so that their content
  // is sent again too (their late ACKs are then ignored; the receiver drops the duplicates).
  virtual void chooseResends(std::span<const PacketNumber> lost,
                             std::span<const PacketNumber> inFlight,
                             std::vector<PacketNumber>& alsoResend) const = 0;
  // Whether the peer must discard DATA that arrives after a gap (a receive window of one
  // packet). The sender marks its DATA so (data_flags::kInOrder): the receiving side obeys
  // the flag whatever its own policy is, so two ranks configured differently still agree.
  virtual bool inOrderOnly() const { return false; }

  // Loss detection (sent_packets.h): a packet is lost once this many later packets are
  // acknowledged (the configured reorder_threshold unless the policy detects by time alone)
  // ...
  virtual uint32_t reorderThreshold(uint32_t configured) const { return configured; }
  // ... or once it is this much older than an acknowledged later packet (by default RFC
  // 9002's 9/8 of the larger of the smoothed and the latest RTT).
  virtual DurationUs lossDelay(const RttEstimator& rtt) const;
  // A packet declared lost was acknowledged after all: its retransmission was spurious
  // (reordering longer than detection allowed for). Once per ACK frame that shows any.
  virtual void onSpuriousRetransmission() {}
  // Once per batch of packets declared lost (not by timeout).
  virtual void onLossDeclared() {}
};

// `selective_repeat`: resend exactly what was lost; everything else the receiver has, or will
// have, stays where it is. The receiver keeps out-of-order data and reports it in ACK ranges.
class SelectiveRepeat final : public LossRecovery {
 public:
  const char* name() const override { return "selective_repeat"; }
  void chooseResends(std::span<const PacketNumber>, std::span<const PacketNumber>,
                     std::vector<PacketNumber>&) const override {}
};

// `go_back_n`: the textbook sliding window. The receiver accepts DATA only in order and
// discards whatever arrives after a gap (it acknowledges only what it kept), so a loss is
// found by the timeout, and the sender then resends the lost packet and every packet sent
// after it. One loss costs a retransmission timeout and a window of resends: the baseline
// selective repeat is measured against.
class GoBackN final : public LossRecovery {
 public:
  const char* name() const override { return "go_back_n"; }
  void chooseResends(std::span<const PacketNumber> lost, std::span<const PacketNumber> inFlight,
                     std::vector<PacketNumber>& alsoResend) const override;
  bool inOrderOnly() const override { return true; }
};

// The names `loss_recovery=` accepts, in registry order.
const std::vector<std::string>& lossRecoveryNames();
// Builds the policy config.lossRecovery names. Throws ConfigError for an unknown name.
std::unique_ptr<LossRecovery> makeLossRecovery(const UdpConfig& config);

}  // namespace ucxb::udp
