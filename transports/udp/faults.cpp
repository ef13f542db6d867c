#include "transports/udp/faults.h"

#include <cstdio>

#include "transports/udp/key_values.h"

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

std::string formatProbability(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", p);
  return buf;
}

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

const std::vector<std::string>& faultConfigKeys() {
  static const std::vector<std::string> keys = {"drop",    "dup",  "reorder",    "delay",
                                                "corrupt", "seed", "reorder_us", "delay_us"};
  return keys;
}

FaultConfig parseFaultConfig(std::string_view text) {
  FaultConfig c;
  for (const KeyValue& kv : splitKeyValues(text, kWhat)) {
    if (kv.key == "drop") {
      c.drop = parseProbability(kWhat, kv);
    } else if (kv.key == "dup") {
      c.duplicate = parseProbability(kWhat, kv);
    } else if (kv.key == "reorder") {
      c.reorder = parseProbability(kWhat, kv);
    } else if (kv.key == "delay") {
      c.delay = parseProbability(kWhat, kv);
    } else if (kv.key == "corrupt") {
      c.corrupt = parseProbability(kWhat, kv);
    } else if (kv.key == "seed") {
      c.seed = parseUnsigned(kWhat, kv, 0, UINT64_MAX);
    } else if (kv.key == "reorder_us") {
      c.reorderUs = parseUnsigned(kWhat, kv, 1, 10'000'000);
    } else if (kv.key == "delay_us") {
      c.delayUs = parseUnsigned(kWhat, kv, 1, 10'000'000);
    } else {
      throwUnknownKey(kWhat, kv, faultConfigKeys());
    }
  }
  return c;
}

std::string describe(const FaultConfig& c) {
  return "drop=" + formatProbability(c.drop) + ",dup=" + formatProbability(c.duplicate) +
         ",reorder=" + formatProbability(c.reorder) + ",delay=" + formatProbability(c.delay) +
         ",corrupt=" + formatProbability(c.corrupt) + ",seed=" + std::to_string(c.seed) +
         ",reorder_us=" + std::to_string(c.reorderUs) + ",delay_us=" + std::to_string(c.delayUs);
}

FaultInjector::FaultInjector(const FaultConfig& config) : config_(config), rng_(config.seed) {}

void FaultInjector::apply(std::span<const uint8_t> datagram, std::vector<Delivery>& out) {
  ++counters_.seen;
  if (rng_.chance(config_.drop)) {
    ++counters_.dropped;
    return;
  }
  const int copies = rng_.chance(config_.duplicate) ? 2 : 1;
  if (copies == 2) ++counters_.duplicated;
  for (int i = 0; i < copies; ++i) {
    Delivery d;
    d.bytes.assign(datagram.begin(), datagram.end());
    if (!d.bytes.empty() && rng_.chance(config_.corrupt)) {
      ++counters_.corrupted;
      const uint64_t flips = 1 + rng_.below(3);
      for (uint64_t f = 0; f < flips; ++f) {
        const uint64_t bit = rng_.below(d.bytes.size() * 8);
        d.bytes[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      }
    }
    if (rng_.chance(config_.reorder)) {
      ++counters_.reordered;
      d.extraDelayUs += 1 + rng_.below(config_.reorderUs);
    }
    if (rng_.chance(config_.delay)) {
      ++counters_.delayed;
      d.extraDelayUs += 1 + rng_.below(config_.delayUs);
    }
    out.push_back(std::move(d));
  }
}

}  // namespace ucxb::udp
