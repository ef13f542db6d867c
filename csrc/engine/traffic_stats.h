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

  // Progress thread only.
  void beforeOp(const Transport& transport);
  void afterOp(const Transport& transport, const std::string& op, uint64_t seq);
  void publish(const Transport& transport);

  // Any thread.
  TrafficSnapshot snapshot() const;

 private:
  bool enabled_ = false;
  Counters before_;
  mutable std::mutex mu_;
  std::vector<Counters> peers_;
  Counters transport_;
  std::deque<OpTraffic> ops_;
};

}  // namespace ucxb
