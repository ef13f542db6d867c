#include "transports/udp/faults.h"

#include <cstdio>


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
      });
  return schema;
}

std::vector<std::string> faultConfigKeys() { return faultConfigSchema().keys(); }

FaultConfig parseFaultConfig(std::string_view text) { return faultConfigSchema().parse(text); }

std::string describe(const FaultConfig& c) { return faultConfigSchema().describe(c); }

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
