#include "transports/udp/trace_recorder.h"

#include <algorithm>

#include "transports/udp/reliability.h"

namespace ucxb::udp {

TraceRecorder::TraceRecorder(size_t capacity, DurationUs intervalUs, int rank, int peers,
                             uint32_t paths)
    : intervalUs_(intervalUs),
      rank_(rank),
      lastConnection_(static_cast<size_t>(peers)),
      lastQueue_(std::max<uint32_t>(paths, 1)),
      connections_(capacity),
      queues_(capacity) {}

void TraceRecorder::sampleConnection(TimeUs now, int peer, const PeerConnection& connection,
                                     bool forced) {
  if (peer == rank_) return;  // the loopback connection carries no network to look at
  LastSample& last = lastConnection_[static_cast<size_t>(peer)];
  const uint64_t cwnd = connection.congestionWindow();
  // A window cut is recorded whatever the interval: it is what the series is for.
  if (!forced && !due(last, now) && cwnd >= last.cwnd) return;
  last = LastSample{true, now, cwnd, 0};
  const Stats s = connection.stats();
  ConnectionSample sample;
  sample.tUs = now;
  sample.peer = static_cast<uint32_t>(peer);
  sample.cwndPackets = cwnd == UINT64_MAX ? 0 : cwnd;  // congestion=none sets no window
  sample.inFlightPackets = connection.packetsInFlight();
  sample.inFlightBytes = connection.bytesInFlight();
  sample.rttLatestUs = s.rttLatestUs;
  sample.marksEchoed = s.ceEchoed;
  sample.trimsNacked = s.packetsNacked;
  sample.rtoExpiries = s.rtoExpiries;
  const CreditView credit = connection.creditView();
  sample.creditGranted = credit.granted;
  sample.creditAvailable = credit.granted - std::min(credit.granted, credit.spent);
  sample.creditWanted = credit.wanted;
  sample.grantToPeer = credit.grantToPeer;
  sample.peerWanted = credit.peerWanted;
  sample.creditPacketsSent = s.creditPacketsSent;
  sample.creditPacketsReceived = s.creditPacketsReceived;
  sample.creditTimeouts = s.creditTimeouts;
  if (s.paths.empty()) {
    sample.rttSmoothedUs = s.rttSmoothedUs;
    sample.retransmitted = s.retransmittedPackets;
    sample.lost = s.packetsDeclaredLost;
    sample.pathInFlightPackets = sample.inFlightPackets;
    sample.pathInFlightBytes = sample.inFlightBytes;
    connections_.push(sample);
    return;
  }
  for (size_t p = 0; p < s.paths.size(); ++p) {
    sample.path = static_cast<uint32_t>(p);
    sample.rttSmoothedUs = s.paths[p].rttSmoothedUs;
    sample.retransmitted = s.paths[p].retransmitted;
    sample.lost = s.paths[p].lost;
    sample.pathInFlightPackets = connection.pathPacketsInFlight(sample.path);
    sample.pathInFlightBytes = connection.pathBytesInFlight(sample.path);
    connections_.push(sample);
  }
}

void TraceRecorder::sampleQueue(TimeUs now, int peer, uint32_t path, const FaultInjector& faults) {
  const size_t p = std::min<size_t>(path, faults.paths() - 1);  // as FaultInjector::apply
  const FaultConfig& config = faults.config(p);
  if (!config.bottleneck() || p >= lastQueue_.size()) return;  // no queue there
  const FaultInjector::Counters& counters = faults.pathCounters(p);
  LastSample& last = lastQueue_[p];
  // Every drop-tail and trim is recorded: that is the queue at its limit.
  const uint64_t drops = counters.queueDropped + counters.trimmed;
  if (!due(last, now) && drops == last.drops) return;
  last = LastSample{true, now, 0, drops};
  QueueSample sample;
  sample.tUs = now;
  sample.peer = static_cast<uint32_t>(peer);
  sample.path = static_cast<uint32_t>(p);
  sample.queuePackets = faults.queueDepth(p, now);
  sample.queueLimit = config.queue;
  sample.queueDropped = counters.queueDropped;
  sample.marked = counters.marked;
  sample.trimmed = counters.trimmed;
  queues_.push(sample);
}

void TraceRecorder::drain(std::vector<ConnectionSample>& connections,
                          std::vector<QueueSample>& queues) {
  connections_.drainTo(connections);
  queues_.drainTo(queues);
}

const std::vector<std::string>& connectionSampleFields() {
  static const std::vector<std::string> fields = {
      "t_us",           "peer",          "path",          "cwnd_packets",
      "inflight_packets", "inflight_bytes", "rtt_smoothed_us", "rtt_latest_us",
      "retransmitted",  "lost",          "marks_echoed",  "trims_nacked",
      "rto_expiries",   "path_inflight_packets", "path_inflight_bytes",
      "credit_granted", "credit_available", "credit_wanted",
      "grant_to_peer",  "peer_wanted",   "credit_packets_sent", "credit_packets_received",
      "credit_timeouts",
  };
  return fields;
}

const std::vector<std::string>& queueSampleFields() {
  static const std::vector<std::string> fields = {
      "t_us", "peer", "path", "queue_packets", "queue_limit", "queue_dropped", "marked", "trimmed",
  };
  return fields;
}

void appendTraceValues(const ConnectionSample& s, std::vector<uint64_t>& out) {
  out.insert(out.end(), {s.tUs, s.peer, s.path, s.cwndPackets, s.inFlightPackets,
                         s.inFlightBytes, s.rttSmoothedUs, s.rttLatestUs, s.retransmitted,
                         s.lost, s.marksEchoed, s.trimsNacked, s.rtoExpiries,
                         s.pathInFlightPackets, s.pathInFlightBytes,
                         s.creditGranted, s.creditAvailable, s.creditWanted, s.grantToPeer,
                         s.peerWanted, s.creditPacketsSent, s.creditPacketsReceived,
                         s.creditTimeouts});
}

void appendTraceValues(const QueueSample& s, std::vector<uint64_t>& out) {
  out.insert(out.end(), {s.tUs, s.peer, s.path, s.queuePackets, s.queueLimit, s.queueDropped,
                         s.marked, s.trimmed});
}

}  // namespace ucxb::udp
