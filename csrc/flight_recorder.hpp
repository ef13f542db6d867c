// The Flight Recorder of ucx and udp groups: the last N ops of every group of this process,
// each marked scheduled, started and completed (or retired without completing: failed, timed
// out, aborted) as its Work progresses, dumped in the layout of torch's Flight Recorder
// (torch/csrc/distributed/c10d/FlightRecorder.hpp) by ucxbackend.flight_recorder.
//
// Not torch's own recorder: ProcessGroupGloo and ProcessGroupNCCL record into
// c10d::FlightRecorder<c10::Event>::get(), but in torch 2.13 that function and its instance
// are local symbols of libtorch_cpu.so (absent from .dynsym), so an extension cannot reach
// them; and the template's definitions (FlightRecorderDetail.hpp) include nlohmann/json.hpp,
// which torch does not ship. Enabled, as torch's, by TORCH_FR_BUFFER_SIZE (or
// TORCH_NCCL_TRACE_BUFFER_SIZE) > 0, read once per process; unlike torch's (2000 entries
// unless set), off unless set, so that an op pays nothing for it by default.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ucxb {

// One group as its entries see it: the numbers torch's dump calls pg_status.
struct FlightGroup {
  uint64_t id = 0;  // this process's count of groups, in creation order (torch's pg_id)
  std::vector<int64_t> ranks;
  std::atomic<uint64_t> ops{0};  // op_id: every op of the group, from 1
  // Collective sequence numbers (from 1); -1: none yet.
  std::atomic<int64_t> lastEnqueued{-1};
  std::atomic<int64_t> lastStarted{-1};
  std::atomic<int64_t> lastCompleted{-1};
};

// What an op is, recorded when it is issued (on the caller's thread).
struct FlightOp {
  std::string pgName;  // the group's name and description, as torch set them
  std::string pgDesc;
  uint64_t collectiveSeq = 0;  // from 1; 0 for a point-to-point op
  uint64_t p2pSeq = 0;         // from 1; 0 for a collective
  std::string profilingName;   // "ucx:allreduce"
  c10::ArrayRef<at::Tensor> inputs;  // views, read while the op is recorded
  c10::ArrayRef<at::Tensor> outputs;
  std::chrono::milliseconds timeout{0};
};

// An entry as dumped: plain values, copied under no lock the Work takes.
struct FlightRecord {
  uint64_t recordId = 0;
  uint64_t pgId = 0;
  std::string pgName, pgDesc;
  std::vector<int64_t> pgRanks;
  int64_t lastEnqueued = -1, lastStarted = -1, lastCompleted = -1;
  std::string threadName, threadId;
  uint64_t collectiveSeq = 0, p2pSeq = 0, opId = 0;
  std::string profilingName;
  int64_t createdNs = 0, startedNs = 0, completedNs = 0;  // 0: not (yet)
  bool retired = false;
  int64_t timeoutMs = 0;
  bool p2p = false;
  std::vector<std::vector<int64_t>> inputSizes, outputSizes;
  std::vector<std::string> inputDtypes, outputDtypes;
};

// One op's entry; the Work marks it, from any thread.
class FlightEntry {
 public:
  FlightEntry(uint64_t recordId, std::shared_ptr<FlightGroup> group, FlightOp op);
  // The progress thread began the op (later calls change nothing).
  void started();
  // The op ended well: completed and retired.
  void completed();
  // The op ended in error: retired, not completed (torch's "a retired but not completed
  // event has timed out").
  void retired();
  FlightRecord snapshot() const;

 private:
  FlightRecord fixed_;  // the values known at issue
  std::shared_ptr<FlightGroup> group_;
  std::atomic<int64_t> startedNs_{0};
  std::atomic<int64_t> completedNs_{0};
  std::atomic<bool> retired_{false};
};

class FlightRecorder {
 public:
  static FlightRecorder& instance();
  bool enabled() const { return capacity_ > 0; }
  size_t capacity() const { return capacity_; }
  // A group's record, numbered in creation order; null when the recorder is off.
  std::shared_ptr<FlightGroup> addGroup(std::vector<int64_t> ranks);
  // Records an op of `group` (null: off, nothing recorded); the oldest entry goes when full.
  std::shared_ptr<FlightEntry> record(const std::shared_ptr<FlightGroup>& group, FlightOp op);
  // The entries, oldest first.
  std::vector<FlightRecord> dump() const;

 private:
  explicit FlightRecorder(size_t capacity) : capacity_(capacity) {}
  const size_t capacity_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<FlightEntry>> ring_;
  size_t next_ = 0;  // the slot the next entry takes once the ring is full
  uint64_t nextRecord_ = 0;
  std::atomic<uint64_t> nextGroup_{0};
};

}  // namespace ucxb
