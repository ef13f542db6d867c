#include "transports/udp/udp_config.h"

#include <algorithm>

#include "transports/udp/congestion.h"
#include "transports/udp/loss_recovery.h"
#include "transports/udp/path_selector.h"
#include "transports/udp/wire_format.h"

namespace ucxb::udp {
namespace {

constexpr std::string_view kWhat = "udp config";

}  // namespace

const config::Schema<UdpConfig>& udpConfigSchema() {
  using config::bytes;
  using config::choice;
  using config::integer;
  using config::member;
  using config::probability;
  using config::sameOnEveryRank;
  constexpr uint64_t kMaxUs = 600'000'000;  // 10 minutes
  constexpr uint64_t kMaxCount = uint64_t{1} << 20;
  constexpr uint64_t kTiB = uint64_t{1} << 40;
  static const config::Schema<UdpConfig> schema(
      std::string(kWhat),
      {
          member(bytes("mtu_payload", kMinMtuPayload, kMaxDatagramBytes,
                       "largest datagram, our header included; a group's default is its "
                       "interface's MTU - 28 (1472 on Ethernet, 8972 jumbo, 65507 loopback)"),
                 &UdpConfig::mtuPayload),
          member(integer("rto_min_us", 1, kMaxUs, "RTO floor (RTO = srtt + 4 rttvar + max ack delay, doubled per expiry)"),
                 &UdpConfig::rtoMinUs),
          member(integer("rto_max_us", 1, kMaxUs, "RTO ceiling"),
                 &UdpConfig::rtoMaxUs),
          member(integer("initial_rtt_us", 1, kMaxUs, "RTT assumed before the first sample"),
                 &UdpConfig::initialRttUs),
          member(integer("max_rto_expiries", 1, 1000,
                         "a silent peer is failed after this many consecutive timeouts and "
                         "peer_timeout_us without hearing from it"),
                 &UdpConfig::maxRtoExpiries),
          member(integer("ack_every", 1, 1024, "acknowledge every this many packets (out-of-order packets, PINGs and "
                         "a message's last packet at once)"),
                 &UdpConfig::ackEvery),
          member(integer("max_ack_delay_us", 0, 1'000'000,
                         "longest an acknowledgement is held back"),
                 &UdpConfig::maxAckDelayUs),
          member(integer("reorder_threshold", 1, kMaxCount,
                         "later packets acknowledged before a packet counts as lost"),
                 &UdpConfig::reorderThreshold),
          member(bytes("send_window_bytes", kMinMtuPayload, kTiB,
                       "most bytes in flight per peer, and the floor of the automatic window "
                       "(send_window_max_bytes); loss detection needs reorder_threshold packets "
                       "after a lost one, so keep many datagrams"),
                 &UdpConfig::sendWindowBytes),
          member(bytes("send_window_max_bytes", 0, kTiB,
                       "ceiling of the automatic window: towards a peer whose address carries "
                       "its granted receive buffer, the window is half that buffer divided "
                       "among the ranks that send to it, within [send_window_bytes, this]; "
                       "at or below send_window_bytes the window is fixed"),
                 &UdpConfig::sendWindowMaxBytes),
          // The next three must agree (sameOnEveryRank): a sender spends its own value of
          // the peer's credit and sends eagerly up to its own eager_max_bytes, and a receiver
          // drops as a protocol violation what exceeds its own credit, eager_max_bytes or
          // max_message_bytes: the op never completes (tried: eager_max_bytes 64K against
          // 16K, a 32 KB all_reduce, no error in 60 s). The rest
          // may differ: each is the sender's or the receiver's alone (datagram size, timers,
          // ACK pacing, windows; a receiver follows each packet's own in-order flag, so
          // loss_recovery too).
          member(sameOnEveryRank(bytes("unexpected_bytes", 4 * kMessageChargeBytes, kTiB,
                                       "the receiver's per-peer budget (credit) for messages "
                                       "that arrive before their receive")),
                 &UdpConfig::unexpectedBytes),
          member(sameOnEveryRank(bytes("eager_max_bytes", 0, kTiB,
                                       "largest message sent eagerly; larger ones by "
                                       "rendezvous")),
                 &UdpConfig::eagerMaxBytes),
          member(sameOnEveryRank(
                     bytes("max_message_bytes", 0, kMaxMessageBytes, "longest message accepted")),
                 &UdpConfig::maxMessageBytes),
          member(bytes("socket_buffer_bytes", uint64_t{64} << 10, uint64_t{1} << 30,
                       "kernel receive and send buffer of the socket (forced as root, else "
                       "capped at net.core.rmem_max); must hold every peer's send window"),
                 &UdpConfig::socketBufferBytes),
          member(integer("trace_samples", 0, kMaxCount,
                         "time series within an op: samples kept of each kind (per peer and "
                         "path: cwnd, in flight, RTT, losses, marks, trims; per path: the "
                         "bottleneck's queue) until read, the oldest overwritten (0: off)"),
                 &UdpConfig::traceSamples),
          member(integer("trace_interval_us", 0, kMaxUs,
                         "least time between two trace samples of one peer or path; window "
                         "cuts, drop-tails and op ends are sampled whatever it says (0: every "
                         "event)"),
                 &UdpConfig::traceIntervalUs),
          member(choice("loss_recovery", lossRecoveryNames(), "selective_repeat (resend what was lost; the receiver keeps "
                        "out-of-order data) or go_back_n (the receiver drops what follows a "
                        "gap; the sender resends from the lost packet on)"),
                 &UdpConfig::lossRecovery),
          member(choice("congestion", congestionControlNames(),
                        "none (a fixed window), aimd (a Reno-style window in packets), delay "
                        "(Swift-style, from the queueing delay), ecn (DCQCN-style, from the "
                        "echoed marks), bdp (IRN's cap at the bandwidth-delay product) or credit "
                        "(receiver-driven, EQDS/NDP-style: data only against the receiver's "
                        "paced grants)"),
                 &UdpConfig::congestion),
          member(integer("initial_cwnd_packets", 1, kMaxCount,
                         "congestion window at start (aimd: its slow-start origin)"),
                 &UdpConfig::initialCwndPackets),
          member(integer("min_cwnd_packets", 1, kMaxCount,
                         "congestion window floor after losses and timeouts"),
                 &UdpConfig::minCwndPackets),
          member(integer("cc_target_delay_us", 1, kMaxUs,
                         "delay: queueing delay (RTT less min RTT) the window aims at"),
                 &UdpConfig::ccTargetDelayUs),
          member(probability("cc_beta", "delay: decrease per unit of excess delay, "
                                        "w *= 1 - beta * (delay - target) / delay"),
                 &UdpConfig::ccBeta),
          member(probability("cc_ecn_gain", "ecn: weight g of the latest marked fraction in "
                                            "alpha = (1 - g) alpha + g F"),
                 &UdpConfig::ccEcnGain),
          member(integer("cc_link_mbps", 1, 10'000'000,
                         "bdp: bottleneck rate in Mbit/s; the cap is it times the min RTT. "
                         "credit: this rank's downlink rate, at which it grants credit (an "
                         "emulated bottleneck's rate_mbps, when set, takes its place)"),
                 &UdpConfig::ccLinkMbps),
          member(sameOnEveryRank(bytes("cc_credit_initial_bytes", 0, kTiB,
                                       "credit: unsolicited window, what a sender may send "
                                       "before any grant and again after each burst (bytes "
                                       "on the wire, framing included)")),
                 &UdpConfig::ccCreditInitialBytes),
          member(integer("cc_credit_timeout_us", 1, kMaxUs,
                         "credit: a sender with a backlog and no credit asks again after this "
                         "long without a grant (a lost grant or request), if it heard from the "
                         "receiver within it (else it sends a PING when nothing is in flight)"),
                 &UdpConfig::ccCreditTimeoutUs),
          member(integer("trim_nack", 0, 1,
                         "1: NACK a trimmed DATA at once so the sender resends it; 0: treat it "
                         "as lost (SACK finds it)"),
                 &UdpConfig::trimNack),
          member(integer("keepalive_us", 0, kMaxUs,
                         "silence before a PING while a receive waits on the peer (0: off)"),
                 &UdpConfig::keepaliveUs),
          member(integer("peer_timeout_us", 0, kMaxUs,
                         "least silence (nothing heard from the peer) before it is failed; in a "
                         "group never below the group's timeout, which a stopped but live peer "
                         "is given (a closed port fails a peer at once); 0: the timeout count "
                         "alone"),
                 &UdpConfig::peerTimeoutUs),
          member(integer("tail_probes", 0, 16, "PINGs sent when ACKs stop with packets in flight, before the RTO "
                         "(0: off)"),
                 &UdpConfig::tailProbes),
          member(sameOnEveryRank(integer("paths", 1, kMaxPaths,
                                         "sockets (source ports) per rank, one path per pair; "
                                         "each path has its own fault section (faults=...;...)")),
                 &UdpConfig::paths),
          member(choice("path_policy", pathPolicyNames(),
                        "how packets spread over the paths: single (path 0 only), spray "
                        "(round-robin) or adaptive (weighted away from paths that lose "
                        "packets or whose RTT rises); retransmissions avoid the lossy path"),
                 &UdpConfig::pathPolicy),
      });
  return schema;
}

std::vector<std::string> udpConfigKeys() { return udpConfigSchema().keys(); }

UdpConfig parseUdpConfig(std::string_view text, UdpConfig base) {
  UdpConfig c = udpConfigSchema().parse(text, std::move(base));
  validate(c);
  return c;
}

void validate(const UdpConfig& c) {
  const auto fail = [](const std::string& why) { throw ConfigError(std::string(kWhat) + ": " + why); };
  if (c.mtuPayload < kMinMtuPayload || c.mtuPayload > kMaxDatagramBytes) {
    fail("mtu_payload=" + std::to_string(c.mtuPayload) + " is outside " +
         std::to_string(kMinMtuPayload) + ".." + std::to_string(kMaxDatagramBytes));
  }
  if (c.rtoMinUs == 0 || c.rtoMinUs > c.rtoMaxUs) {
    fail("rto_min_us=" + std::to_string(c.rtoMinUs) + " must be >= 1 and <= rto_max_us=" +
         std::to_string(c.rtoMaxUs));
  }
  if (c.unexpectedBytes < 4 * kMessageChargeBytes) {
    fail("unexpected_bytes=" + std::to_string(c.unexpectedBytes) + " is below the minimum " +
         std::to_string(4 * kMessageChargeBytes));
  }
  if (c.eagerMaxBytes + kMessageChargeBytes > c.unexpectedBytes) {
    fail("eager_max_bytes=" + std::to_string(c.eagerMaxBytes) +
         " must leave room for its bookkeeping in unexpected_bytes=" +
         std::to_string(c.unexpectedBytes) + " (at most " +
         std::to_string(c.unexpectedBytes - kMessageChargeBytes) + ")");
  }
  if (c.minCwndPackets > c.initialCwndPackets) {
    fail("min_cwnd_packets=" + std::to_string(c.minCwndPackets) +
         " must be <= initial_cwnd_packets=" + std::to_string(c.initialCwndPackets));
  }
  if (c.sendWindowBytes < c.mtuPayload) {
    fail("send_window_bytes=" + std::to_string(c.sendWindowBytes) +
         " must hold at least one datagram (mtu_payload=" + std::to_string(c.mtuPayload) + ")");
  }
  if (c.ackEvery == 0 || c.reorderThreshold == 0 || c.maxRtoExpiries == 0 ||
      c.initialRttUs == 0) {
    fail("ack_every, reorder_threshold, max_rto_expiries and initial_rtt_us must be >= 1");
  }
  // The policies' names (a config built in code has not been through parseChoice).
  const auto oneOf = [](const char* key, const std::string& value,
                        const std::vector<std::string>& allowed) {
    if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
      config::throwBadValue(kWhat, {key, value}, joinNames(allowed));
    }
  };
  oneOf("loss_recovery", c.lossRecovery, lossRecoveryNames());
  oneOf("path_policy", c.pathPolicy, pathPolicyNames());
  if (c.paths == 0 || c.paths > kMaxPaths) {
    fail("paths=" + std::to_string(c.paths) + " is outside 1.." + std::to_string(kMaxPaths));
  }
  oneOf("congestion", c.congestion, congestionControlNames());
}

uint64_t sendWindowFor(const UdpConfig& c, uint64_t peerReceiveBuffer, int senders) {
  if (c.sendWindowMaxBytes <= c.sendWindowBytes || senders < 1) return c.sendWindowBytes;
  const uint64_t share = peerReceiveBuffer / 2 / static_cast<uint64_t>(senders);
  return std::clamp(share, c.sendWindowBytes, c.sendWindowMaxBytes);
}

std::string describe(const UdpConfig& c) { return udpConfigSchema().describe(c); }

}  // namespace ucxb::udp
