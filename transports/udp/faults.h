// Seeded, reproducible fault injection: what a bad network does to datagrams (drop, duplicate,
// reorder, delay, corrupt, bursty Gilbert-Elliott loss) and an emulated bottleneck in front of
// the receiver (a rate limit, a FIFO queue of `queue` packets with drop-tail, ECN-style
// marking and UET-style trimming above thresholds). Sans-IO like the rest of the core: it
// decides what happens to a datagram arriving at a given time and returns the copies to
// deliver with their extra delays; the simulator and the socket loop (Endpoint) carry them
// out, so a bottleneck behaves the same in both.
//
// Configured by a string such as "drop=0.01,dup=0.001,reorder=0.02,seed=7" or
// "rate_mbps=2000,queue=64,mark_above=16,trim_above=48". Several paths (each with its own
// rate, delay, loss and queue) are sections separated by ';': a later section starts from
// the first one's values ("rate_mbps=1000;drop=0.05" is two 1 Gbit/s paths, the second lossy).
#pragma once

#include <cstdint>
#include <deque>
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

  // Gilbert-Elliott bursty loss: a two-state chain stepped once per datagram. In the bad
  // state a datagram is lost with probability geDrop (on top of the uniform `drop`).
  double geEnter = 0.0;  // probability of moving from the good to the bad state
  double geLeave = 0.0;  // probability of moving from the bad back to the good state
  double geDrop = 1.0;

  // The bottleneck (off while rateMbps is 0): datagrams leave at rateMbps (their size plus
  // kFramingOverheadBytes on the wire), after waiting in a FIFO of at most `queue` packets;
  // one arriving at a full queue is dropped (drop-tail). DATA that finds at least markAbove
  // packets queued ahead of it is marked Congestion Experienced (0: never); DATA that finds
  // at least trimAbove is trimmed to its header and overtakes the queue (0: never), so that
  // the receiver learns of the loss at once.
  uint64_t rateMbps = 0;
  uint64_t queue = 64;
  uint64_t markAbove = 0;
  uint64_t trimAbove = 0;
  DurationUs baseDelayUs = 0;  // propagation delay of the path, added to every datagram

  bool bottleneck() const { return rateMbps > 0; }
  bool any() const {
    return drop > 0 || duplicate > 0 || reorder > 0 || delay > 0 || corrupt > 0 || geEnter > 0 ||
           bottleneck() || baseDelayUs > 0;
  }
};

// Bytes a datagram occupies on the wire beyond its UDP payload: IPv4 20 + UDP 8 + Ethernet
// header and FCS 18 + preamble and inter-frame gap 20.
constexpr uint64_t kFramingOverheadBytes = 66;

// Keys: see faultConfigSchema(). Throws ConfigError naming the key and the allowed values.
// One path: a ';' in `text` is an error here (parseFaultPaths takes several).
FaultConfig parseFaultConfig(std::string_view text);
// One FaultConfig per ';'-separated section; later sections start from the first one's
// values, and each path's seed is made distinct from the others'.
std::vector<FaultConfig> parseFaultPaths(std::string_view text);
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
  // One path per config (at least one); apply() picks one by its index.
  explicit FaultInjector(std::vector<FaultConfig> paths);

  struct Delivery {
    std::vector<uint8_t> bytes;
    DurationUs extraDelayUs = 0;
  };
  struct Counters {
    uint64_t seen = 0, dropped = 0, duplicated = 0, reordered = 0, delayed = 0, corrupted = 0;
    uint64_t burstDropped = 0;    // lost in the Gilbert-Elliott bad state
    uint64_t queueDropped = 0;    // drop-tail at the bottleneck
    uint64_t marked = 0;          // DATA marked Congestion Experienced
    uint64_t trimmed = 0;         // DATA cut to its header
    uint64_t queueHighWater = 0;  // most packets ever queued at the bottleneck
    // Sums another's counts into these (queueHighWater: the larger).
    void add(const Counters& other);
  };

  // Appends to `out` what arrives of `datagram`, which reaches the path's bottleneck at `now`:
  // nothing (dropped), one copy or two, each with its delay beyond `now`. Calls must come in
  // time order per path (the bottleneck's queue advances with `now`).
  void apply(std::span<const uint8_t> datagram, TimeUs now, std::vector<Delivery>& out,
             size_t path = 0);
  // Without a bottleneck, time does not matter.
  void apply(std::span<const uint8_t> datagram, std::vector<Delivery>& out) {
    apply(datagram, 0, out, 0);
  }

  size_t paths() const { return paths_.size(); }
  const FaultConfig& config(size_t path = 0) const { return paths_[path].config; }
  // Summed over the paths (queueHighWater: the largest).
  Counters counters() const;
  const Counters& pathCounters(size_t path) const { return paths_[path].counters; }
  // Packets in the bottleneck queue of `path` at `now`: not yet departed (trace samples).
  uint64_t queueDepth(size_t path, TimeUs now) const;

 private:
  struct Path {
    explicit Path(const FaultConfig& c) : config(c), rng(c.seed) {}
    FaultConfig config;
    Rng rng;
    Counters counters;
    bool badState = false;              // Gilbert-Elliott
    double freeAtUs = 0;                // when the bottleneck finishes what it holds
    std::deque<double> departuresUs;    // of the packets queued, ascending
  };
  // The bottleneck: false if the datagram is dropped; otherwise `d` is marked or trimmed as
  // the queue decides and its delay includes the wait and the serialization.
  bool queueThrough(Path& path, TimeUs now, Delivery& d);

  std::vector<Path> paths_;
};

}  // namespace ucxb::udp
