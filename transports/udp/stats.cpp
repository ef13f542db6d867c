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
    case DropReason::kClosed: return "closed";
    case DropReason::kCount: break;
  }
  return "unknown";
}

double goodputBitsPerSecond(const Stats& s) {
  if (s.lastDeliveryUs <= s.firstDataReceivedUs) return 0.0;
  return static_cast<double>(s.bytesDelivered) * 8.0 * 1e6 /
         static_cast<double>(s.lastDeliveryUs - s.firstDataReceivedUs);
}

std::string formatStats(const Stats& s) {
  std::string out;
  const auto add = [&out](const char* name, uint64_t v) {
    out += (out.empty() ? "" : " ") + std::string(name) + "=" + std::to_string(v);
  };
  add("datagrams_sent", s.datagramsSent);
  add("bytes_sent", s.bytesSent);
  add("datagrams_received", s.datagramsReceived);
  add("bytes_received", s.bytesReceived);
  add("accepted", s.datagramsAccepted);
  add("dropped", s.datagramsDropped);
  for (size_t i = 0; i < s.droppedBy.size(); ++i) {
    if (s.droppedBy[i] == 0) continue;
    out += " dropped_" + std::string(dropReasonName(static_cast<DropReason>(i))) + "=" +
           std::to_string(s.droppedBy[i]);
  }
  add("data_packets_sent", s.dataPacketsSent);
  add("ack_packets_sent", s.ackPacketsSent);
  add("cts_packets_sent", s.ctsPacketsSent);
  add("ping_packets_sent", s.pingPacketsSent);
  add("retransmitted_packets", s.retransmittedPackets);
  add("retransmitted_bytes", s.retransmittedBytes);
  add("declared_lost", s.packetsDeclaredLost);
  add("late_acks", s.lateAcks);
  add("rto_expiries", s.rtoExpiries);
  add("credit_stalls", s.creditStalls);
  add("ack_packets_received", s.ackPacketsReceived);
  add("duplicate_packets", s.duplicatePackets);
  add("duplicate_fragments", s.duplicateFragments);
  add("out_of_order", s.outOfOrderPackets);
  add("unexpected_messages", s.unexpectedMessages);
  add("unexpected_high_water", s.unexpectedBytesHighWater);
  add("messages_sent", s.messagesSent);
  add("messages_received", s.messagesReceived);
  add("bytes_delivered", s.bytesDelivered);
  add("rtt_smoothed_us", s.rttSmoothedUs);
  add("rtt_min_us", s.rttMinUs);
  add("rtt_samples", s.rttSamples);
  return out;
}

}  // namespace ucxb::udp
