#include "csrc/collectives/selection.h"

#include <stdexcept>

namespace ucxb::algo {

namespace {

struct OpInfo {
  const char* name;
  std::vector<Algorithm> algorithms;  // kAuto first
};

const OpInfo& info(Op op) {
  static const OpInfo table[kOpCount] = {
      {"allreduce",
       {Algorithm::kAuto, Algorithm::kRing, Algorithm::kRecursiveDoubling,
        Algorithm::kRabenseifner}},
      {"allgather", {Algorithm::kAuto, Algorithm::kRing, Algorithm::kBruck, Algorithm::kLinear}},
      {"reduce_scatter", {Algorithm::kAuto, Algorithm::kRing, Algorithm::kRecursiveHalving}},
      {"broadcast", {Algorithm::kAuto, Algorithm::kBinomial, Algorithm::kChain}},
      {"reduce", {Algorithm::kAuto, Algorithm::kBinomial, Algorithm::kChain}},
      {"alltoall", {Algorithm::kAuto, Algorithm::kPairwise, Algorithm::kLinear}},
  };
  return table[static_cast<size_t>(op)];
}

bool isPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

const char* opName(Op op) { return info(op).name; }

const char* algorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kRing: return "ring";
    case Algorithm::kRecursiveDoubling: return "recursive_doubling";
    case Algorithm::kRabenseifner: return "rabenseifner";
    case Algorithm::kBruck: return "bruck";
    case Algorithm::kLinear: return "linear";
    case Algorithm::kRecursiveHalving: return "recursive_halving";
    case Algorithm::kBinomial: return "binomial";
    case Algorithm::kChain: return "chain";
    case Algorithm::kPairwise: return "pairwise";
  }
  return "?";
}

std::vector<std::string> namesFor(Op op) {
  std::vector<std::string> names;
  for (Algorithm a : info(op).algorithms) names.emplace_back(algorithmName(a));
  return names;
}

Algorithm parseAlgorithm(Op op, const std::string& name) {
  std::string allowed;
  for (Algorithm a : info(op).algorithms) {
    if (name == algorithmName(a)) return a;
    allowed += std::string(allowed.empty() ? "" : ", ") + algorithmName(a);
  }
  throw std::invalid_argument(std::string("algo_") + opName(op) + " must be one of " + allowed +
                              ", got '" + name + "'");
}

// Small messages are latency-bound: log-step algorithms win. Large ones are bandwidth-bound:
// the ring and the chain move the minimum bytes per rank and pipeline in chunks. With two
// ranks most pairs coincide, so the simpler one is kept.
Algorithm choose(const Tuning& tuning, Op op, size_t bytes, int worldSize, bool deviceMemory) {
  const Algorithm forced = tuning.forced[static_cast<size_t>(op)];
  if (forced != Algorithm::kAuto) return forced;
  const bool ringFits = worldSize <= kRingMaxRanks;
  switch (op) {
    case Op::kAllreduce:
      if (bytes <= kAllreduceRecursiveDoublingMax) return Algorithm::kRecursiveDoubling;
      // Device memory at two ranks, up to one chunk: recursive doubling's one exchange of
      // whole vectors instead of the ring's two (a reduce-scatter exchange, then an
      // all-gather one), for the same bytes per rank and one device reduction. A CUDA
      // exchange between two ranks on one GPU cost about 450 us whatever its size, and ops
      // of 1-4 MiB took two of them (docs/cuda.md, "Where a CUDA op's millisecond goes").
      // Host memory keeps its own choice (the staged pair exchange).
      if (deviceMemory && worldSize == 2 && bytes <= tuning.chunkBytes) {
        return Algorithm::kRecursiveDoubling;
      }
      if (!ringFits) return Algorithm::kRabenseifner;
      // Rabenseifner's log steps beat the ring's 2(n-1) only when n > 2, and its extra
      // fold traffic outweighs that when n is not a power of two.
      if (bytes <= kAllreduceRabenseifnerMax && worldSize > 2 && isPowerOfTwo(worldSize)) {
        return Algorithm::kRabenseifner;
      }
      return Algorithm::kRing;
    case Op::kAllgather:
      return bytes <= kAllgatherBruckMax || !ringFits ? Algorithm::kBruck : Algorithm::kRing;
    case Op::kReduceScatter:
      return bytes <= kReduceScatterHalvingMax || !ringFits ? Algorithm::kRecursiveHalving
                                                            : Algorithm::kRing;
    case Op::kBroadcast:
      return bytes <= kBroadcastBinomialMax || worldSize <= 2 ? Algorithm::kBinomial
                                                              : Algorithm::kChain;
    case Op::kReduce:
      return bytes <= kReduceBinomialMax || worldSize <= 2 ? Algorithm::kBinomial
                                                           : Algorithm::kChain;
    case Op::kAlltoall:
      return bytes <= kAlltoallLinearMax ? Algorithm::kLinear : Algorithm::kPairwise;
  }
  return Algorithm::kRing;
}

bool peerMapApplies(const Tuning& tuning, size_t bytes, int worldSize, bool deviceMemory) {
  if (tuning.peerMap == PeerMapMode::kOff || worldSize != 2 || !deviceMemory ||
      tuning.forced[static_cast<size_t>(Op::kAllreduce)] != Algorithm::kAuto) {
    return false;
  }
  return tuning.peerMap == PeerMapMode::kOn || bytes >= kAllreducePeerMapMin;
}

bool sizeDecides(const Tuning& tuning, Op op, int worldSize) {
  if (tuning.forced[static_cast<size_t>(op)] != Algorithm::kAuto) return false;
  return choose(tuning, op, 0, worldSize) != choose(tuning, op, ~size_t{0} >> 1, worldSize);
}

}  // namespace ucxb::algo
