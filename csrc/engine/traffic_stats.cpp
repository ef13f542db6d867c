#include "csrc/engine/traffic_stats.h"

#include <algorithm>
#include <iterator>

namespace ucxb {
namespace {

// Levels, not counts: the largest over peers, never differenced per op (a path's RTT and
// weight and window too: path<i>_rtt_us, path<i>_weight_permille, path<i>_window_packets).
bool isGauge(const std::string& name) {
  return name.rfind("rtt_", 0) == 0 || name.find("_high_water") != std::string::npos ||
         name.find("_rtt_us") != std::string::npos ||
         name.find("_weight_permille") != std::string::npos ||
         name.find("_window_bytes") != std::string::npos ||
         name.find("_window_packets") != std::string::npos;
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

void TrafficStats::beforeOp(Transport& transport) {
  if (!enabled_) return;
  before_ = sumOverPeers(transport.peerCounters());
  takeTraceSeries(transport, lastOp_, lastSeq_);  // what came after the last op
}

void TrafficStats::afterOp(Transport& transport, const std::string& op, uint64_t seq) {
  if (!enabled_) return;
  transport.sampleTraceAtOpEnd();
  takeTraceSeries(transport, op, seq);
  lastOp_ = op;
  lastSeq_ = seq;
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

void TrafficStats::takeTraceSeries(Transport& transport, const std::string& op, uint64_t seq) {
  std::vector<TraceSeries> series = transport.drainTraceSeries();
  if (series.empty()) return;  // not recording: the common case
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : series) {
    if (s.values.empty()) continue;
    traceValues_ += s.values.size();
    traces_.push_back(OpTraceSeries{op, seq, std::move(s)});
  }
  // Nobody reads them (trace_samples set, trace_series never called): keep the newest.
  while (traceValues_ > kTraceValuesHeld && traces_.size() > 1) {
    traceValues_ -= traces_.front().series.values.size();
    traces_.pop_front();
  }
}

std::vector<OpTraceSeries> TrafficStats::drainTraceSeries() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<OpTraceSeries> out(std::make_move_iterator(traces_.begin()),
                                 std::make_move_iterator(traces_.end()));
  traces_.clear();
  traceValues_ = 0;
  return out;
}

TrafficSnapshot TrafficStats::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return TrafficSnapshot{peers_, transport_, std::vector<OpTraffic>(ops_.begin(), ops_.end())};
}

}  // namespace ucxb
