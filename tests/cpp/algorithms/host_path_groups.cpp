// Routing by memory type (transport.h's takesHostPaths): an op on device memory takes none of
// the paths that touch its bytes on the host outside OpMemory, even where the group offers
// them all. The worlds here offer every one (shared-memory slots, the pair slots at two ranks,
// a transport that folds receives) and run each op at sizes that take them on host memory:
// on host memory they must be asked for (so the world really offers them), on device-labelled
// memory (CarriedMemory: the transport takes it, as ucx takes CUDA tensors; BouncingMemory:
// staged through host buffers, as udp stages them) never, and every result must be right.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "csrc/collectives/algorithms.h"
#include "csrc/collectives/scratch_size.h"
#include "tests/cpp/algorithms/elements.h"
#include "tests/cpp/algorithms/groups.h"
#include "tests/cpp/algorithms/guarded_buffer.h"
#include "tests/cpp/algorithms/issue_sized_scratch.h"
#include "tests/cpp/check.h"
#include "tests/cpp/inproc/thread_world.h"

namespace ucxb::algotest {

using inproc::ThreadWorld;

namespace {

enum class Memory { kHost, kCarried, kBounced };

const char* nameOf(Memory m) {
  switch (m) {
    case Memory::kHost: return "host";
    case Memory::kCarried: return "carried device";
    case Memory::kBounced: return "bounced device";
  }
  return "?";
}

// Byte i of rank r's message in a movement case numbered `salt`.
std::string pattern(int rank, size_t bytes, uint32_t salt) {
  std::string s(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) {
    s[i] = static_cast<char>((static_cast<size_t>(rank) * 31 + i * 7 + salt * 13) & 0xff);
  }
  return s;
}

// Every op once per size at which host memory takes a host path: the 2-rank exchange and the
// pair slots (16 B, 8 KiB), the staged slots (128 KiB, 1 MiB), recursive doubling's folded
// receives (n=3, 8 KiB). Returns what went wrong ("" when nothing did).
std::string runOps(ThreadWorld& world) {
  std::string problems;
  const DType dt = DType::kInt32;
  const ReduceKind sum = ReduceKind::kSum;
  const Reduction red = makeReduction(dt, sum);
  const size_t esz = elementSize(dt);
  uint32_t salt = 0;
  const auto note = [&](const std::string& what, const std::string& report) {
    if (!report.empty()) problems += what + ":\n" + report;
  };
  for (const size_t count : {size_t{4}, size_t{2048}, size_t{32768}, size_t{262145}}) {
    ++salt;
    note("all_reduce of " + std::to_string(count) + " int32", world.run([&, salt](Comm& c) {
      GuardedBuffer data(count * esz, inputBytes(dt, sum, c.rank(), count, salt));
      const IssueSizedScratch sized(c, algo::Op::kAllreduce, count, esz);
      algo::allreduce(c, data.data(), count, red);
      return compare(data, reducedBytes(dt, sum, c.size(), 0, count, salt), "result");
    }));
  }
  const size_t block = 32768;  // elements: 128 KiB, over the staged threshold
  ++salt;
  note("reduce_scatter", world.run([&, salt](Comm& c) {
    const int n = c.size();
    const std::string input = inputBytes(dt, sum, c.rank(), block * n, salt);
    GuardedBuffer in(input.size(), input);
    GuardedBuffer out(block * esz);
    std::vector<const void*> blocks;
    for (int p = 0; p < n; ++p) blocks.push_back(in.data() + p * block * esz);
    const IssueSizedScratch sized(c, algo::Op::kReduceScatter, block * n, esz);
    algo::reduceScatter(c, blocks, out.data(), block, red);
    return compare(out, reducedBytes(dt, sum, n, c.rank() * block, block, salt), "result");
  }));
  ++salt;
  note("reduce", world.run([&, salt](Comm& c) {
    const std::string input = inputBytes(dt, sum, c.rank(), block, salt);
    GuardedBuffer in(input.size(), input);
    GuardedBuffer out(block * esz);
    const IssueSizedScratch sized(c, algo::Op::kReduce, block, esz);
    algo::reduce(c, in.data(), out.data(), block, red, 0);
    if (c.rank() != 0) return std::string();
    return compare(out, reducedBytes(dt, sum, c.size(), 0, block, salt), "result");
  }));
  const size_t bytes = block * esz;
  ++salt;
  note("broadcast", world.run([&, salt](Comm& c) {
    const int root = c.size() - 1;
    const std::string want = pattern(root, bytes, salt);
    GuardedBuffer data(bytes, c.rank() == root ? want : std::string());
    algo::broadcast(c, data.data(), bytes, root);
    return compare(data, want, "result");
  }));
  ++salt;
  note("all_gather", world.run([&, salt](Comm& c) {
    GuardedBuffer in(bytes, pattern(c.rank(), bytes, salt));
    std::vector<GuardedBuffer> outs;
    outs.reserve(c.size());
    std::vector<void*> ptrs;
    for (int p = 0; p < c.size(); ++p) ptrs.push_back(outs.emplace_back(bytes).data());
    algo::allgather(c, in.data(), ptrs, bytes);
    std::string report;
    for (int p = 0; p < c.size(); ++p) {
      report += compare(outs[p], pattern(p, bytes, salt), "block " + std::to_string(p));
    }
    return report;
  }));
  ++salt;
  note("all_to_all", world.run([&, salt](Comm& c) {
    const int n = c.size();
    std::vector<GuardedBuffer> ins;
    std::vector<GuardedBuffer> outs;
    ins.reserve(n);
    outs.reserve(n);
    std::vector<const void*> sends;
    std::vector<void*> recvs;
    for (int p = 0; p < n; ++p) {
      // Rank r's block for p: pattern(r, ...) salted by p.
      sends.push_back(ins.emplace_back(bytes, pattern(c.rank(), bytes, salt + p)).data());
      recvs.push_back(outs.emplace_back(bytes).data());
    }
    const std::vector<size_t> sizes(n, bytes);
    algo::alltoall(c, sends, sizes, recvs, sizes);
    std::string report;
    for (int p = 0; p < n; ++p) {
      report += compare(outs[p], pattern(p, bytes, salt + c.rank()), "from " + std::to_string(p));
    }
    return report;
  }));
  return problems;
}

}  // namespace

void testDeviceMemoryTakesNoHostPath() {
  CHECK(takesHostPaths(MemoryType::kHost));
  CHECK(!takesHostPaths(MemoryType::kCuda));
  for (const int n : {2, 3}) {
    for (const Memory memory : {Memory::kHost, Memory::kCarried, Memory::kBounced}) {
      inproc::WorldOptions options;
      options.size = n;
      options.staged = true;
      options.folds = true;
      options.carried = memory == Memory::kCarried;
      options.bounced = memory == Memory::kBounced;
      ThreadWorld world(options);
      const std::string label = "n=" + std::to_string(n) + " " + nameOf(memory) + " memory";
      const std::string problems = runOps(world);
      CHECK_MSG(problems.empty(), label + ":\n" + problems);
      const auto uses = world.hostPathUses();
      const std::string counts = label + ": " + std::to_string(uses.stagingAsks) +
                                 " staging asks, " + std::to_string(uses.folds) + " folds";
      if (memory == Memory::kHost) {
        // The world offers both paths: without this, none asked for below proves nothing.
        CHECK_MSG(uses.stagingAsks > 0 && uses.folds > 0, counts);
      } else {
        CHECK_MSG(uses.stagingAsks == 0 && uses.folds == 0, counts);
      }
      std::printf("  %s\n", counts.c_str());
    }
  }
}

void testDevicePairAllreduceExchangesOnce() {
  // The choice: two ranks on device memory take recursive doubling up to one chunk, host
  // memory and larger groups keep theirs, a forced algorithm stays forced.
  algo::Tuning tuning;
  const size_t chunk = tuning.chunkBytes;
  const auto pick = [&](size_t bytes, int n, bool device) {
    return algo::choose(tuning, algo::Op::kAllreduce, bytes, n, device);
  };
  CHECK(pick(size_t{1} << 20, 2, true) == algo::Algorithm::kRecursiveDoubling);
  CHECK(pick(chunk, 2, true) == algo::Algorithm::kRecursiveDoubling);
  CHECK(pick(chunk + 1, 2, true) == algo::Algorithm::kRing);
  CHECK(pick(size_t{1} << 20, 2, false) == algo::Algorithm::kRing);
  CHECK(pick(size_t{1} << 20, 3, true) == pick(size_t{1} << 20, 3, false));
  algo::Tuning forced = tuning;
  forced.forced[static_cast<size_t>(algo::Op::kAllreduce)] = algo::Algorithm::kRing;
  CHECK(algo::choose(forced, algo::Op::kAllreduce, size_t{1} << 20, 2, true) ==
        algo::Algorithm::kRing);

  // The scratch a CUDA op is given at issue (algo::scratchBytes, in device chunks): the peer's
  // vector where one exchange is posted at once or the message fits one chunk (a small op:
  // not two chunks), two chunks for a chunked exchange, and none for the ops that reduce
  // nothing (testScratchFitsTheMessage bounds it for every op). (Every reducing algorithm
  // runs with exactly this much: issue_sized_scratch.h.)
  algo::Tuning device;
  device.chunkBytes = algo::kDeviceChunkBytes;
  const auto scratch = [&](algo::Op op, size_t count, int n) {
    return algo::scratchBytes(device, op, count, 4, n, true);
  };
  CHECK_EQ(scratch(algo::Op::kAllreduce, 1, 2), size_t{4});
  CHECK_EQ(scratch(algo::Op::kAllreduce, 1024, 4), size_t{4096});
  CHECK_EQ(scratch(algo::Op::kAllreduce, size_t{1} << 20, 2), size_t{4} << 20);
  CHECK_EQ(scratch(algo::Op::kAllreduce, size_t{1} << 28, 4), 2 * algo::kDeviceChunkBytes);
  CHECK_EQ(scratch(algo::Op::kReduce, size_t{1} << 28, 4), 2 * algo::kDeviceChunkBytes);
  CHECK_EQ(scratch(algo::Op::kReduceScatter, size_t{1} << 28, 2), size_t{0});
  CHECK_EQ(scratch(algo::Op::kBroadcast, size_t{1} << 28, 4), size_t{0});
  CHECK_EQ(scratch(algo::Op::kAllreduce, size_t{1} << 28, 1), size_t{0});

  // The messages: a 1 MiB all_reduce of two ranks sends one message a rank on device memory
  // (carried as ucx carries CUDA tensors, or bounced through host buffers as udp stages them),
  // two on host memory without slots (the ring: a reduce-scatter half, an all-gather half),
  // and every result is exact.
  const DType dt = DType::kInt32;
  const Reduction red = makeReduction(dt, ReduceKind::kSum);
  const size_t count = (size_t{1} << 20) / elementSize(dt);
  for (const Memory memory : {Memory::kHost, Memory::kCarried, Memory::kBounced}) {
    inproc::WorldOptions options;
    options.size = 2;
    options.carried = memory == Memory::kCarried;
    options.bounced = memory == Memory::kBounced;
    ThreadWorld world(options);
    uint32_t salt = 0;
    for (int op = 0; op < 3; ++op) {
      ++salt;
      const std::string problems = world.run([&, salt](Comm& c) {
        GuardedBuffer data(count * elementSize(dt),
                           inputBytes(dt, ReduceKind::kSum, c.rank(), count, salt));
        const IssueSizedScratch sized(c, algo::Op::kAllreduce, count, elementSize(dt));
        algo::allreduce(c, data.data(), count, red);
        return compare(data, reducedBytes(dt, ReduceKind::kSum, 2, 0, count, salt), "result");
      });
      CHECK_MSG(problems.empty(), std::string(nameOf(memory)) + " memory:\n" + problems);
    }
    const uint64_t perRankPerOp = world.sendsPosted() / (2 * 3);
    const uint64_t want = memory == Memory::kHost ? 2 : 1;
    CHECK_MSG(perRankPerOp == want && world.sendsPosted() % 6 == 0,
              std::string(nameOf(memory)) + " memory: " + std::to_string(world.sendsPosted()) +
                  " sends in 3 ops of 2 ranks, want " + std::to_string(want) + " a rank an op");
    std::printf("  %s memory: %llu sends a rank an op\n", nameOf(memory),
                static_cast<unsigned long long>(perRankPerOp));
  }
}

void testScratchFitsTheMessage() {
  // The scratch a CUDA op is lent at issue (algo::scratchBytes) is bounded by its message,
  // whatever the chunk size: two slots of at most the message each (a chunk each where the
  // message is longer), plus reduce_scatter's working copy of its input. A group keeps the
  // largest it lent: with 64 MiB device chunks, a 4-byte reduce lent two chunks would hold
  // 128 MiB of device memory for the group's life, on the default cuda_wait=host path too.
  const algo::Op reducing[] = {algo::Op::kAllreduce, algo::Op::kReduce,
                               algo::Op::kReduceScatter};
  for (const size_t chunkBytes : {algo::kDeviceChunkBytes, algo::kHostChunkBytes}) {
    for (const algo::Op op : reducing) {
      for (const std::string& name : algo::namesFor(op)) {
        algo::Tuning tuning;
        tuning.chunkBytes = chunkBytes;
        tuning.forced[static_cast<size_t>(op)] = algo::parseAlgorithm(op, name);
        for (const int n : {2, 3, 4, 5, 8}) {
          for (const size_t per : {size_t{1}, size_t{5}, size_t{1000}, size_t{1} << 14,
                                   size_t{1} << 18}) {
            for (const size_t esz : {size_t{1}, size_t{4}, size_t{8}}) {
              // reduce_scatter's count is its whole input: `per` elements a rank.
              const bool scatter = op == algo::Op::kReduceScatter;
              const size_t count = scatter ? per * static_cast<size_t>(n) : per;
              const size_t bytes = algo::scratchBytes(tuning, op, count, esz, n, true);
              const size_t bound = (scatter ? 3 : 2) * count * esz;
              CHECK_MSG(bytes <= bound,
                        std::string(algo::opName(op)) + " " + name + " n=" + std::to_string(n) +
                            " count=" + std::to_string(count) + " esz=" + std::to_string(esz) +
                            " chunk=" + std::to_string(chunkBytes) + ": scratch " +
                            std::to_string(bytes) + " bytes, more than " + std::to_string(bound));
            }
          }
        }
      }
    }
  }
  algo::Tuning device;
  device.chunkBytes = algo::kDeviceChunkBytes;
  CHECK_EQ(algo::scratchBytes(device, algo::Op::kReduce, 1, 4, 4, true), size_t{8});
  // The peer-mapped pair folds out of the peer's buffer and copies into its own: no scratch
  // where device_peer_map=on takes the op (it has no fallback); with auto a rank that cannot
  // map falls back to the algorithm of choose(), whose scratch it must have.
  const size_t bigCount = size_t{16} << 20;  // 64 MiB of int32
  algo::Tuning mapped = device;
  mapped.peerMap = algo::PeerMapMode::kOn;
  CHECK_EQ(algo::scratchBytes(mapped, algo::Op::kAllreduce, bigCount, 4, 2, true), size_t{0});
  CHECK_EQ(algo::scratchBytes(mapped, algo::Op::kAllreduce, bigCount, 4, 3, true),
           algo::scratchBytes(device, algo::Op::kAllreduce, bigCount, 4, 3, true));
  mapped.peerMap = algo::PeerMapMode::kAuto;
  CHECK_EQ(algo::scratchBytes(mapped, algo::Op::kAllreduce, bigCount, 4, 2, true),
           algo::scratchBytes(device, algo::Op::kAllreduce, bigCount, 4, 2, true));

  // And every reducing algorithm fits what it was lent in device chunks, on device memory
  // staged through host buffers (udp's CUDA path), in odd and even groups, every root.
  const DType dt = DType::kInt32;
  const ReduceKind sum = ReduceKind::kSum;
  const Reduction red = makeReduction(dt, sum);
  const size_t esz = elementSize(dt);
  for (const algo::Op op : reducing) {
    for (const std::string& name : algo::namesFor(op)) {
      for (const int n : {2, 3, 4, 5}) {
        inproc::WorldOptions options;
        options.size = n;
        options.bounced = true;
        options.tuning.chunkBytes = algo::kDeviceChunkBytes;
        options.tuning.forced[static_cast<size_t>(op)] = algo::parseAlgorithm(op, name);
        ThreadWorld world(options);
        uint32_t salt = 0;
        for (const size_t per : {size_t{1}, size_t{7}, size_t{3000}}) {
          ++salt;
          const std::string label = std::string(algo::opName(op)) + " " + name +
                                    " n=" + std::to_string(n) + " count=" + std::to_string(per);
          std::string problems;
          if (op == algo::Op::kAllreduce) {
            problems = world.run([&, salt](Comm& c) {
              GuardedBuffer data(per * esz, inputBytes(dt, sum, c.rank(), per, salt));
              const IssueSizedScratch sized(c, op, per, esz);
              algo::allreduce(c, data.data(), per, red);
              return compare(data, reducedBytes(dt, sum, n, 0, per, salt), "result");
            });
          } else if (op == algo::Op::kReduce) {
            for (int root = 0; root < n && problems.empty(); ++root) {
              problems = world.run([&, salt, root](Comm& c) {
                const std::string input = inputBytes(dt, sum, c.rank(), per, salt);
                GuardedBuffer in(input.size(), input);
                GuardedBuffer out(per * esz);
                const IssueSizedScratch sized(c, op, per, esz);
                algo::reduce(c, in.data(), out.data(), per, red, root);
                if (c.rank() != root) return std::string();
                return compare(out, reducedBytes(dt, sum, n, 0, per, salt), "result");
              });
            }
          } else {
            problems = world.run([&, salt](Comm& c) {
              const std::string input = inputBytes(dt, sum, c.rank(), per * n, salt);
              GuardedBuffer in(input.size(), input);
              GuardedBuffer out(per * esz);
              std::vector<const void*> blocks;
              for (int p = 0; p < n; ++p) blocks.push_back(in.data() + p * per * esz);
              const IssueSizedScratch sized(c, op, per * n, esz);
              algo::reduceScatter(c, blocks, out.data(), per, red);
              return compare(out, reducedBytes(dt, sum, n, c.rank() * per, per, salt),
                             "result");
            });
          }
          CHECK_MSG(problems.empty(), label + ":\n" + problems);
        }
      }
    }
  }
}

}  // namespace ucxb::algotest
