#include "tests/cpp/inproc/thread_world.h"

#include "tests/cpp/inproc/device_stand_ins.h"

#include <unistd.h>

#include <algorithm>
#include <exception>

#include "tests/cpp/inproc/thread_driver.h"
#include "transports/fault_injection.h"

namespace ucxb::inproc {

namespace {

// Every rank's slots, as setUpStaging (csrc/staging_setup.cpp) lays them out: the group's
// chunk bytes cap the slot size. All ranks live in this process, so each opens its peers'
// segments by name, as a peer process would.
std::vector<std::unique_ptr<StagingArea>> makeStaging(int n, size_t chunkBytes,
                                                      int unreservedRank) {
  StagingLayout layout;
  layout.slotBytes =
      std::clamp(chunkBytes, StagingLayout::kMinSlotBytes, StagingLayout::kMaxSlotBytes);
  layout.pairSlots = n == 2 ? 2 : 0;
  static int worlds = 0;
  const std::string prefix = "/ucxb-algotest-" + std::to_string(getpid()) + "-" +
                             std::to_string(worlds++) + "-r";
  std::vector<shm::SharedSegment> own;
  for (int r = 0; r < n; ++r) {
    own.push_back(shm::SharedSegment::create(prefix + std::to_string(r), layout.segmentBytes()));
  }
  std::vector<std::vector<shm::SharedSegment>> peers(n);
  for (int r = 0; r < n; ++r) {
    peers[r].resize(n);
    for (int p = 0; p < n; ++p) {
      if (p != r) peers[r][p] = shm::SharedSegment::open(prefix + std::to_string(p),
                                                         layout.segmentBytes());
    }
  }
  std::vector<std::unique_ptr<StagingArea>> areas;
  for (int r = 0; r < n; ++r) {
    if (r == unreservedRank) {
      // A view opened, not created: the same pages, but reserve() fails on the first fill.
      shm::SharedSegment view =
          shm::SharedSegment::open(prefix + std::to_string(r), layout.segmentBytes());
      own[r].unlink();
      own[r] = std::move(view);
    }
    own[r].unlink();  // every mapping exists: leave nothing in /dev/shm
    areas.push_back(std::make_unique<StagingArea>(layout, std::move(own[r]), std::move(peers[r])));
  }
  return areas;
}

}  // namespace

ThreadWorld::ThreadWorld(WorldOptions options)
    : options_(options),
      fabric_(options.size, options.folds, options.carried),
      reports_(options.size) {
  if (options_.peerMaps) {
    fabric_.allowPeerMaps(options_.peerMapRefusingRank, options_.peerMapThrowingRank,
                          options_.peerMapStallingRank, options_.peerMapStall);
  }
  std::vector<std::unique_ptr<StagingArea>> staging(options_.size);
  if (options_.staged && options_.size > 1) {
    staging = makeStaging(options_.size, options_.tuning.chunkBytes, options_.unreservedRank);
  }
  for (int r = 0; r < options_.size; ++r) {
    threads_.emplace_back(&ThreadWorld::rankMain, this, r, std::move(staging[r]));
  }
}

ThreadWorld::~ThreadWorld() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& t : threads_) t.join();
}

std::string ThreadWorld::run(const Job& job) {
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &job;
  ++jobNumber_;
  finished_ = 0;
  changed_.notify_all();
  changed_.wait(lock, [&] { return finished_ == options_.size; });
  job_ = nullptr;
  std::string all;
  for (int r = 0; r < options_.size; ++r) {
    if (!reports_[r].empty()) all += "rank " + std::to_string(r) + ": " + reports_[r] + "\n";
    reports_[r].clear();
  }
  return all;
}

void ThreadWorld::rankMain(int rank, std::unique_ptr<StagingArea> staging) {
  // Made and destroyed on this thread: the transport's one owner.
  std::unique_ptr<Transport> transport = fabric_.transport(rank);
  if (options_.faultWrapped) {
    transport = std::make_unique<FaultInjectingTransport>(std::move(transport),
                                                          std::make_shared<FaultSwitch>());
  }
  ThreadDriver driver(*transport, std::move(staging), &stagingAsks_);
  constexpr uint32_t kGroupHash = 0x2a;
  uint64_t done = 0;
  for (;;) {
    const Job* job = nullptr;
    uint64_t number = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stopping_ || jobNumber_ > done; });
      if (stopping_) break;
      job = job_;
      number = jobNumber_;
    }
    std::string report;
    try {
      BouncingMemory bouncing(driver);
      CarriedMemory carried(driver);
      OpMemory* memory = options_.bounced ? static_cast<OpMemory*>(&bouncing)
                         : options_.carried ? static_cast<OpMemory*>(&carried)
                                            : nullptr;
      Comm comm(*transport, driver, kGroupHash, number, Clock::now() + options_.opTimeout,
                options_.tuning, memory);
      report = (*job)(comm);
    } catch (const std::exception& e) {
      report = std::string("threw: ") + e.what();
    }
    done = number;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reports_[rank] = std::move(report);
      ++finished_;
    }
    changed_.notify_all();
  }
}

}  // namespace ucxb::inproc
