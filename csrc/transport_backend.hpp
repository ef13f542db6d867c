// TransportBackend: the c10d::Backend registered as "ucx" and as "udp", one class over either
// transport. It validates and stages tensors on the
// caller's thread, queues each op to the group's ProgressEngine, and runs the op there through
// the algorithms in csrc/collectives (see progress_engine.h for the execution model).
#pragma once

#include <c10/util/FunctionRef.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "csrc/backend_options.h"
#include "csrc/collectives/algorithms.h"
#include "csrc/collectives/comm.h"
#include "csrc/device_holds.hpp"
#include "csrc/device_op.hpp"
#include "csrc/engine/progress_engine.h"
#include "csrc/flight_recorder.hpp"
#include "csrc/startup_profile.hpp"
#include "csrc/tensor_checks.hpp"
#include "csrc/transport_work.hpp"
#include "transports/fault_injection.h"

namespace ucxb {

// What a CUDA op's run needs on the device, known at issue: its scratch (algo::scratchBytes,
// allocated then on the caller's thread) and whether the run may still call into torch's
// allocators on the progress thread (a staging copy, a packed buffer, a clone): such an op is
// never held at the gate (device_holds.hpp). The default is the safe one.
struct DeviceNeeds {
  size_t scratchBytes = 0;
  bool allocates = true;
};

class TransportBackend : public c10d::Backend {
 public:
  // options: every knob by name, as text (backend_options.h); a bad one is a ValueError.
  TransportBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout, std::string groupId,
                  std::vector<int64_t> globalRanks, const std::map<std::string, std::string>& options);
  ~TransportBackend() override;

  // "ucx" or "udp": the transport this group runs on.
  const std::string getBackendName() const override { return backendName_; }
  // false: torch 2.13's batch_isend_irecv then posts each op on its own. With true it wraps
  // them in _coalescing_manager, which leaves the group in coalescing mode when one op raises
  // (bad input), and torch then silently queues every later collective on the group forever.
  // Our ops are non-blocking anyway, so nothing is lost. startCoalescing/endCoalescing still
  // serve callers that open a coalescing block themselves.
  bool supportsCoalescing() const override { return false; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_.store(timeout); }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void shutdown() override;
  // Fails the group ("aborted", unless it failed before) and every unsettled Work of it, at
  // once and on this thread, and stops the progress thread without waiting for it. Any
  // thread, any number of times (docs/failure-model.md#abort-and-geterror).
  void abort() override;
  // SUCCESS while the group is healthy; else the kind of its first failure: TIMEOUT (an op
  // timed out), REMOTE_ERROR (a peer failed) or COMM_ERROR (anything else, abort included).
  c10d::ErrorType getError() override;
  // TORCH_DISTRIBUTED_DEBUG=DETAIL wraps the group in torch's ProcessGroupWrapper, which puts
  // this number into every collective's fingerprint and checks that all ranks agree on it
  // (and on the op, shapes and dtypes) before the op runs. Every rank numbers its collectives
  // from 0 at creation, in issue order, so there is nothing to agree on first (as with Gloo).
  void setSequenceNumberForGroup() override {}
  // Split and shrink (docs/failure-model.md#split-and-shrink): a child group over some of this
  // group's ranks, with the same options and transport; its addresses go through a Store under a
  // key derived from this group's id, the child's ranks and a count of the children made from this
  // group over those ranks, which every member agrees on. The child has its own progress thread and
  // worker.
  bool supportsSplitting() const override { return true; }
  bool supportsShrinking() const override { return true; }
  // Called on every rank of this group (torch's ProcessGroup::splitGroup), with the same
  // sorted group ranks on the members of one child; a rank not in `ranks` gets null.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  // Called on the survivors only: the child is made of this group's ranks less
  // `ranksToExclude`, through this group's Store, without a word to the excluded ranks or to
  // this group (which may have failed). flags & 1 (SHRINK_ABORT) aborts this group first.
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude,
                                           int flags,
                                           const c10::intrusive_ptr<Options>& opts) override;
  // The group's backend name and timeout (torch reads them to split with the same options).
  c10::intrusive_ptr<Options> getBackendOptions() override {
    return c10::make_intrusive<Options>(backendName_, timeout_.load());
  }
  uint64_t getSequenceNumberForGroup() override { return collectiveSeq_.load(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;

  const std::vector<int64_t>& globalRanks() const { return globalRanks_; }
  // The transport's traffic counters (empty for ucx); any thread.
  TrafficSnapshot traffic() const;
  // The transport's trace samples since the last call (udp trace_samples); any thread.
  std::vector<OpTraceSeries> drainTraceSeries();
  // Whether large ring ops stage through shared memory (every rank on this host; see
  // engine/staging_area.h).
  bool sharedMemory() const { return sharedMemory_; }
  // Where this rank's creation of the group spent its time (filled by the constructor).
  const StartupProfile& startupProfile() const { return profile_; }
  const EngineConfig& engineConfig() const { return engineConfig_; }
  // Ops of this group that ran on the caller's thread, and those handed over to the progress
  // thread after an inline start. Any thread.
  uint64_t inlineOps() const { return engine_ ? engine_->inlineOps() : 0; }
  uint64_t handedOver() const { return engine_ ? engine_->handedOver() : 0; }
  // Times such a caller moved off a core it shared with a peer rank. Any thread.
  uint64_t coreMoves() const { return engine_ ? engine_->coreMoves() : 0; }
  // Whether a small all_reduce of `bytes` may try the inline path (inline_bytes).
  bool inlineWanted(size_t bytes) const { return bytes <= options_.inlineBytes; }
  // Test-only (UCXBACKEND_TEST_FAULT_INJECTION=1 at creation, else ValueError): the group's
  // transport throws from its next progress() ("progress") or arm() ("arm"), and the
  // progress thread is woken to make that call. Any thread.
  void injectTransportFault(const std::string& where);
  // Test-only, as injectTransportFault: the receives the wrapped transport folded so far.
  uint64_t injectedTransportFolds() const;

 private:
  // The body of a collective, run on the progress thread with a Comm scoped to the op.
  using Body = std::function<void(Comm&)>;
  // A small op split where it waits, for the inline path (engine/progress_engine.h): the
  // posted op (algo::PostedOp), and what completes the Work's tensors once it has (on
  // whichever thread drives the transport by then).
  struct Posted {
    std::unique_ptr<algo::PostedOp> op;
    std::function<void()> after;  // empty: nothing to do once the op is complete
    // The caller blocks on the op's Work right after issuing it (the op's options say
    // asyncOp=false): the op is driven to its end on the caller's thread, never handed over
    // (ProgressEngine::Lease::wait's toTheEnd). An async caller is held at most spin_us.
    bool callerWaits = false;
  };
  // Called on the issuing thread, within enqueue (runInline), so it need not own what it
  // reads: a closure that owns the op's tensor cost a small op an allocation and refcounts.
  using PostBody = c10::function_ref<Posted(Comm&)>;
  // The body of a queued op, or what makes it once the op is queued: an op that usually runs
  // inline (an idle group's small all_reduce) then builds no closure, nor copies its tensors
  // into one, that it never runs.
  class QueuedBody {
   public:
    template <class F, std::enable_if_t<std::is_constructible_v<Body, F&&>, int> = 0>
    QueuedBody(F&& body) : body_(std::forward<F>(body)) {}  // NOLINT: implicit, as a Body
    // `make` is called at most once, within enqueue.
    static QueuedBody deferred(c10::function_ref<Body()> make) {
      QueuedBody q;
      q.make_ = make;
      return q;
    }
    Body take() { return make_ ? make_() : std::move(body_); }

   private:
    QueuedBody() = default;
    Body body_;
    c10::function_ref<Body()> make_;
  };

  // A reducing op's needs: `op`'s scratch over `count` elements of `esz` bytes, allocating
  // where `allocates` or where the transport stages device memory through host buffers.
  // The gate a CUDA op of a cuda_wait=stream group carries, so that its failure releases
  // every stream held at it (device_op.hpp); null for CPU ops and in cuda_wait=host groups.
  std::shared_ptr<StreamGate> heldGate(const std::optional<c10::Device>& device);
  DeviceNeeds reducingNeeds(algo::Op op, size_t count, size_t esz, bool allocates) const;
  // An op that reduces nothing: allocating as above.
  DeviceNeeds movingNeeds(bool allocates) const { return {0, allocates || !transportCarriesDevice_}; }

  // If the group has failed (ProgressEngine::fail), fails `work` with GroupFailed naming the
  // first failure and returns true: on the caller's thread when the op is issued, and on the
  // progress thread when it comes to run. Any thread.
  static bool refuseIfFailed(ProgressEngine& engine, TransportWork& work);
  bool refuseIfFailed(TransportWork& work) const { return refuseIfFailed(*engine_, work); }
  Checker checker(const char* op) const {
    return Checker{op, getRank(), getSize(), backendName_, options_.cuda != 0};
  }
  std::chrono::milliseconds timeoutFor(std::chrono::milliseconds requested) const;
  // issueOnDevice for `work`'s op; on failure finishes `work` with the error and returns false.
  bool issueOrFail(const std::optional<c10::Device>& device, TransportWork& work,
                   std::optional<DeviceOp>& deviceOp);
  // `device`: the CUDA device of the op's tensors (Checker::device()); none for a CPU op.
  // Also records the op in the Flight Recorder (flight_recorder.hpp) when it is on.
  // `allocates`: as DeviceNeeds' (a CUDA op in a group with cuda_wait=stream).
  c10::intrusive_ptr<TransportWork> makeWork(const char* op, c10d::OpType type,
                                             std::optional<c10::Device> device,
                                             std::vector<at::Tensor> outputs, OpInputs inputs,
                                             std::chrono::milliseconds timeout,
                                             bool allocates = true);
  // `inlineBody`, when set, is the same op split for the inline path: tried first (runInline)
  // unless the op is a CUDA one; `body` runs on the progress thread otherwise. `alsoIssue`,
  // when set, runs under issueMu_ right after the op's Work is made: an op that makes a
  // second Work (allgather_coalesced) numbers it there, so no other op's number falls between.
  // `needs`: a CUDA op's (ignored for a CPU op).
  c10::intrusive_ptr<c10d::Work> enqueue(const char* op, c10d::OpType type,
                                         std::optional<c10::Device> device,
                                         std::vector<at::Tensor> outputs, OpInputs inputs,
                                         std::chrono::milliseconds timeout, QueuedBody body,
                                         PostBody inlineBody = nullptr,
                                         const std::function<void()>& alsoIssue = nullptr,
                                         DeviceNeeds needs = {});
  // The task that runs `body` for `work` on the progress thread, queued. `tagGroup`: the
  // group field of the op's tags (tag::markedGroup).
  // A CUDA op in a group with cuda_wait=stream (holds_) goes as one object that holds_ keeps
  // too, so that what it holds is let go on a caller's thread (device_holds.hpp); `mark`: its
  // DeviceHolds mark, when it allocates.
  void queueTask(const c10::intrusive_ptr<TransportWork>& work, const char* op,
                 uint32_t tagGroup, std::optional<DeviceOp> deviceOp,
                 std::chrono::milliseconds timeout, Body body,
                 std::unique_ptr<DeviceHolds::Mark> mark = nullptr);
  // The queued op's run on the progress thread (queueTask's task).
  static void runQueued(ProgressEngine& engine, std::atomic<const TransportWork*>& running,
                        uint32_t group, const c10::intrusive_ptr<TransportWork>& work,
                        const Body& body, std::chrono::milliseconds timeout,
                        const algo::Tuning& tuning, uint64_t seqMask,
                        const std::optional<DeviceOp>& deviceOp, bool carries);
  // Runs `work`'s op on this thread, which holds the transport through `lease`: posts it,
  // drives it for up to spin_us, then finishes it here or hands the waiting to the progress
  // thread.
  void runInline(const c10::intrusive_ptr<TransportWork>& work, const char* op,
                 uint32_t tagGroup, std::chrono::milliseconds timeout, PostBody post,
                 std::unique_ptr<ProgressEngine::Lease> lease);
  // Point-to-point: the body posts one request; the Work completes with it, not with the task.
  c10::intrusive_ptr<c10d::Work> enqueueP2P(const char* op, c10d::OpType type,
                                            std::optional<c10::Device> device,
                                            at::Tensor tensor, int peer, uint64_t tag,
                                            uint64_t mask);
  c10::intrusive_ptr<c10d::Work> allreduceFlat(const char* op, c10d::OpType type,
                                               const std::vector<at::Tensor>& tensors,
                                               const c10d::ReduceOp& reduceOp,
                                               std::chrono::milliseconds timeout,
                                               bool callerWaits);
  // `alsoIssue`: as enqueue's.
  c10::intrusive_ptr<c10d::Work> allgatherFlat(const char* op,
                                               std::vector<at::Tensor> outputs,
                                               std::vector<at::Tensor> inputs,
                                               std::chrono::milliseconds timeout,
                                               const std::function<void()>& alsoIssue = nullptr);
  c10::intrusive_ptr<c10d::Work> reduceScatterFlat(const char* op,
                                                   std::vector<at::Tensor> outputs,
                                                   std::vector<std::vector<at::Tensor>> inputs,
                                                   const c10d::ReduceOp& reduceOp,
                                                   std::chrono::milliseconds timeout);

  // A child over `ranks` (this group's ranks, sorted) through `store`; null when this rank is
  // not among them. Its id: "<this id>:<kind>:<ranks>:<count>".
  c10::intrusive_ptr<c10d::Backend> makeChild(const c10::intrusive_ptr<c10d::Store>& store,
                                              const std::vector<int>& ranks, const char* kind,
                                              const c10::intrusive_ptr<Options>& opts);

  c10::intrusive_ptr<c10d::Store> store_;
  // The last rank's deletion of its creation's Store keys, where nobody waits for it
  // (AddressExchange::takeDeferredCleanup); joined by shutdown().
  std::thread storeCleanup_;
  std::mutex storeCleanupMu_;  // one join of storeCleanup_ at a time
  // The options as given at creation, handed to split and shrink children unchanged.
  const std::map<std::string, std::string> rawOptions_;
  const BackendOptions options_;
  const std::string backendName_;
  std::atomic<std::chrono::milliseconds> timeout_;
  const std::string groupId_;
  const uint32_t groupHash_;
  const std::vector<int64_t> globalRanks_;
  // This group in the Flight Recorder; null when it is off (TORCH_FR_BUFFER_SIZE unset).
  const std::shared_ptr<FlightGroup> flight_ = FlightRecorder::instance().addGroup(globalRanks_);
  EngineConfig engineConfig_;
  algo::Tuning tuning_;        // ops on host memory
  algo::Tuning deviceTuning_;  // ops on device memory (device_chunk_bytes)
  std::shared_ptr<ProgressEngine> engine_;
  // Whether the transport moves device memory itself (ucx) or CUDA ops stage through pinned
  // host memory (udp), and the group's internal stream per device (device_op.hpp).
  bool transportCarriesDevice_ = false;
  GroupDevices devices_;
  // cuda_wait=stream only (else null): what keeps a held stream from hanging.
  const std::shared_ptr<DeviceHolds> holds_;
  // Collectives and point-to-point ops are numbered separately: every rank issues the same
  // collectives, but not the same sends and receives, and the collective number is in the tag.
  std::atomic<uint64_t> collectiveSeq_{0};
  std::atomic<uint64_t> p2pSeq_{0};
  // The Work whose task the progress thread is running (for timeout messages).
  std::shared_ptr<std::atomic<const TransportWork*>> running_;
  // What a Work's timed-out wait() reports (TransportWork::setProbe): made once the engine is.
  std::shared_ptr<const TransportWork::Probe> probe_;
  // Test-only hooks, read from the environment at creation (docs/testing.md): the bits of
  // the collective sequence number that go into tags (UCXBACKEND_TEST_SEQ_BITS narrows the
  // field, so that it wraps within a test), and the switch of the fault-injecting transport
  // (null unless UCXBACKEND_TEST_FAULT_INJECTION=1).
  const uint64_t tagSeqMask_;
  std::shared_ptr<FaultSwitch> faults_;
  // Held from an op's sequence number to its place in the queue (enqueue).
  std::mutex issueMu_;
  // Ops may also be issued from Future callbacks on the progress thread.
  std::mutex coalesceMu_;
  bool coalescing_ = false;
  bool sharedMemory_ = false;
  StartupProfile profile_;
  std::vector<c10::intrusive_ptr<TransportWork>> coalesced_;
  // Every Work made and maybe not settled yet, for abort() and for a peer's failure notice
  // (the engine's onTold, which the progress thread may run after this backend is gone: hence
  // shared); settled and dropped ones are pruned when the list has doubled since the last
  // pruning.
  struct WorkList {
    std::mutex mu;
    std::vector<c10::weak_intrusive_ptr<TransportWork>> works;
    size_t pruneAt = 64;
    void add(const c10::intrusive_ptr<TransportWork>& work);
    // Every listed Work still alive, taken off the list.
    std::vector<c10::intrusive_ptr<TransportWork>> takeAll();
  };
  const std::shared_ptr<WorkList> works_ = std::make_shared<WorkList>();
  // The children made from this group, counted by "<this id>:<kind>:<ranks>:". torch 2.13
  // calls split once per device type the group is registered for (cpu and cuda) with the same
  // Store: the last call's Store, ranks and child answer a repeat without a second child (the
  // Store is held, so that its address is not reused by a later split's).
  std::mutex splitMu_;
  std::map<std::string, uint64_t> childCounts_;
  c10::intrusive_ptr<c10d::Store> lastSplitStore_;
  std::vector<int> lastSplitRanks_;
  c10::intrusive_ptr<c10d::Backend> lastSplitChild_;
};


}  // namespace ucxb
