// The OpDriver of one rank in the algorithm tests: waits on its transport's requests on the
// rank's own thread, sleeping on the transport's event fd between events (no busy polling),
// and lends the op a scratch buffer and, optionally, staging slots. It stands in for the
// backend's ProgressEngine, whose thread and task queue the algorithms do not need.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "csrc/collectives/op_driver.h"

namespace ucxb::inproc {

class ThreadDriver : public OpDriver {
 public:
  // `stagingAsks`, when given, counts the calls of staging(): a test of an op on device
  // memory expects none (transport.h's takesHostPaths).
  ThreadDriver(Transport& transport, std::unique_ptr<StagingArea> staging,
               std::atomic<uint64_t>* stagingAsks = nullptr)
      : transport_(transport), staging_(std::move(staging)), stagingAsks_(stagingAsks) {}

  void waitAll(const std::vector<RequestPtr>& requests, Clock::time_point deadline) override;
  void abandon(const std::vector<RequestPtr>& requests) override;
  uint8_t* scratch(size_t bytes) override;
  // The most scratch an op on this thread may ask for (SIZE_MAX: any): a CUDA op's scratch is
  // allocated when it is issued (algo::scratchBytes), and DeviceMemory::scratch refuses a
  // request beyond it; scratch() throws OpFailed here alike. Set by a job for its op.
  static thread_local size_t scratchLimit;
  StagingArea* staging() const override {
    if (stagingAsks_ != nullptr) ++*stagingAsks_;
    return staging_.get();
  }

 private:
  Transport& transport_;
  std::unique_ptr<StagingArea> staging_;
  std::atomic<uint64_t>* const stagingAsks_;
  std::vector<uint8_t> scratch_;  // grow-only, like the engine's pool
};

}  // namespace ucxb::inproc
