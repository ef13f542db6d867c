// Seeded, reproducible fault injection: what a bad network does to datagrams (drop, duplicate,
// reorder, delay, corrupt). Sans-IO like the rest of the core: it decides what happens to a
// datagram and returns the copies to deliver with their extra delays; the simulator (and
// later the socket loop, for experiments on real links) carries them out.
//
// Configured by a string such as "drop=0.01,dup=0.001,reorder=0.02,seed=7".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transports/config/schema.h"
#include "transports/udp/udp_types.h"

namespace ucxb::udp {

struct FaultConfig {
  double drop = 0.0;       // probability a datagram is lost
  double duplicate = 0.0;  // probability it arrives twice (each copy then faces the rest)
  double reorder = 0.0;    // probability it is held back so that later ones overtake it
  double delay = 0.0;      // probability it is held back much longer (late arrival)
  double corrupt = 0.0;    // probability 1 to 3 of its bits are flipped
  uint64_t seed = 1;
  DurationUs reorderUs = 50;  // a reordered datagram arrives 1..reorderUs late
  DurationUs delayUs = 2000;  // a delayed datagram arrives 1..delayUs late

  bool any() const { return drop > 0 || duplicate > 0 || reorder > 0 || delay > 0 || corrupt > 0; }
};

// Keys: drop, dup, reorder, delay, corrupt (probabilities), seed, reorder_us, delay_us.
// Throws ConfigError naming the key and the allowed values.
FaultConfig parseFaultConfig(std::string_view text);
std::string describe(const FaultConfig& config);
// Every key above, declared once (defaults: FaultConfig's initializers).
const config::Schema<FaultConfig>& faultConfigSchema();
std::vector<std::string> faultConfigKeys();

// xoshiro256** seeded through splitmix64: small, fast, and the same sequence on every platform
// and standard library (std::mt19937 is, its distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();                  // [0, 1)
  uint64_t below(uint64_t bound);    // [0, bound), bound > 0
  bool chance(double probability) { return probability > 0.0 && uniform() < probability; }

 private:
  uint64_t s_[4];
};

class FaultInjector {
 public:
  explicit FaultInjector(const FaultConfig& config);

  struct Delivery {
    std::vector<uint8_t> bytes;
    DurationUs extraDelayUs = 0;
  };
  struct Counters {
    uint64_t seen = 0, dropped = 0, duplicated = 0, reordered = 0, delayed = 0, corrupted = 0;
  };

  // Appends to `out` what arrives of `datagram`: nothing (dropped), one copy or two.
  void apply(std::span<const uint8_t> datagram, std::vector<Delivery>& out);

  const FaultConfig& config() const { return config_; }
  const Counters& counters() const { return counters_; }

 private:
  FaultConfig config_;
  Rng rng_;
  Counters counters_;
};

}  // namespace ucxb::udp
