#include "csrc/engine/traffic_stats.h"

#include <algorithm>

namespace ucxb {
namespace {

// Levels, not counts: the largest over peers, never differenced per op (a path's RTT and
// weight too: path<i>_rtt_us, path<i>_weight_permille).
bool isGauge(const std::string& name) {
  return name.rfind("rtt_", 0) == 0 || name.find("_high_water") != std::string::npos ||
         name.find("_rtt_us") != std::string::npos ||
         name.find("_weight_permille") != std::string::npos;
}

}  // namespace

TrafficStats::TrafficStats(const Transport& transport)
    : enabled_(!transport.transportCounters().empty()) {}

Counters sumOverPeers(const std::vector<Counters>& peers) {
  Counters sum;
  for (const auto& peer : peers) {
    if (sum.empty()) {
      sum = peer;
      continue;
    }
    for (size_t i = 0; i < sum.size() && i < peer.size(); ++i) {
      sum[i].second = isGauge(sum[i].first) ? std::max(sum[i].second, peer[i].second)
                                            : sum[i].second + peer[i].second;
    }
  }
  return sum;
}

void TrafficStats::beforeOp(const Transport& transport) {
  if (!enabled_) return;
  before_ = sumOverPeers(transport.peerCounters());
}

void TrafficStats::afterOp(const Transport& transport, const std::string& op, uint64_t seq) {
  if (!enabled_) return;
  auto peers = transport.peerCounters();
  OpTraffic record{op, seq, sumOverPeers(peers)};
  for (size_t i = 0; i < record.counters.size() && i < before_.size(); ++i) {
    auto& [name, value] = record.counters[i];
    if (!isGauge(name)) value -= std::min(value, before_[i].second);
  }
  auto transportCounters = transport.transportCounters();
  std::lock_guard<std::mutex> lock(mu_);
  peers_ = std::move(peers);
  transport_ = std::move(transportCounters);
  ops_.push_back(std::move(record));
  if (ops_.size() > kOpHistory) ops_.pop_front();
}

void TrafficStats::publish(const Transport& transport) {
  if (!enabled_) return;
  auto peers = transport.peerCounters();
  auto transportCounters = transport.transportCounters();
  std::lock_guard<std::mutex> lock(mu_);
  peers_ = std::move(peers);
  transport_ = std::move(transportCounters);
}

TrafficSnapshot TrafficStats::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return TrafficSnapshot{peers_, transport_, std::vector<OpTraffic>(ops_.begin(), ops_.end())};
}

}  // namespace ucxb
