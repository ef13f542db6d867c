#include "transports/udp/faults.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "transports/udp/wire_format.h"


namespace ucxb::udp {
namespace {

constexpr std::string_view kWhat = "udp faults";

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }


}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

uint64_t Rng::below(uint64_t bound) {
  // Lemire's multiply-shift; the tiny bias is irrelevant for fault injection.
  return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * bound) >> 64);
}

const config::Schema<FaultConfig>& faultConfigSchema() {
  using config::integer;
  using config::member;
  using config::probability;
  static const config::Schema<FaultConfig> schema(
      std::string(kWhat),
      {
          member(probability("drop", "probability a received datagram is lost"),
                 &FaultConfig::drop),
          member(probability("dup", "probability it arrives twice"), &FaultConfig::duplicate),
          member(probability("reorder", "probability it is held back so later ones overtake it"),
                 &FaultConfig::reorder),
          member(probability("delay", "probability it is held back much longer"),
                 &FaultConfig::delay),
          member(probability("corrupt", "probability 1 to 3 of its bits are flipped"),
                 &FaultConfig::corrupt),
          member(integer("seed", 0, UINT64_MAX, "seed of the fault generator"), &FaultConfig::seed),
          member(integer("reorder_us", 1, 10'000'000, "a reordered datagram arrives 1..this late"),
                 &FaultConfig::reorderUs),
          member(integer("delay_us", 1, 10'000'000, "a delayed datagram arrives 1..this late"),
                 &FaultConfig::delayUs),
          member(probability("ge_enter", "Gilbert-Elliott bursty loss: probability per datagram "
                                         "of moving from the good to the bad state"),
                 &FaultConfig::geEnter),
          member(probability("ge_leave", "probability per datagram of leaving the bad state"),
                 &FaultConfig::geLeave),
          member(probability("ge_drop", "probability a datagram is lost in the bad state"),
                 &FaultConfig::geDrop),
          member(integer("rate_mbps", 0, 10'000'000,
                         "bottleneck in front of the receiver: its rate in Mbit/s (0: none)"),
                 &FaultConfig::rateMbps),
          member(integer("queue", 1, 1'000'000,
                         "bottleneck FIFO size in packets; a datagram finding it full is dropped"),
                 &FaultConfig::queue),
          member(integer("mark_above", 0, 1'000'000,
                         "DATA finding at least this many packets queued is marked Congestion "
                         "Experienced, echoed back in ACKs (0: never)"),
                 &FaultConfig::markAbove),
          member(integer("trim_above", 0, 1'000'000,
                         "DATA finding at least this many packets queued is trimmed to its "
                         "header and overtakes the queue, so the receiver can NACK it (0: never)"),
                 &FaultConfig::trimAbove),
          member(integer("base_delay_us", 0, 10'000'000,
                         "propagation delay of the path, added to every datagram"),
                 &FaultConfig::baseDelayUs),
      });
  return schema;
}

std::vector<std::string> faultConfigKeys() { return faultConfigSchema().keys(); }

FaultConfig parseFaultConfig(std::string_view text) {
  if (text.find(';') != std::string_view::npos) {
    throw config::ConfigError(std::string(kWhat) + ": '" + std::string(text) +
                      "' has several paths (';'), where one is expected");
  }
  return faultConfigSchema().parse(text);
}

std::vector<FaultConfig> parseFaultPaths(std::string_view text) {
  std::vector<FaultConfig> paths;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(';', start);
    const std::string_view section =
        text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    if (paths.empty()) {
      paths.push_back(faultConfigSchema().parse(section));
    } else {
      FaultConfig base = paths.front();
      // Distinct per path unless the section names its own.
      base.seed = paths.front().seed * 1000003ull + paths.size();
      paths.push_back(faultConfigSchema().parse(section, base));
    }
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return paths;
}

std::string describe(const FaultConfig& c) { return faultConfigSchema().describe(c); }

FaultInjector::FaultInjector(const FaultConfig& config)
    : FaultInjector(std::vector<FaultConfig>{config}) {}

FaultInjector::FaultInjector(std::vector<FaultConfig> paths) {
  if (paths.empty()) paths.emplace_back();
  for (const FaultConfig& c : paths) paths_.emplace_back(c);
}

void FaultInjector::Counters::add(const Counters& o) {
  seen += o.seen;
  dropped += o.dropped;
  duplicated += o.duplicated;
  reordered += o.reordered;
  delayed += o.delayed;
  corrupted += o.corrupted;
  burstDropped += o.burstDropped;
  queueDropped += o.queueDropped;
  marked += o.marked;
  trimmed += o.trimmed;
  queueHighWater = std::max(queueHighWater, o.queueHighWater);
}

FaultInjector::Counters FaultInjector::counters() const {
  Counters sum;
  for (const Path& p : paths_) sum.add(p.counters);
  return sum;
}

uint64_t FaultInjector::queueDepth(size_t path, TimeUs now) const {
  const std::deque<double>& departures = paths_[path].departuresUs;
  const auto departed =
      std::upper_bound(departures.begin(), departures.end(), static_cast<double>(now));
  return static_cast<uint64_t>(departures.end() - departed);
}

bool FaultInjector::queueThrough(Path& path, TimeUs now, Delivery& d) {
  const FaultConfig& config = path.config;
  Counters& counters = path.counters;
  const double nowUs = static_cast<double>(now);
  while (!path.departuresUs.empty() && path.departuresUs.front() <= nowUs) {
    path.departuresUs.pop_front();
  }
  const uint64_t ahead = path.departuresUs.size();
  if (config.trimAbove > 0 && ahead >= config.trimAbove && trimData(d.bytes)) {
    // UET's trimming: the header goes through a priority lane, ahead of the queue.
    ++counters.trimmed;
    return true;
  }
  if (ahead >= config.queue) {
    ++counters.queueDropped;
    return false;
  }
  if (config.markAbove > 0 && ahead >= config.markAbove &&
      markCongestionExperienced(d.bytes)) {
    ++counters.marked;
  }
  const double wireBits = 8.0 * static_cast<double>(d.bytes.size() + kFramingOverheadBytes);
  path.freeAtUs = std::max(path.freeAtUs, nowUs) + wireBits / static_cast<double>(config.rateMbps);
  path.departuresUs.push_back(path.freeAtUs);
  counters.queueHighWater = std::max<uint64_t>(counters.queueHighWater, path.departuresUs.size());
  d.extraDelayUs += static_cast<DurationUs>(std::ceil(path.freeAtUs - nowUs));
  return true;
}

void FaultInjector::apply(std::span<const uint8_t> datagram, TimeUs now,
                          std::vector<Delivery>& out, size_t pathIndex) {
  Path& path = paths_[std::min(pathIndex, paths_.size() - 1)];
  const FaultConfig& config = path.config;
  Rng& rng = path.rng;
  Counters& counters = path.counters;
  ++counters.seen;
  if (config.geEnter > 0) {
    path.badState = path.badState ? !rng.chance(config.geLeave) : rng.chance(config.geEnter);
    if (path.badState && rng.chance(config.geDrop)) {
      ++counters.burstDropped;
      return;
    }
  }
  if (rng.chance(config.drop)) {
    ++counters.dropped;
    return;
  }
  Delivery first;
  first.bytes.assign(datagram.begin(), datagram.end());
  first.extraDelayUs = config.baseDelayUs;
  if (config.bottleneck() && !queueThrough(path, now, first)) return;
  const int copies = rng.chance(config.duplicate) ? 2 : 1;
  if (copies == 2) ++counters.duplicated;
  for (int i = 0; i < copies; ++i) {
    Delivery d;
    if (i + 1 == copies) {
      d = std::move(first);
    } else {
      d = first;
    }
    if (!d.bytes.empty() && rng.chance(config.corrupt)) {
      ++counters.corrupted;
      const uint64_t flips = 1 + rng.below(3);
      for (uint64_t f = 0; f < flips; ++f) {
        const uint64_t bit = rng.below(d.bytes.size() * 8);
        d.bytes[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      }
    }
    if (rng.chance(config.reorder)) {
      ++counters.reordered;
      d.extraDelayUs += 1 + rng.below(config.reorderUs);
    }
    if (rng.chance(config.delay)) {
      ++counters.delayed;
      d.extraDelayUs += 1 + rng.below(config.delayUs);
    }
    out.push_back(std::move(d));
  }
}

}  // namespace ucxb::udp
