// The collectives that only move bytes (broadcast, all_gather, gather, scatter, all_to_all)
// and the barrier, every algorithm, each result against patternBytes() (elements.h).
#include <atomic>
#include <chrono>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include "csrc/collectives/algorithms.h"
#include "tests/cpp/algorithms/elements.h"
#include "tests/cpp/algorithms/groups.h"
#include "tests/cpp/algorithms/guarded_buffer.h"
#include "tests/cpp/algorithms/sweep.h"

namespace ucxb::algotest {

using algo::Algorithm;
using algo::Op;
using inproc::ThreadWorld;

// --- broadcast -------------------------------------------------------------------------------

void broadcastWith(Algorithm a) {
  sweep(Op::kBroadcast, a, [](ThreadWorld&, const WorldShape& shape, const auto& run) {
    uint32_t salt = 0;
    for (size_t bytes : byteSizes(shape)) {
      for (int root : roots(shape)) {
        ++salt;
        run("bytes=" + std::to_string(bytes) + " root=" + std::to_string(root),
            [&, bytes, root, salt](Comm& c) {
              const std::string want = algotest::patternBytes(root, bytes, salt);
              GuardedBuffer data(bytes, c.rank() == root ? want : std::string());
              algo::broadcast(c, data.data(), bytes, root);
              return compare(data, want, c.rank() == root ? "root's data" : "result");
            });
      }
    }
  });
}

void testBroadcastBinomial() { broadcastWith(Algorithm::kBinomial); }
void testBroadcastChain() { broadcastWith(Algorithm::kChain); }

// --- all_gather ------------------------------------------------------------------------------

void allgatherWith(Algorithm a) {
  sweep(Op::kAllgather, a, [](ThreadWorld&, const WorldShape& shape, const auto& run) {
    uint32_t salt = 0;
    for (size_t bytes : byteSizes(shape)) {
      // In place: rank r's input is already outs[r] (all_gather_into_tensor's usual layout).
      for (bool inPlace : {false, true}) {
        if (inPlace && shape.stepSpace()) continue;
        ++salt;
        run("bytes=" + std::to_string(bytes) + (inPlace ? " in place" : ""),
            [&, bytes, inPlace, salt](Comm& c) {
              const int n = c.size();
              const std::string mine = algotest::patternBytes(c.rank(), bytes, salt);
              GuardedBuffer in(bytes, mine);
              std::vector<std::unique_ptr<GuardedBuffer>> outs;
              std::vector<void*> outPtrs;
              for (int p = 0; p < n; ++p) {
                outs.push_back(std::make_unique<GuardedBuffer>(
                    bytes, inPlace && p == c.rank() ? mine : std::string()));
                outPtrs.push_back(outs.back()->data());
              }
              algo::allgather(c, inPlace ? outPtrs[c.rank()] : in.data(), outPtrs, bytes);
              std::string wrong = compare(in, mine, "input");
              for (int p = 0; p < n; ++p) {
                wrong += compare(*outs[p], algotest::patternBytes(p, bytes, salt),
                                 "block of rank " + std::to_string(p));
              }
              return wrong;
            });
      }
    }
  });
}

void testAllgatherRing() { allgatherWith(Algorithm::kRing); }
void testAllgatherBruck() { allgatherWith(Algorithm::kBruck); }
void testAllgatherLinear() { allgatherWith(Algorithm::kLinear); }

// --- gather and scatter (linear at the root; nothing to force) --------------------------------

void testGather() {
  sweep(Op::kAllgather, Algorithm::kAuto, [](ThreadWorld&, const WorldShape& shape,
                                            const auto& run) {
    uint32_t salt = 0;
    for (size_t bytes : byteSizes(shape)) {
      for (int root : roots(shape)) {
        ++salt;
        run("bytes=" + std::to_string(bytes) + " root=" + std::to_string(root),
            [&, bytes, root, salt](Comm& c) {
              const int n = c.size();
              const std::string mine = algotest::patternBytes(c.rank(), bytes, salt);
              GuardedBuffer in(bytes, mine);
              std::vector<std::unique_ptr<GuardedBuffer>> outs;
              std::vector<void*> outPtrs;
              if (c.rank() == root) {
                for (int p = 0; p < n; ++p) {
                  outs.push_back(std::make_unique<GuardedBuffer>(bytes));
                  outPtrs.push_back(outs.back()->data());
                }
              }
              algo::gather(c, in.data(), outPtrs, bytes, root);
              std::string wrong = compare(in, mine, "input");
              for (size_t p = 0; p < outs.size(); ++p) {
                wrong += compare(*outs[p], algotest::patternBytes(static_cast<int>(p), bytes, salt),
                                 "block of rank " + std::to_string(p));
              }
              return wrong;
            });
      }
    }
  });
}

void testScatter() {
  sweep(Op::kAllgather, Algorithm::kAuto, [](ThreadWorld&, const WorldShape& shape,
                                            const auto& run) {
    uint32_t salt = 0;
    for (size_t bytes : byteSizes(shape)) {
      for (int root : roots(shape)) {
        ++salt;
        run("bytes=" + std::to_string(bytes) + " root=" + std::to_string(root),
            [&, bytes, root, salt](Comm& c) {
              const int n = c.size();
              // The root's block for rank p is pattern "rank" 100 + p.
              std::vector<std::unique_ptr<GuardedBuffer>> ins;
              std::vector<const void*> inPtrs;
              if (c.rank() == root) {
                for (int p = 0; p < n; ++p) {
                  ins.push_back(std::make_unique<GuardedBuffer>(
                      bytes, algotest::patternBytes(100 + p, bytes, salt)));
                  inPtrs.push_back(ins.back()->data());
                }
              }
              GuardedBuffer out(bytes);
              algo::scatter(c, inPtrs, out.data(), bytes, root);
              std::string wrong = compare(
                  out, algotest::patternBytes(100 + c.rank(), bytes, salt), "result");
              for (size_t p = 0; p < ins.size(); ++p) {
                wrong += compare(*ins[p],
                                 algotest::patternBytes(100 + static_cast<int>(p), bytes, salt),
                                 "root's block for rank " + std::to_string(p));
              }
              return wrong;
            });
      }
    }
  });
}

// --- all_to_all ------------------------------------------------------------------------------

// Bytes rank `from` sends rank `to`: uneven, zero for some pairs, ~`base` on average.
size_t alltoallBytes(int from, int to, size_t base) {
  if (base == 0) return 0;
  return (base * (1 + static_cast<size_t>((from * 5 + to * 3) % 4))) / 2 -
         static_cast<size_t>((from + to) % 3 == 0 ? base / 2 : 0);
}

void alltoallWith(Algorithm a) {
  sweep(Op::kAlltoall, a, [](ThreadWorld&, const WorldShape& shape, const auto& run) {
    uint32_t salt = 0;
    for (size_t base : byteSizes(shape)) {
      ++salt;
      run("bytes~" + std::to_string(base), [&, base, salt](Comm& c) {
        const int n = c.size();
        const int r = c.rank();
        std::vector<std::unique_ptr<GuardedBuffer>> sends;
        std::vector<std::unique_ptr<GuardedBuffer>> recvs;
        std::vector<const void*> sendPtrs;
        std::vector<void*> recvPtrs;
        std::vector<size_t> sendBytes;
        std::vector<size_t> recvBytes;
        // The pattern of the block from s to d is "rank" s * 64 + d.
        for (int p = 0; p < n; ++p) {
          sendBytes.push_back(alltoallBytes(r, p, base));
          recvBytes.push_back(alltoallBytes(p, r, base));
          sends.push_back(std::make_unique<GuardedBuffer>(
              sendBytes[p], algotest::patternBytes(r * 64 + p, sendBytes[p], salt)));
          recvs.push_back(std::make_unique<GuardedBuffer>(recvBytes[p]));
          sendPtrs.push_back(sends.back()->data());
          recvPtrs.push_back(recvs.back()->data());
        }
        algo::alltoall(c, sendPtrs, sendBytes, recvPtrs, recvBytes);
        std::string wrong;
        for (int p = 0; p < n; ++p) {
          wrong += compare(*recvs[p], algotest::patternBytes(p * 64 + r, recvBytes[p], salt),
                           "block from rank " + std::to_string(p));
          wrong += compare(*sends[p], algotest::patternBytes(r * 64 + p, sendBytes[p], salt),
                           "input block for rank " + std::to_string(p));
        }
        return wrong;
      });
    }
  });
}

void testAlltoallPairwise() { alltoallWith(Algorithm::kPairwise); }
void testAlltoallLinear() { alltoallWith(Algorithm::kLinear); }

// --- barrier ---------------------------------------------------------------------------------

// Round k: one rank (a different one each round) arrives 2 ms late; nobody may leave the
// barrier before every rank has arrived.
void testBarrier() {
  sweep(Op::kAllreduce, Algorithm::kAuto, [](ThreadWorld&, const WorldShape& shape,
                                            const auto& run) {
    if (shape.large() || shape.stepSpace()) return;
    std::atomic<int> arrived{0};
    for (int round = 0; round < 3 * shape.size; ++round) {
      run("round " + std::to_string(round), [&, round](Comm& c) -> std::string {
        if (c.rank() == round % c.size()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        arrived.fetch_add(1);
        algo::barrier(c);
        const int seen = arrived.load();
        if (seen < (round + 1) * c.size()) {
          return "left the barrier after " + std::to_string(seen) + " arrivals, before " +
                 std::to_string((round + 1) * c.size());
        }
        return "";
      });
    }
  });
}

}  // namespace ucxb::algotest
