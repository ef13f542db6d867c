// `bdp`: IRN's BDP-FC. No reaction to loss at all: the packets in flight are capped at the
// path's bandwidth-delay product (cc_link_mbps x the minimum RTT measured, in datagrams of
// mtu_payload bytes, plus one), which keeps a lossy path full while never queueing more
// than about one window at the bottleneck. Before the first RTT sample the cap is
// initial_cwnd_packets.
#pragma once

#include "transports/udp/congestion.h"

namespace ucxb::udp {

class BdpCapCongestionControl final : public CongestionControl {
 public:
  BdpCapCongestionControl(uint64_t initialWindow, uint64_t minWindow, uint64_t linkMbps,
                          uint64_t packetBytes);
  const char* name() const override { return "bdp"; }
  uint64_t windowPackets() const override { return window_; }
  void onPacketAcked(TimeUs, TimeUs) override {}
  void onAck(const AckSignal& ack) override;
  void onPacketsLost(TimeUs, TimeUs) override {}
  bool cutsOnLoss() const override { return false; }
  void onRetransmissionTimeout(TimeUs) override {}

 private:
  const uint64_t minWindow_;
  const uint64_t linkMbps_;
  const uint64_t packetBytes_;
  uint64_t window_;
};

}  // namespace ucxb::udp
