#include "transports/udp/stats.h"

namespace ucxb::udp {

const char* dropReasonName(DropReason reason) {
  switch (reason) {
    case DropReason::kTruncated: return "truncated";
    case DropReason::kBadVersion: return "bad_version";
    case DropReason::kBadType: return "bad_type";
    case DropReason::kBadChecksum: return "bad_checksum";
    case DropReason::kMalformed: return "malformed";
    case DropReason::kBadToken: return "bad_token";
    case DropReason::kWrongPeer: return "wrong_peer";
    case DropReason::kProtocol: return "protocol";
    case DropReason::kStale: return "stale";
    case DropReason::kAfterGap: return "after_gap";
    case DropReason::kClosed: return "closed";
    case DropReason::kAuthFailed: return "auth_failed";
    case DropReason::kReplayed: return "replayed";
    case DropReason::kCount: break;
  }
  return "unknown";
}

double goodputBitsPerSecond(const Stats& s) {
  if (s.lastDeliveryUs <= s.firstDataReceivedUs) return 0.0;
  return static_cast<double>(s.bytesDelivered) * 8.0 * 1e6 /
         static_cast<double>(s.lastDeliveryUs - s.firstDataReceivedUs);
}

std::vector<std::pair<std::string, uint64_t>> statCounters(const Stats& s) {
  std::vector<std::pair<std::string, uint64_t>> out;
  out.reserve(64);
  const auto add = [&out](const char* name, uint64_t v) { out.emplace_back(name, v); };
  add("datagrams_sent", s.datagramsSent);
  add("bytes_sent", s.bytesSent);
  add("datagrams_received", s.datagramsReceived);
  add("bytes_received", s.bytesReceived);
  add("accepted", s.datagramsAccepted);
  add("dropped", s.datagramsDropped);
  for (size_t i = 0; i < s.droppedBy.size(); ++i) {
    out.emplace_back("dropped_" + std::string(dropReasonName(static_cast<DropReason>(i))),
                     s.droppedBy[i]);
  }
  add("data_packets_sent", s.dataPacketsSent);
  add("ack_packets_sent", s.ackPacketsSent);
  add("cts_packets_sent", s.ctsPacketsSent);
  add("ping_packets_sent", s.pingPacketsSent);
  add("close_packets_sent", s.closePacketsSent);
  add("close_packets_received", s.closePacketsReceived);
  add("retransmitted_packets", s.retransmittedPackets);
  add("retransmitted_bytes", s.retransmittedBytes);
  add("declared_lost", s.packetsDeclaredLost);
  add("late_acks", s.lateAcks);
  add("spurious_retransmissions", s.spuriousRetransmissions);
  add("nacks_received", s.nacksReceived);
  add("packets_nacked", s.packetsNacked);
  add("ce_echoed", s.ceEchoed);
  add("rto_expiries", s.rtoExpiries);
  add("spurious_rtos", s.spuriousRtos);
  add("tail_loss_probes", s.tailLossProbes);
  add("credit_stalls", s.creditStalls);
  add("credit_packets_sent", s.creditPacketsSent);
  add("credit_packets_received", s.creditPacketsReceived);
  add("credit_timeouts", s.creditTimeouts);
  add("ack_packets_received", s.ackPacketsReceived);
  add("duplicate_packets", s.duplicatePackets);
  add("duplicate_fragments", s.duplicateFragments);
  add("out_of_order", s.outOfOrderPackets);
  add("ce_received", s.ceReceived);
  add("trimmed_received", s.trimmedReceived);
  add("nacks_sent", s.nacksSent);
  add("unexpected_messages", s.unexpectedMessages);
  add("unexpected_high_water", s.unexpectedBytesHighWater);
  add("messages_sent", s.messagesSent);
  add("eager_messages_sent", s.eagerMessagesSent);
  add("rendezvous_messages_sent", s.rendezvousMessagesSent);
  add("messages_received", s.messagesReceived);
  add("payload_bytes_received", s.payloadBytesReceived);
  add("bytes_delivered", s.bytesDelivered);
  add("rtt_smoothed_us", s.rttSmoothedUs);
  add("rtt_min_us", s.rttMinUs);
  add("rtt_latest_us", s.rttLatestUs);
  add("rtt_samples", s.rttSamples);
  add("send_window_bytes", s.sendWindowBytes);
  // adaptive's windows per path, over every path (each path's own below): the bench's table
  // shows how often a queue cut them, and how often a queue met a window at the path's
  // bandwidth-delay product.
  uint64_t queueCuts = 0;
  uint64_t queueAtBdp = 0;
  for (const PathStats& p : s.paths) {
    queueCuts += p.queueCuts;
    queueAtBdp += p.queueAtBdp;
  }
  add("queue_cuts", queueCuts);
  add("queue_at_bdp", queueAtBdp);
  // "path<i>_<name>" per path, only when there are several.
  for (size_t i = 0; i < s.paths.size(); ++i) {
    const PathStats& p = s.paths[i];
    const std::string prefix = "path" + std::to_string(i) + "_";
    out.emplace_back(prefix + "sent", p.packetsSent);
    out.emplace_back(prefix + "retransmitted", p.retransmitted);
    out.emplace_back(prefix + "acked", p.acked);
    out.emplace_back(prefix + "lost", p.lost);
    out.emplace_back(prefix + "rtt_us", p.rttSmoothedUs);
    out.emplace_back(prefix + "weight_permille", p.weightPermille);
    out.emplace_back(prefix + "window_packets", p.windowPackets);
    out.emplace_back(prefix + "loss_cuts", p.lossCuts);
    out.emplace_back(prefix + "queue_cuts", p.queueCuts);
    out.emplace_back(prefix + "queue_at_bdp", p.queueAtBdp);
  }
  return out;
}

std::string formatStats(const Stats& s) {
  std::string out;
  for (const auto& [name, value] : statCounters(s)) {
    // Drop reasons that never happened would only clutter the line.
    if (value == 0 && name.rfind("dropped_", 0) == 0) continue;
    out += (out.empty() ? "" : " ") + name + "=" + std::to_string(value);
  }
  return out;
}

}  // namespace ucxb::udp
