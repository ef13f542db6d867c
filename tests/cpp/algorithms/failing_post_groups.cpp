// A posted all_reduce whose slot cannot be filled (staged_exchange.cpp: reserving the slot's
// pages fails, as on a full /dev/shm) after its notices' receives are posted: the half-made
// exchange must give those receives up before its buffers are freed. Rank 0 goes on driving
// its transport with the Comm alive (as the backend's progress thread does), so rank 1's
// notice arrives while a receive left behind would still point into the freed exchange: a
// heap-use-after-free under AddressSanitizer (tests/test_algorithms_asan.py). Both ranks
// must fail with a clear error, rank 1 at its op deadline, not hang.
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "csrc/collectives/algorithms.h"
#include "tests/cpp/algorithms/groups.h"
#include "tests/cpp/check.h"
#include "tests/cpp/inproc/thread_world.h"
#include "transports/tag.h"

namespace ucxb::algotest {

using inproc::ThreadWorld;

void testAllreduceHalfMade() {
  inproc::WorldOptions options;
  options.size = 2;
  options.staged = true;
  options.unreservedRank = 0;
  options.opTimeout = std::chrono::milliseconds(1000);
  const Reduction sum = makeReduction(DType::kInt32, ReduceKind::kSum);
  // Rank 1's "my op is posted": a step no all_reduce uses, sent after its notice.
  constexpr uint32_t kPostedStep = static_cast<uint32_t>(tag::kMaxSteps - 1);
  // 64 KiB: the pair slot; 1 MiB: one notice per piece of the staged slots.
  for (const size_t bytes : {size_t{64} << 10, size_t{1} << 20}) {
    const size_t count = bytes / sizeof(int32_t);
    // A world each: rank 1 retires its slots when its op fails (the peer may still read them).
    ThreadWorld world(options);
    const std::string label = std::to_string(bytes) + " bytes: ";
    const auto started = std::chrono::steady_clock::now();
    const std::string report = world.run([&](Comm& c) -> std::string {
      if (!algo::allreducePostable(c.tuning(), count, sizeof(int32_t), 2, c.staging())) {
        return label + "not a posted staged all_reduce";
      }
      std::vector<int32_t> data(count, c.rank() + 1);
      if (c.rank() == 0) {
        try {
          algo::postAllreduce(c, data.data(), count, sum);
          return label + "posted on a rank whose slots cannot be reserved";
        } catch (const std::exception& e) {
          if (!check::contains(e.what(), "reserve()")) {
            return label + "unclear error: " + e.what();
          }
        }
        c.wait({c.recv(1, kPostedStep, nullptr, 0)});
        return "";
      }
      std::unique_ptr<algo::PostedOp> op = algo::postAllreduce(c, data.data(), count, sum);
      c.wait({c.send(0, kPostedStep, nullptr, 0)});
      try {
        op->finish(c);
      } catch (const OpTimeout&) {
        return "";  // rank 0's notice never comes
      } catch (const std::exception& e) {
        return label + "failed otherwise than by its deadline: " + e.what();
      }
      return label + "completed without rank 0's part";
    });
    const auto took = std::chrono::steady_clock::now() - started;
    CHECK_MSG(report.empty(), report);
    CHECK_MSG(took < std::chrono::seconds(5), label + "the op took over 5 s to fail");
  }
}

}  // namespace ucxb::algotest
