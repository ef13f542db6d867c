// What the progress thread tells other threads about its transport's traffic: the counters
// per peer and transport-wide, and per op the change each op made to them. The progress thread
// takes the numbers (transports are single-threaded) and publishes a copy under a mutex;
// Python reads the copy from any thread. Transports without counters (ucx) cost nothing here.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "transports/transport.h"

namespace ucxb {

struct OpTraffic {
  std::string op;
  uint64_t seq = 0;
  // Summed over peers: the change during the op for counts; the value after it for gauges
  // (rtt_*, *_high_water), which do not add up.
  Counters counters;
};

// The peers' counters summed (gauges: rtt_*, *_high_water, maxed instead). Every peer lists
// the same counters in the same order.
Counters sumOverPeers(const std::vector<Counters>& peers);

// Time-series samples (Transport::drainTraceSeries) with the op they belong to: the op they
// were taken in, or the last one before them (its ACKs and retransmissions go on after it
// returned); seq 0 and no op before the first.
struct OpTraceSeries {
  std::string op;
  uint64_t seq = 0;
  TraceSeries series;
};

struct TrafficSnapshot {
  std::vector<Counters> peers;  // index = peer rank
  Counters transport;
  std::vector<OpTraffic> ops;   // the most recent last
};

class TrafficStats {
 public:
  // How many ops' records are kept (the oldest go first).
  static constexpr size_t kOpHistory = 1024;

  explicit TrafficStats(const Transport& transport);
  bool enabled() const { return enabled_; }

  // Most trace sample values held for Python (32 MiB); past it the oldest batches go.
  static constexpr size_t kTraceValuesHeld = size_t{1} << 22;

  // Progress thread only. beforeOp and afterOp also take the transport's trace samples.
  void beforeOp(Transport& transport);
  void afterOp(Transport& transport, const std::string& op, uint64_t seq);
  void publish(const Transport& transport);

  // Any thread.
  TrafficSnapshot snapshot() const;
  // The trace samples taken since the last call, oldest first (moved out: each is read once).
  std::vector<OpTraceSeries> drainTraceSeries();

 private:
  bool enabled_ = false;
  Counters before_;
  mutable std::mutex mu_;
  std::vector<Counters> peers_;
  Counters transport_;
  std::deque<OpTraffic> ops_;
  // Trace samples not yet read, and the op that later samples belong to (progress thread).
  void takeTraceSeries(Transport& transport, const std::string& op, uint64_t seq);
  std::deque<OpTraceSeries> traces_;
  size_t traceValues_ = 0;
  std::string lastOp_;
  uint64_t lastSeq_ = 0;
};

}  // namespace ucxb
