#include "transports/udp/udp_config.h"

#include <algorithm>

#include "transports/udp/congestion.h"
#include "transports/udp/key_values.h"
#include "transports/udp/loss_recovery.h"
#include "transports/udp/wire_format.h"

namespace ucxb::udp {
namespace {

constexpr std::string_view kWhat = "udp config";
constexpr uint64_t kMinMtuPayload = 256;  // room for a DATA header and a useful fragment

}  // namespace

const std::vector<std::string>& udpConfigKeys() {
  static const std::vector<std::string> keys = {
      "mtu_payload",      "rto_min_us",        "rto_max_us",           "initial_rtt_us",
      "max_rto_expiries", "ack_every",         "max_ack_delay_us",     "reorder_threshold",
      "send_window_bytes", "unexpected_bytes", "eager_max_bytes",    "max_message_bytes",
      "loss_recovery",    "congestion",        "initial_cwnd_packets", "min_cwnd_packets",
      "keepalive_us", "peer_timeout_us", "tail_probes"};
  return keys;
}

UdpConfig parseUdpConfig(std::string_view text, UdpConfig c) {
  constexpr uint64_t kMaxUs = 600'000'000;  // 10 minutes
  constexpr uint64_t kMaxCount = uint64_t{1} << 20;
  for (const KeyValue& kv : splitKeyValues(text, kWhat)) {
    const std::string& k = kv.key;
    if (k == "mtu_payload") {
      c.mtuPayload = parseUnsigned(kWhat, kv, kMinMtuPayload, kMaxDatagramBytes);
    } else if (k == "rto_min_us") {
      c.rtoMinUs = parseUnsigned(kWhat, kv, 1, kMaxUs);
    } else if (k == "rto_max_us") {
      c.rtoMaxUs = parseUnsigned(kWhat, kv, 1, kMaxUs);
    } else if (k == "initial_rtt_us") {
      c.initialRttUs = parseUnsigned(kWhat, kv, 1, kMaxUs);
    } else if (k == "max_rto_expiries") {
      c.maxRtoExpiries = static_cast<uint32_t>(parseUnsigned(kWhat, kv, 1, 1000));
    } else if (k == "peer_timeout_us") {
      c.peerTimeoutUs = parseUnsigned(kWhat, kv, 0, kMaxUs);
    } else if (k == "tail_probes") {
      c.tailProbes = static_cast<uint32_t>(parseUnsigned(kWhat, kv, 0, 16));
    } else if (k == "keepalive_us") {
      c.keepaliveUs = parseUnsigned(kWhat, kv, 0, kMaxUs);
    } else if (k == "ack_every") {
      c.ackEvery = static_cast<uint32_t>(parseUnsigned(kWhat, kv, 1, 1024));
    } else if (k == "max_ack_delay_us") {
      c.maxAckDelayUs = parseUnsigned(kWhat, kv, 0, 1'000'000);
    } else if (k == "reorder_threshold") {
      c.reorderThreshold = static_cast<uint32_t>(parseUnsigned(kWhat, kv, 1, kMaxCount));
    } else if (k == "send_window_bytes") {
      c.sendWindowBytes = parseUnsigned(kWhat, kv, kMinMtuPayload, uint64_t{1} << 40);
    } else if (k == "unexpected_bytes") {
      c.unexpectedBytes = parseUnsigned(kWhat, kv, 4 * kMessageChargeBytes, uint64_t{1} << 40);
    } else if (k == "eager_max_bytes") {
      c.eagerMaxBytes = parseUnsigned(kWhat, kv, 0, uint64_t{1} << 40);
    } else if (k == "max_message_bytes") {
      c.maxMessageBytes = parseUnsigned(kWhat, kv, 0, kMaxMessageBytes);
    } else if (k == "loss_recovery") {
      c.lossRecovery = parseChoice(kWhat, kv, lossRecoveryNames());
    } else if (k == "congestion") {
      c.congestion = parseChoice(kWhat, kv, congestionControlNames());
    } else if (k == "initial_cwnd_packets") {
      c.initialCwndPackets = static_cast<uint32_t>(parseUnsigned(kWhat, kv, 1, kMaxCount));
    } else if (k == "min_cwnd_packets") {
      c.minCwndPackets = static_cast<uint32_t>(parseUnsigned(kWhat, kv, 1, kMaxCount));
    } else {
      throwUnknownKey(kWhat, kv, udpConfigKeys());
    }
  }
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
  const auto& lr = lossRecoveryNames();
  if (std::find(lr.begin(), lr.end(), c.lossRecovery) == lr.end()) {
    fail("loss_recovery='" + c.lossRecovery + "' is invalid (allowed: " + joinNames(lr) + ")");
  }
  const auto& cc = congestionControlNames();
  if (std::find(cc.begin(), cc.end(), c.congestion) == cc.end()) {
    fail("congestion='" + c.congestion + "' is invalid (allowed: " + joinNames(cc) + ")");
  }
}

std::string describe(const UdpConfig& c) {
  return "mtu_payload=" + std::to_string(c.mtuPayload) +
         ",rto_min_us=" + std::to_string(c.rtoMinUs) +
         ",rto_max_us=" + std::to_string(c.rtoMaxUs) +
         ",initial_rtt_us=" + std::to_string(c.initialRttUs) +
         ",max_rto_expiries=" + std::to_string(c.maxRtoExpiries) +
         ",ack_every=" + std::to_string(c.ackEvery) +
         ",max_ack_delay_us=" + std::to_string(c.maxAckDelayUs) +
         ",reorder_threshold=" + std::to_string(c.reorderThreshold) +
         ",send_window_bytes=" + std::to_string(c.sendWindowBytes) +
         ",unexpected_bytes=" + std::to_string(c.unexpectedBytes) +
         ",eager_max_bytes=" + std::to_string(c.eagerMaxBytes) +
         ",max_message_bytes=" + std::to_string(c.maxMessageBytes) +
         ",loss_recovery=" + c.lossRecovery + ",congestion=" + c.congestion +
         ",initial_cwnd_packets=" + std::to_string(c.initialCwndPackets) +
         ",min_cwnd_packets=" + std::to_string(c.minCwndPackets) +
         ",keepalive_us=" + std::to_string(c.keepaliveUs) +
         ",peer_timeout_us=" + std::to_string(c.peerTimeoutUs) +
         ",tail_probes=" + std::to_string(c.tailProbes);
}

}  // namespace ucxb::udp
