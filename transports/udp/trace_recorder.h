// Time series within an op (udp_config trace_samples, trace_interval_us): what a researcher
// plots to see congestion control at work. Two kinds of samples, each kept in a bounded ring
// that overwrites its oldest sample when full (and counts what it overwrote):
//
//   connection - per peer and path, at the sending side: the congestion window, packets and
//                bytes in flight (the connection's and the path's), the smoothed and latest
//                RTT, and the running counts of retransmissions, losses, marks echoed (ECN)
//                and packets NACKed (trims), and congestion=credit's state in both roles
//                (what the peer granted us and what we have of it, our demand; what our
//                scheduler granted the peer and the demand it reported; CREDIT packets each
//                way and our credit timeouts);
//   queue      - per path, at the receiving side: the emulated bottleneck's queue depth
//                (faults.h) and its running counts of drop-tail losses, marks and trims.
//
// Sans-IO like the Endpoint that owns it: samples are taken on events (a datagram delivered
// to a connection, a timer, a datagram sent, a datagram through the bottleneck) with the time
// the caller passed in, at most one per trace_interval_us per peer (or path), plus one at every
// event that shrank the window or found the queue full, so that each cut and each drop-tail
// shows at its time, and one of every connection at an op's end (Endpoint::sampleTraceNow),
// so that an op shorter than the interval is sampled too. Off (no recorder at all) unless
// trace_samples > 0: the Endpoint then pays one pointer test per event.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transports/udp/faults.h"
#include "transports/udp/udp_types.h"

namespace ucxb::udp {

class PeerConnection;

// One connection sample. With several paths a sample is taken for every path at once: the
// window, what is in flight, the latest RTT and the marks and trims are the connection's, the
// smoothed RTT, retransmissions, losses and path_inflight_* the path's own (with one path,
// path_inflight_* equal inflight_*).
struct ConnectionSample {
  TimeUs tUs = 0;
  uint32_t peer = 0;
  uint32_t path = 0;
  uint64_t cwndPackets = 0;  // 0: the controller sets no window (congestion=none)
  uint64_t inFlightPackets = 0;
  uint64_t inFlightBytes = 0;
  DurationUs rttSmoothedUs = 0;
  DurationUs rttLatestUs = 0;
  uint64_t retransmitted = 0;
  uint64_t lost = 0;
  uint64_t marksEchoed = 0;
  uint64_t trimsNacked = 0;
  uint64_t rtoExpiries = 0;
  uint64_t pathInFlightPackets = 0;
  uint64_t pathInFlightBytes = 0;
  // congestion=credit (zero under the window-based policies, which neither ask nor grant).
  // As the sender: the peer's cumulative grant to us, what of it we have not spent yet
  // (granted less spent, 0 when overspent) and our cumulative demand as last reported.
  uint64_t creditGranted = 0;
  uint64_t creditAvailable = 0;
  uint64_t creditWanted = 0;
  // As the receiver: our scheduler's cumulative grant to the peer and the peer's cumulative
  // demand (0 until it asks; the grant starts at the unsolicited window).
  uint64_t grantToPeer = 0;
  uint64_t peerWanted = 0;
  // Running counts: CREDIT packets sent (requests and grants) and received, credit timeouts.
  uint64_t creditPacketsSent = 0;
  uint64_t creditPacketsReceived = 0;
  uint64_t creditTimeouts = 0;
};

// One bottleneck sample, taken as a datagram from `peer` went through the queue of `path`.
struct QueueSample {
  TimeUs tUs = 0;
  uint32_t peer = 0;
  uint32_t path = 0;
  uint64_t queuePackets = 0;  // queued after this datagram (itself included when it queued)
  uint64_t queueLimit = 0;    // the path's `queue`
  uint64_t queueDropped = 0;  // drop-tail so far
  uint64_t marked = 0;
  uint64_t trimmed = 0;
};

// A fixed-capacity ring: push overwrites the oldest element when full.
template <typename T>
class SampleRing {
 public:
  explicit SampleRing(size_t capacity) : items_(capacity) {}
  void push(const T& item) {
    if (size_ == items_.size()) {
      ++overwritten_;
    } else {
      ++size_;
    }
    items_[head_] = item;
    head_ = (head_ + 1) % items_.size();
  }
  // Appends the samples held, oldest first, to `out` and empties the ring.
  void drainTo(std::vector<T>& out) {
    const size_t first = (head_ + items_.size() - size_) % items_.size();
    for (size_t i = 0; i < size_; ++i) out.push_back(items_[(first + i) % items_.size()]);
    size_ = 0;
  }
  size_t size() const { return size_; }
  uint64_t overwritten() const { return overwritten_; }

 private:
  std::vector<T> items_;
  size_t head_ = 0;  // where the next push goes
  size_t size_ = 0;
  uint64_t overwritten_ = 0;
};

class TraceRecorder {
 public:
  // `capacity` samples of each kind (> 0); `rank` is the Endpoint's own (its loopback
  // connection is not sampled).
  TraceRecorder(size_t capacity, DurationUs intervalUs, int rank, int peers, uint32_t paths);

  // After `connection` (to `peer`) took a datagram, a timer or sent one: a sample when due
  // (or the window shrank); kForced takes one whatever the interval (an op's end).
  static constexpr bool kForced = true;
  void sampleConnection(TimeUs now, int peer, const PeerConnection& connection,
                        bool forced = false);
  // After a datagram from `peer` went through the bottleneck of `path` (faults->apply).
  void sampleQueue(TimeUs now, int peer, uint32_t path, const FaultInjector& faults);

  // Moves every sample held to `out` (oldest first).
  void drain(std::vector<ConnectionSample>& connections, std::vector<QueueSample>& queues);
  // Samples of each kind overwritten so far (nobody read them in time).
  uint64_t connectionsOverwritten() const { return connections_.overwritten(); }
  uint64_t queuesOverwritten() const { return queues_.overwritten(); }

 private:
  struct LastSample {
    bool taken = false;
    TimeUs tUs = 0;
    uint64_t cwnd = 0;    // connections
    uint64_t drops = 0;   // queues: drop-tail and trims so far
  };
  bool due(const LastSample& last, TimeUs now) const {
    return !last.taken || now - last.tUs >= intervalUs_;
  }

  const DurationUs intervalUs_;
  const int rank_;
  std::vector<LastSample> lastConnection_;  // per peer
  std::vector<LastSample> lastQueue_;       // per path
  SampleRing<ConnectionSample> connections_;
  SampleRing<QueueSample> queues_;
};

// The field names of each kind, in the order appendTraceValues() writes the values: the one
// place that names them (what Python and the bench's JSON lines see).
const std::vector<std::string>& connectionSampleFields();
const std::vector<std::string>& queueSampleFields();
void appendTraceValues(const ConnectionSample& s, std::vector<uint64_t>& out);
void appendTraceValues(const QueueSample& s, std::vector<uint64_t>& out);

}  // namespace ucxb::udp
