// Which algorithm runs an op: chosen by message size and group size, unless the group's
// configuration names one (UCXBACKEND_ALGO_<OP>=<name> or pg_options {"algo_<op>": name}).
// The thresholds live here and only here; docs/algorithms.md describes them.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ucxb::algo {

enum class Op { kAllreduce, kAllgather, kReduceScatter, kBroadcast, kReduce, kAlltoall };

// One enumerator per algorithm; each op accepts a subset (see namesFor).
enum class Algorithm {
  kAuto,
  kRing,
  kRecursiveDoubling,
  kRabenseifner,
  kBruck,
  kLinear,
  kRecursiveHalving,
  kBinomial,
  kChain,
  kPairwise,
};

constexpr size_t kOpCount = 6;

// The default chunk of an op on host memory (chunk_bytes): a piece that stays in a core's
// share of the cache while it is received and folded, small enough to pipeline a large
// message through the transport.
constexpr size_t kHostChunkBytes = size_t{4} << 20;
// The default chunk of an op on device memory (device_chunk_bytes). Each device exchange pays
// a fixed cost that dwarfs its bytes (a rendezvous, events waited for on the host), while the
// device folds a chunk in tens of microseconds, so little is won by pipelining it: on one
// H200 shared by two ranks, a 64 MiB all_reduce took 16 GB/s in 4 MiB chunks and 69 GB/s in
// one 64 MiB chunk, 125 and 224 GB/s under MPS (docs/cuda.md, 2026-11-28). An op holds at
// most two chunks of device scratch, and never more than twice its message (slotElems).
constexpr size_t kDeviceChunkBytes = size_t{64} << 20;

// Whether a 2-rank all_reduce of device memory maps the peer's buffer and folds straight out
// of it (device_peer_map; csrc/collectives/peer_map.cpp). kAuto does from
// kAllreducePeerMapMin and falls back to the automatic choice where a rank cannot map (both
// ranks learn it in the op and agree); kOn does at every size and fails the op instead of
// falling back, naming why, so that a test or a session knows the path ran.
enum class PeerMapMode { kOff, kAuto, kOn };

struct Tuning {
  Algorithm forced[kOpCount] = {};  // kAuto: choose by size
  // Piece of a message that a rank receives into scratch (or pipelines) at once. A message
  // that would need more chunks than an op has tag steps for uses larger ones. The group's
  // chunk_bytes for ops on host memory, device_chunk_bytes for ops on device memory
  // (BackendOptions::tuning).
  size_t chunkBytes = kHostChunkBytes;
  // device_peer_map, for ops on device memory only (BackendOptions::tuning).
  PeerMapMode peerMap = PeerMapMode::kOff;
};

// Thresholds of the automatic choice, in bytes of the op's whole message (see choose()).
constexpr size_t kAllreduceRecursiveDoublingMax = size_t{32} << 10;
constexpr size_t kAllreduceRabenseifnerMax = size_t{256} << 10;
// A 2-rank all_reduce from this size that fits a pair slot of the group's shared-memory
// staging (engine/staging_area.h) goes through it instead of recursive doubling's one
// transport message: the peer folds straight out of the slot, with no copy into UCX's FIFO
// and out of it, and none of UCX's FIFO pages to fault in a size's first ops. Measured
// (docs/performance.md): 4 KiB after 10 warm-up ops took 9-10 us instead of 15-18; warm,
// 256 B - 16 KiB neither gained nor lost at this host's noise.
constexpr size_t kAllreducePairSlotsMin = size_t{4} << 10;
// From this size a 2-rank all_reduce of device memory maps the peer's buffer where
// device_peer_map asks for it (peerMapApplies). Below it recursive doubling's one posted
// exchange stays: the peer map waits for five notices, each a host round trip. Not measured
// yet (docs/cuda.md: the next GPU session's checks).
constexpr size_t kAllreducePeerMapMin = size_t{64} << 10;
constexpr size_t kAllgatherBruckMax = size_t{64} << 10;
constexpr size_t kReduceScatterHalvingMax = size_t{64} << 10;
constexpr size_t kBroadcastBinomialMax = size_t{512} << 10;
constexpr size_t kReduceBinomialMax = size_t{512} << 10;
constexpr size_t kAlltoallLinearMax = size_t{32} << 10;  // bytes per peer
// Messages of the binomial broadcast and of either all_to_all travel through the group's
// shared-memory slots (when it has them) from this size: below it one UCX message beats a
// notice and a credit per piece. (The rings stage whatever the size.)
constexpr size_t kStagedMessageMin = size_t{64} << 10;
// From this size a rank of a broadcast or reduce whose ranks may choose different
// algorithms (sizeDecides) also listens, with tripwires (Comm::tripwire), for the first
// message of the algorithm it did not choose, so that ranks passing tensors of different
// sizes either side of kBroadcastBinomialMax/kReduceBinomialMax fail at once instead of
// waiting out the timeout. A receive posted and cancelled costs too little to see next to a
// message this long; below it, where it would show in the op's latency, nothing listens.
constexpr size_t kOtherAlgorithmWireMin = size_t{64} << 10;
// A ring takes n-1 tag steps per phase and the step space is 2^15: above this many ranks the
// automatic choice uses the log-step algorithms instead (a forced ring fails with an error).
constexpr int kRingMaxRanks = 16384;

const char* opName(Op op);                // "allreduce", ...: the knob is "algo_<name>"
const char* algorithmName(Algorithm a);   // "ring", ...
std::vector<std::string> namesFor(Op op); // "auto" first
// Throws std::invalid_argument listing the allowed names.
Algorithm parseAlgorithm(Op op, const std::string& name);

// `bytes`: all_reduce/reduce/broadcast: the tensor; all_gather: the whole output;
// reduce_scatter: the whole input; all_to_all: the largest per-peer block. `deviceMemory`:
// the op's buffers are device memory (Comm::onHost() false; every rank's agree), which
// changes the all_reduce of two ranks (selection.cpp).
Algorithm choose(const Tuning& tuning, Op op, size_t bytes, int worldSize,
                 bool deviceMemory = false);
// Whether an all_reduce of `bytes` runs as the peer-mapped pair (peer_map.cpp) before any
// other choice: device_peer_map not off, two ranks, device memory, no algorithm forced, and
// (kAuto) from kAllreducePeerMapMin or (kOn, which forces it as algo_allreduce forces its
// algorithm) at every size. Every input agrees across the group (the knob must; the size is
// the op's), so every rank decides alike.
bool peerMapApplies(const Tuning& tuning, size_t bytes, int worldSize, bool deviceMemory);
// Whether choose() may answer differently for two sizes of `op` in this group (the choice is
// automatic and not the same for every size: broadcast and reduce beyond 2 ranks). Only then
// can ranks that disagree on the size run different algorithms.
bool sizeDecides(const Tuning& tuning, Op op, int worldSize);

}  // namespace ucxb::algo
