// A group of ranks on threads of this process, for the algorithm tests: one Fabric, and per
// rank a thread that owns its InprocTransport and ThreadDriver for the world's lifetime (so
// each transport is only ever used by one thread, as transport.h requires). run() hands every
// rank the same job, each with a Comm for the next op number, and waits for all of them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "csrc/collectives/comm.h"
#include "tests/cpp/inproc/inproc_transport.h"

namespace ucxb::inproc {

struct WorldOptions {
  int size = 1;
  // Give every rank shared-memory slots (as when all ranks share a host), sized from the
  // tuning's chunk bytes as the backend sizes them.
  bool staged = false;
  // With `staged`: this rank's own slots are a view of its segment that cannot reserve pages,
  // so its first fill throws "reserve()" as a full /dev/shm makes it (-1: none such).
  int unreservedRank = -1;
  // Run every op over BouncingMemory (device_stand_ins.h): buffers the transport cannot
  // carry, staged through host buffers by Comm, as udp stages CUDA tensors.
  bool bounced = false;
  // Run every op over CarriedMemory (device_stand_ins.h): device-labelled buffers the
  // transport takes as they are, as ucx takes CUDA tensors. Not with `bounced`.
  bool carried = false;
  // The transport folds receives (Fabric's `folds`): exchangeReduce's folding path.
  bool folds = false;
  // The transports map each other's exposed buffers (Fabric::allowPeerMaps), but for
  // `peerMapRefusingRank` (answers unsupported) and `peerMapThrowingRank` (throws); -1: none.
  bool peerMaps = false;
  int peerMapRefusingRank = -1;
  int peerMapThrowingRank = -1;
  int peerMapStallingRank = -1;  // its mapPeerMemory sleeps peerMapStall first
  std::chrono::milliseconds peerMapStall{0};
  // Every rank's transport wrapped in FaultInjectingTransport (transports/fault_injection.h),
  // never armed: as a group made with UCXBACKEND_TEST_FAULT_INJECTION=1 wraps its transport.
  bool faultWrapped = false;
  algo::Tuning tuning;
  std::chrono::milliseconds opTimeout{10000};
};

class ThreadWorld {
 public:
  // A job runs on every rank's thread; it returns "" or says what went wrong on that rank.
  using Job = std::function<std::string(Comm& comm)>;

  explicit ThreadWorld(WorldOptions options);
  ~ThreadWorld();
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  int size() const { return options_.size; }
  // The host-only paths (transport.h's takesHostPaths) the ops asked for so far, over every
  // rank: the staging slots (OpDriver::staging() calls) and folding receives posted.
  struct HostPathUses {
    uint64_t stagingAsks = 0;
    uint64_t folds = 0;
  };
  HostPathUses hostPathUses() const { return {stagingAsks_.load(), fabric_.foldsPosted()}; }
  // Messages sent so far, over every rank.
  uint64_t sendsPosted() const { return fabric_.sendsPosted(); }
  // Peer mappings made so far, over every rank (Fabric::peerMapsMade).
  uint64_t peerMapsMade() const { return fabric_.peerMapsMade(); }
  // Runs `job` on every rank as one op; returns what the ranks reported, "rank r: ..." per
  // line (an exception counts as a report), "" when every rank was content.
  std::string run(const Job& job);

 private:
  void rankMain(int rank, std::unique_ptr<StagingArea> staging);

  WorldOptions options_;
  Fabric fabric_;
  std::atomic<uint64_t> stagingAsks_{0};
  std::mutex mu_;
  std::condition_variable changed_;
  const Job* job_ = nullptr;   // guarded by mu_
  uint64_t jobNumber_ = 0;     // guarded by mu_: the op number of job_
  int finished_ = 0;           // guarded by mu_: ranks done with jobNumber_
  bool stopping_ = false;      // guarded by mu_
  std::vector<std::string> reports_;  // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace ucxb::inproc
