// The peer-mapped all_reduce of two ranks (csrc/collectives/peer_map.cpp) over the in-process
// transport, whose ranks map each other's buffers trivially (Fabric::allowPeerMaps): every
// dtype x reduce op on host memory, bit-exact against the reference and between the ranks,
// MIN and MAX of -0 and +0, where allreduce() takes it, and how it ends where a rank cannot
// map (falls back, or fails with device_peer_map=on) or stalls (the op's timeout, naming it).
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "csrc/collectives/algorithms.h"
#include "tests/cpp/algorithms/elements.h"
#include "tests/cpp/algorithms/groups.h"
#include "tests/cpp/algorithms/guarded_buffer.h"
#include "tests/cpp/algorithms/issue_sized_scratch.h"
#include "tests/cpp/algorithms/sweep.h"
#include "tests/cpp/check.h"

namespace ucxb::algotest {

using algo::PeerMapMode;
using inproc::ThreadWorld;

namespace {

inproc::WorldOptions pairWithMaps(PeerMapMode mode) {
  inproc::WorldOptions options;
  options.size = 2;
  options.peerMaps = true;
  options.tuning.peerMap = mode;
  return options;
}

// Runs one peer-mapped all_reduce of `input(rank)` on both ranks of `world`; returns each
// rank's result bytes, or the ranks' reports in `problems`.
std::array<std::string, 2> runPeerMapped(ThreadWorld& world, DType d, ReduceKind op, size_t count,
                                         const std::function<std::string(int)>& input,
                                         std::string& problems) {
  std::array<std::string, 2> results;
  std::mutex mu;
  problems = world.run([&](Comm& c) -> std::string {
    GuardedBuffer data(count * elementSize(d), input(c.rank()));
    if (!algo::peerMapAllreduce(c, data.data(), count, makeReduction(d, op))) {
      return "fell back where both ranks map";
    }
    if (!data.guardsIntact()) return "written outside its bounds";
    std::lock_guard<std::mutex> lock(mu);
    results[static_cast<size_t>(c.rank())] = data.contents();
    return "";
  });
  return results;
}

}  // namespace

void testPeerMapAllreduce() {
  ThreadWorld world(pairWithMaps(PeerMapMode::kAuto));
  uint32_t salt = 0;
  uint64_t ops = 0;
  for (const DType d : kAllDTypes) {
    for (const ReduceKind op : kAllOps) {
      if (findReduce(d, op) == nullptr) continue;
      for (const size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{7},
                                 size_t{1001}}) {
        ++salt;
        ++ops;
        std::string problems;
        const auto results = runPeerMapped(
            world, d, op, count,
            [&](int rank) { return inputBytes(d, op, rank, count, salt); }, problems);
        const std::string label = caseLabel(d, op, count);
        CHECK_MSG(problems.empty(), label + ":\n" + problems);
        // Bit for bit between the ranks (each half is folded by one rank and copied), and
        // against the reference up to the sign of zeros (elements.h).
        CHECK_MSG(results[0] == results[1], label + ": the ranks' results differ");
        const std::string want = reducedBytes(d, op, 2, 0, count, salt);
        CHECK_MSG(withPositiveZeros(d, results[0]) == withPositiveZeros(d, want),
                  label + ": differs from the reference");
      }
    }
  }
  // Every op of a non-empty vector mapped once a rank; five one-way notices a rank and no
  // other message (an empty one: the offers alone).
  const uint64_t empty = ops / 6;
  CHECK_MSG(world.peerMapsMade() == 2 * (ops - empty),
            std::to_string(world.peerMapsMade()) + " mappings in " + std::to_string(ops) + " ops");
  CHECK_MSG(world.sendsPosted() == 2 * (5 * (ops - empty) + empty),
            std::to_string(world.sendsPosted()) + " sends in " + std::to_string(ops) + " ops");
  std::printf("  %llu ops, every dtype x op the kernels have\n",
              static_cast<unsigned long long>(ops));

  // MIN and MAX of -0 and +0: the lower rank's value wins the tie, as in recursive doubling
  // (lowerFirst), in either half, whichever rank folds it.
  for (const ReduceKind op : {ReduceKind::kMin, ReduceKind::kMax}) {
    for (const float zero0 : {-0.0f, 0.0f}) {
      const size_t count = 5;  // halves of 3 and 2: both ranks fold a tie
      std::string problems;
      const auto results = runPeerMapped(
          world, DType::kFloat32, op, count,
          [&](int rank) {
            std::vector<float> v(count, rank == 0 ? zero0 : -zero0);
            return std::string(reinterpret_cast<const char*>(v.data()), count * sizeof(float));
          },
          problems);
      const std::string label = std::string(reduceName(op)) + " of " +
                                (std::signbit(zero0) ? "-0 and +0" : "+0 and -0");
      CHECK_MSG(problems.empty(), label + ":\n" + problems);
      const std::vector<float> wantValues(count, zero0);
      const std::string want(reinterpret_cast<const char*>(wantValues.data()),
                             count * sizeof(float));
      CHECK_MSG(results[0] == want && results[1] == want,
                label + ": not rank 0's zero on both ranks");
    }
  }
}

void testPeerMapRouting() {
  // Where allreduce() takes the peer map: device memory, two ranks, from
  // kAllreducePeerMapMin, device_peer_map not off, no algorithm forced.
  algo::Tuning tuning;
  tuning.peerMap = PeerMapMode::kAuto;
  const size_t min = algo::kAllreducePeerMapMin;
  CHECK(algo::peerMapApplies(tuning, min, 2, true));
  CHECK(!algo::peerMapApplies(tuning, min - 1, 2, true));
  CHECK(!algo::peerMapApplies(tuning, min, 3, true));
  CHECK(!algo::peerMapApplies(tuning, min, 2, false));
  algo::Tuning off = tuning;
  off.peerMap = PeerMapMode::kOff;
  CHECK(!algo::peerMapApplies(off, min, 2, true));
  CHECK(!algo::peerMapApplies(algo::Tuning{}, min, 2, true));  // off by default
  algo::Tuning on = tuning;  // every size, as a forced algorithm
  on.peerMap = PeerMapMode::kOn;
  CHECK(algo::peerMapApplies(on, 0, 2, true) && algo::peerMapApplies(on, min - 1, 2, true));
  CHECK(!algo::peerMapApplies(on, min, 2, false) && !algo::peerMapApplies(on, min, 3, true));
  algo::Tuning forced = tuning;
  forced.forced[static_cast<size_t>(algo::Op::kAllreduce)] = algo::Algorithm::kRing;
  CHECK(!algo::peerMapApplies(forced, min, 2, true));

  // Through allreduce(): device-labelled memory that the transport carries (ucx's CUDA
  // tensors) maps from the threshold, host memory never; results exact either way.
  const DType d = DType::kInt32;
  const Reduction sum = makeReduction(d, ReduceKind::kSum);
  for (const bool device : {true, false}) {
    inproc::WorldOptions options = pairWithMaps(PeerMapMode::kAuto);
    options.carried = device;
    ThreadWorld world(options);
    uint32_t salt = 0;
    for (const size_t bytes : {min, min - 4, size_t{1} << 20}) {
      const size_t count = bytes / elementSize(d);
      const uint64_t before = world.peerMapsMade();
      ++salt;
      const std::string problems = world.run([&, salt](Comm& c) {
        GuardedBuffer data(count * elementSize(d), inputBytes(d, ReduceKind::kSum, c.rank(),
                                                              count, salt));
        algo::allreduce(c, data.data(), count, sum);
        return compare(data, reducedBytes(d, ReduceKind::kSum, 2, 0, count, salt), "result");
      });
      const std::string label = std::string(device ? "device" : "host") + " memory, " +
                                std::to_string(bytes) + " bytes";
      CHECK_MSG(problems.empty(), label + ":\n" + problems);
      const uint64_t want = device && bytes >= min ? 2 : 0;
      CHECK_MSG(world.peerMapsMade() - before == want,
                label + ": " + std::to_string(world.peerMapsMade() - before) +
                    " mappings, want " + std::to_string(want));
    }
  }

  // device_peer_map=on takes it at every size, an empty vector included (which maps nothing).
  {
    inproc::WorldOptions options = pairWithMaps(PeerMapMode::kOn);
    options.carried = true;
    ThreadWorld world(options);
    uint32_t salt = 100;
    for (const size_t count : {size_t{0}, size_t{1}, size_t{3}}) {
      const uint64_t before = world.peerMapsMade();
      ++salt;
      const std::string problems = world.run([&, salt, count](Comm& c) {
        GuardedBuffer data(count * elementSize(d), inputBytes(d, ReduceKind::kSum, c.rank(),
                                                              count, salt));
        algo::allreduce(c, data.data(), count, sum);
        return compare(data, reducedBytes(d, ReduceKind::kSum, 2, 0, count, salt), "result");
      });
      const std::string label = "on, " + std::to_string(count) + " elements";
      CHECK_MSG(problems.empty(), label + ":\n" + problems);
      CHECK_MSG(world.peerMapsMade() - before == (count > 0 ? 2u : 0u),
                label + ": " + std::to_string(world.peerMapsMade() - before) + " mappings");
    }
  }

  // A transport wrapped for fault injection (a group made with
  // UCXBACKEND_TEST_FAULT_INJECTION=1) maps as the transport it wraps: a test that injects a
  // fault into a peer-mapped op must reach the peer map, not a fallback or "cannot map".
  {
    inproc::WorldOptions options = pairWithMaps(PeerMapMode::kOn);
    options.carried = true;
    options.faultWrapped = true;
    ThreadWorld world(options);
    const size_t count = 5;
    const std::string problems = world.run([&](Comm& c) {
      GuardedBuffer data(count * elementSize(d), inputBytes(d, ReduceKind::kSum, c.rank(),
                                                            count, 200));
      algo::allreduce(c, data.data(), count, sum);
      return compare(data, reducedBytes(d, ReduceKind::kSum, 2, 0, count, 200), "result");
    });
    CHECK_MSG(problems.empty(), "fault-wrapped transports:\n" + problems);
    CHECK_MSG(world.peerMapsMade() == 2,
              "fault-wrapped transports: " + std::to_string(world.peerMapsMade()) + " mappings");
  }

  // The scratch a CUDA op is lent at issue (algo::scratchBytes): none where the peer map
  // runs and never falls back (device_peer_map=on; it folds in the ranks' own buffers), what
  // the automatic choice asks for where it may (auto: a rank that cannot map). Each run with
  // exactly that much (IssueSizedScratch), in device chunks.
  for (const PeerMapMode mode : {PeerMapMode::kOn, PeerMapMode::kAuto}) {
    for (const int refusing : {-1, 1}) {
      if (mode == PeerMapMode::kOn && refusing >= 0) continue;  // fails: nothing to size
      inproc::WorldOptions options = pairWithMaps(mode);
      options.carried = true;
      options.peerMapRefusingRank = refusing;
      options.tuning.chunkBytes = algo::kDeviceChunkBytes;
      ThreadWorld world(options);
      uint32_t salt = 300;
      for (const size_t count : {size_t{1}, size_t{7}, min / elementSize(d), size_t{1} << 20}) {
        ++salt;
        const std::string label = std::string(mode == PeerMapMode::kOn ? "on" : "auto") +
                                  (refusing >= 0 ? ", rank 1 refuses" : "") + ", " +
                                  std::to_string(count) + " elements";
        const size_t lent = algo::scratchBytes(options.tuning, algo::Op::kAllreduce, count,
                                               elementSize(d), 2, true);
        if (mode == PeerMapMode::kOn) {
          CHECK_MSG(lent == 0, label + ": lent " + std::to_string(lent) + " bytes of scratch");
        }
        const std::string problems = world.run([&, salt, count](Comm& c) {
          GuardedBuffer data(count * elementSize(d), inputBytes(d, ReduceKind::kSum, c.rank(),
                                                                count, salt));
          const IssueSizedScratch sized(c, algo::Op::kAllreduce, count, elementSize(d));
          algo::allreduce(c, data.data(), count, sum);
          return compare(data, reducedBytes(d, ReduceKind::kSum, 2, 0, count, salt), "result");
        });
        CHECK_MSG(problems.empty(), label + ":\n" + problems);
      }
    }
  }
}

namespace {

// One 1 MiB int32 all_reduce through allreduce() on device-labelled memory in a world made
// with `options`; returns the ranks' reports.
std::string runDeviceAllreduce(const inproc::WorldOptions& options, uint64_t* mapsMade = nullptr) {
  ThreadWorld world(options);
  const DType d = DType::kInt32;
  const size_t count = (size_t{1} << 20) / elementSize(d);
  const std::string problems = world.run([&](Comm& c) {
    GuardedBuffer data(count * elementSize(d), inputBytes(d, ReduceKind::kSum, c.rank(), count, 9));
    algo::allreduce(c, data.data(), count, makeReduction(d, ReduceKind::kSum));
    return compare(data, reducedBytes(d, ReduceKind::kSum, 2, 0, count, 9), "result");
  });
  if (mapsMade != nullptr) *mapsMade = world.peerMapsMade();
  return problems;
}

bool mentions(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// Rank 0's fold sleeps past the op's timeout: a peer that stalls between its two notices.
thread_local bool stallFold = false;
void stallingSumInt32(void* acc, const void* in, size_t count) {
  if (stallFold) std::this_thread::sleep_for(std::chrono::milliseconds(600));
  findReduce(DType::kInt32, ReduceKind::kSum)(acc, in, count);
}

}  // namespace

void testPeerMapFallbackAndFailures() {
  // A rank that cannot map (a transport that answers unsupported, or throws): with auto both
  // ranks fall back and the result is still exact (so the buffer was untouched before);
  // with on both fail, saying which rank could not map and why.
  struct Case {
    const char* name;
    bool maps;
    int refusing;
    int throwing;
    const char* reason;  // in the error of device_peer_map=on
  };
  const Case cases[] = {
      {"transport without peer maps", false, -1, -1, "does not map memory between ranks"},
      {"rank 1 refuses", true, 1, -1, "rank 1 could not map rank 0's buffer"},
      {"rank 0 throws", true, -1, 0, "rank 0 could not map rank 1's buffer: mapping failed"},
  };
  for (const Case& k : cases) {
    for (const PeerMapMode mode : {PeerMapMode::kAuto, PeerMapMode::kOn}) {
      inproc::WorldOptions options = pairWithMaps(mode);
      options.carried = true;
      options.peerMaps = k.maps;
      options.peerMapRefusingRank = k.refusing;
      options.peerMapThrowingRank = k.throwing;
      const std::string problems = runDeviceAllreduce(options);
      const std::string label =
          std::string(k.name) + (mode == PeerMapMode::kOn ? ", on" : ", auto");
      if (mode == PeerMapMode::kAuto) {
        CHECK_MSG(problems.empty(), label + ":\n" + problems);
      } else {
        CHECK_MSG(mentions(problems, "rank 0: ") && mentions(problems, "rank 1: ") &&
                      mentions(problems, "device_peer_map=on") && mentions(problems, k.reason),
                  label + ":\n" + problems);
      }
    }
  }

  // A peer that stalls past the op's timeout, while mapping (before its answer) or while
  // folding (before its "folded"): the other rank's op ends in the timeout, naming the peer.
  {
    inproc::WorldOptions options = pairWithMaps(PeerMapMode::kAuto);
    options.carried = true;
    options.opTimeout = std::chrono::milliseconds(300);
    options.peerMapStallingRank = 1;
    options.peerMapStall = std::chrono::milliseconds(600);
    const std::string problems = runDeviceAllreduce(options);
    CHECK_MSG(mentions(problems, "rank 0: ") &&
                  mentions(problems, "no progress before the timeout") &&
                  mentions(problems, "bytes from rank 1"),
              "stalled while mapping:\n" + problems);
  }
  {
    inproc::WorldOptions options = pairWithMaps(PeerMapMode::kAuto);
    options.carried = true;
    options.opTimeout = std::chrono::milliseconds(300);
    ThreadWorld world(options);
    const size_t count = (size_t{1} << 20) / sizeof(int32_t);
    Reduction stalling = makeReduction(DType::kInt32, ReduceKind::kSum);
    stalling.fn = stallingSumInt32;
    // The buffers outlive the op: rank 0 still folds out of rank 1's after rank 1 has given
    // up, as a CUDA rank reads a peer allocation that its IPC mapping keeps alive.
    std::vector<std::vector<int32_t>> buffers = {std::vector<int32_t>(count, 1),
                                                 std::vector<int32_t>(count, 2)};
    const std::string problems = world.run([&](Comm& c) {
      std::vector<int32_t>& data = buffers[static_cast<size_t>(c.rank())];
      stallFold = c.rank() == 0;
      algo::allreduce(c, data.data(), count, stalling);
      stallFold = false;
      return std::string();
    });
    CHECK_MSG(mentions(problems, "rank 1: ") &&
                  mentions(problems, "no progress before the timeout") &&
                  mentions(problems, "bytes from rank 0"),
              "stalled while folding:\n" + problems);
  }
}

}  // namespace ucxb::algotest
