// The Work returned by every op: completion, errors and a Future, with Gloo's semantics.
// The progress thread finishes it; callers wait on it (bounded by the op's timeout) or chain
// on its Future (DDP comm hooks), whose callbacks run on the progress thread, as with Gloo.
#pragma once

#include <c10/util/SmallVector.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "csrc/device_holds.hpp"
#include "csrc/errors.hpp"
#include "csrc/flight_recorder.hpp"
#include "csrc/stream_gate.hpp"

namespace ucxb {

class TransportWork : public c10d::Work {
 public:
  // `devices`: the CUDA device of a CUDA op's tensors. Its Future is then CUDA-aware:
  // completing it records an event on the thread's current stream of the device (the group's
  // internal stream), and callbacks and waiters are ordered after that event.
  TransportWork(OpContext ctx, c10d::OpType type, std::vector<at::Tensor> outputs,
                std::chrono::milliseconds timeout, std::vector<c10::Device> devices = {});
  // Tells a timed-out wait() what the op is stuck on, given the Work. One per group, shared
  // by its Works: a closure made for each op cost a small op an allocation.
  using Probe = std::function<std::string(const TransportWork&)>;
  void setProbe(std::shared_ptr<const Probe> probe) { probe_ = std::move(probe); }
  // Runs when a wait() gives up, before it raises (point-to-point ops withdraw their request,
  // and return once the group has recorded a failure that withdrawing makes).
  void setOnWaitTimeout(std::function<void()> fn) { onWaitTimeout_ = std::move(fn); }
  // How long wait() polls for completion, yielding the core, before it blocks: a small op
  // ends within microseconds, sooner than a blocked thread could be woken.
  void setSpin(std::chrono::microseconds spin) { spin_ = spin; }
  // The op's Flight Recorder entry (null: the recorder is off): marked started by
  // markStarted() on the thread that runs the op (the progress thread, or the caller's for an
  // inline op), completed or retired as the Work settles.
  void setFlightEntry(std::shared_ptr<FlightEntry> entry) { flight_ = std::move(entry); }
  void markStarted() {
    if (flight_) flight_->started();
  }
  // The op's own deadline, set where it starts on the thread that runs it (a collective: that
  // thread fails the op, and the group, once it passes). A wait() as long as the op's timeout
  // that ends before it waits on for the op's own outcome (wait()). Point-to-point ops have
  // none: only their caller's wait() times them out.
  void setOwnDeadline(std::chrono::steady_clock::time_point deadline) {
    ownDeadline_.store(deadline.time_since_epoch().count(), std::memory_order_release);
  }

  // A collective on CUDA tensors: the device its tensors are on and the group's gate there
  // (null: none). wait() then holds the caller's current stream instead of the host.
  void setDeviceGate(c10::Device device, std::shared_ptr<StreamGate> gate);
  // A CUDA op of a group with cuda_wait=stream (device_holds.hpp): its place `ticket` in the
  // progress thread's order, and whether its run may call into torch's allocators there
  // (`allocates`; then wait() never holds the stream). Without it wait() holds the caller's
  // stream wherever the gate allows (a Work made for an op that runs no task of its own).
  void setHolds(std::shared_ptr<DeviceHolds> holds, uint64_t ticket, bool allocates);
  uint64_t ticket() const { return ticket_; }

  // Blocks until the op has ended, or, for a CUDA collective with a gate, makes the caller's
  // current stream wait for that on the device and returns at once (NCCL's semantics: a
  // failure after that surfaces at the group's next op).
  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  // The caller's current stream waits for the op (as in wait()); never throws.
  void synchronize() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  // A CUDA op's Future taken while the op runs may get callbacks, which run on the progress
  // thread and call into the allocator (recordStream): the op counts as allocating from then
  // until it has settled (device_holds.hpp).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  int sourceRank() const override { return sourceRank_.load(); }
  uint64_t getSequencenumber() const override { return ctx_.seq; }

  // Holds the storages of the op's tensors (its outputs and `inputs`) until the Work settles,
  // and makes those in host memory that are resizable not so meanwhile. A tensor that the
  // caller grew with resize_() while the op ran had its memory freed under the transport,
  // which went on writing into it: a segmentation fault, or glibc aborting on a corrupted
  // heap. Now resize_() raises in the caller ("Trying to resize storage that is not
  // resizable"); set_() or .data = leave the op its old memory. A storage that other pending
  // ops pinned too becomes resizable once the last of them has settled (storage_pins.hpp);
  // one that is not resizable otherwise (numpy's) is only held.
  void pinStorages(c10::ArrayRef<at::Tensor> inputs);
  // Throws OpFailed when a tensor of the op no longer fits its storage: a resize_() that
  // pinStorages() made raise still set the new sizes (torch does so for any storage that is
  // not resizable), and an op that starts after it would read or write past the memory.
  // Called where a queued op starts, before it touches a tensor.
  void checkTensorsFit() const;

  const OpContext& context() const { return ctx_; }
  void setSourceRank(int r) { sourceRank_.store(r); }

  // The first call of either, on the thread that ran the op, settles the Work; later calls
  // are ignored (an op abandoned after a failure of its thread may have finished already).
  void finishOk();
  void finishError(std::exception_ptr error);
  // finishError from a thread that does not drive the transport (abort()): the thread that
  // does may still write into the op's tensors until it notices, so they stay pinned until
  // the Work is destroyed. Also for an op that gave up a request the transport could not
  // stop, which may write into them until it settles. Whatever of the op still runs, or is
  // still posted, holds the Work (its task, the requests' keepAlive and callbacks), so that
  // is after the transport let go.
  void finishAborted(std::exception_ptr error);
  // finishError for an op that failed as it was issued, never queued (a CUDA op whose ready
  // event or scratch could not be had), in a group that stays usable. Its number does not
  // advance the gate: the gate opens every op numbered up to the one released (stream_gate.hpp),
  // so releasing this one would let a stream held for an earlier op, still running, go on
  // before that op's outputs are final. No stream can wait for this op itself (it has ended
  // before its Work is handed back), and the ops after it release their own numbers.
  void finishUnissued(std::exception_ptr error);

  // Runs when the last strong reference goes while weak ones remain (the group's list of
  // Works for abort() holds each Work weakly until it is next pruned, up to twice its length
  // later): drops the output tensors and the Future holding them now, so that a group does
  // not keep the outputs of its last tens of ops alive (found by `ucxbackend soak`: RSS rose
  // by ~1 MiB a step and fell every ~60 steps).
  void release_resources() override;

  ~TransportWork() override { unpinStorages(); }

 private:
  // Gives back what pinStorages() took; on the thread that settles the Work, before any
  // waiter or Future callback can run (and may resize the tensors), or at destruction.
  void unpinStorages();
  // Whether pinStorages() has pinned or held `impl` already.
  bool taken(const c10::StorageImpl* impl) const;
  void settleFailed(std::exception_ptr error, bool unpin, bool releaseGate = true);
  // Once the Work has settled and its Future's callbacks have run: a mark getFuture() made is
  // dropped.
  void settleHolds();
  // cuda_wait=stream, op still running: the caller's current stream waits for it at the
  // group's gate. False where the host must wait instead.
  bool holdCallerStream() const;
  const OpContext ctx_;
  std::vector<at::Tensor> outputs_;
  const std::chrono::milliseconds timeout_;
  std::shared_ptr<const Probe> probe_;
  std::function<void()> onWaitTimeout_;
  std::atomic<int> sourceRank_{-1};
  // setOwnDeadline's time point (steady_clock ticks); 0 while the op has not started.
  std::atomic<std::chrono::steady_clock::rep> ownDeadline_{0};
  std::chrono::microseconds spin_{0};
  std::atomic<bool> settled_{false};  // finishOk or finishError has been called
  std::atomic<bool> done_{false};  // set right after finish(): what the spin polls
  std::optional<c10::Device> device_;
  std::shared_ptr<StreamGate> gate_;
  std::shared_ptr<DeviceHolds> holds_;  // setHolds: null for CPU ops and cuda_wait=host
  uint64_t ticket_ = 0;
  bool allocates_ = false;
  std::mutex holdMu_;           // guards the two below
  bool futureMarked_ = false;   // getFuture() marked ticket_
  bool holdsSettled_ = false;   // settleHolds() ran: no later mark
  std::shared_ptr<FlightEntry> flight_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  // Inline room for the usual one or two tensors: no allocation per op.
  c10::SmallVector<c10::Storage, 2> pinned_;  // made non-resizable by pinStorages()
  c10::SmallVector<c10::Storage, 2> held_;    // only held (not resizable before)
  c10::SmallVector<at::Tensor, 2> inputs_;    // for checkTensorsFit(), until the Work settles
};

}  // namespace ucxb
