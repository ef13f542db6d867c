#include "csrc/transport_work.hpp"

#include <ATen/EmptyTensor.h>
#include <ATen/core/ivalue.h>

#include <algorithm>

#include "csrc/collectives/op_driver.h"
#include "csrc/device_op.hpp"
#include "csrc/engine/core_yield.h"
#include "csrc/storage_pins.hpp"
#include "csrc/tensor_checks.hpp"

namespace ucxb {

namespace {

// Every Future holds a list of tensors: one type for all of them, not one allocated per op.
const c10::TypePtr& tensorListType() {
  static const c10::TypePtr type = c10::ListType::create(c10::TensorType::get());
  return type;
}

// How long past an op's own deadline a wait() as long as the op's timeout waits for the
// thread running the op to fail it (the thread wakes at the deadline, records the group's
// failure, then fails the Work: milliseconds). Past this the wait gives up by itself.
constexpr std::chrono::milliseconds kOwnDeadlineGrace{1000};

}  // namespace

TransportWork::TransportWork(OpContext ctx, c10d::OpType type, std::vector<at::Tensor> outputs,
                             std::chrono::milliseconds timeout, std::vector<c10::Device> devices)
    : c10d::Work(ctx.rank, type),
      ctx_(std::move(ctx)),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      future_(c10::make_intrusive<c10::ivalue::Future>(tensorListType(), std::move(devices))) {}

void TransportWork::setDeviceGate(c10::Device device, std::shared_ptr<StreamGate> gate) {
  device_ = device;
  gate_ = std::move(gate);
}

void TransportWork::setHolds(std::shared_ptr<DeviceHolds> holds, uint64_t ticket,
                             bool allocates) {
  holds_ = std::move(holds);
  ticket_ = ticket;
  allocates_ = allocates;
}

c10::intrusive_ptr<c10::ivalue::Future> TransportWork::getFuture() {
  if (holds_) {
    std::lock_guard<std::mutex> lock(holdMu_);
    if (!holdsSettled_ && !futureMarked_) {
      holds_->add(ticket_);
      futureMarked_ = true;
    }
  }
  return future_;
}

void TransportWork::settleHolds() {
  if (!holds_) return;
  std::lock_guard<std::mutex> lock(holdMu_);
  holdsSettled_ = true;
  if (futureMarked_) holds_->remove(ticket_);
  futureMarked_ = false;
}

namespace {

// Holds `stream` at the gate until op `seq` has ended; false where the host must wait
// instead. Never the legacy default stream (PyTorch's default): every blocking stream and
// every implicitly synchronising CUDA call (a cudaFree, a pinned allocation) waits for it,
// and the progress thread that opens the gate may itself be making such a call. Never a
// group's internal stream either (a user's pool stream may be one): the op queues its own
// copies and reductions there, behind the hold, and would wait for itself until its timeout.
bool holdAtGate(const StreamGate& gate, c10::Device device, uint64_t seq) {
  const c10::Stream stream = currentStream(device);
  if (stream.native_handle() == nullptr || isInternalStream(stream)) return false;
  return gate.holdUntil(stream, seq);
}

}  // namespace

bool TransportWork::holdCallerStream() const {
  // An op still running: hold the caller's stream, not the caller. One already ended needs
  // nothing on the device (its stream was drained).
  if (!gate_ || done_.load(std::memory_order_acquire)) return false;
  if (holds_) {
    // Not where the progress thread may call into torch's allocators before this op ends:
    // in this op's run, or in that of an op queued before it (device_holds.hpp).
    holds_->prune();
    if (allocates_ || !holds_->clearBefore(ticket_)) return false;
  }
  return holdAtGate(*gate_, *device_, ctx_.seq);
}

void TransportWork::synchronize() {
  if (!device_) return;  // a CPU op's outputs are final once wait() returns
  if (holdCallerStream()) return;
  try {
    wait();
  } catch (...) {
  }
}

bool TransportWork::wait(std::chrono::milliseconds timeout) {
  // Refused before anything else: a wait that gives up withdraws a point-to-point request,
  // and a negative timeout would do that at once, never having waited.
  if (timeout.count() < 0) throwNegativeWait(ctx_, timeout.count());
  if (holdCallerStream()) return true;  // else it reports the op's outcome below
  const auto limit = timeout == ::kNoTimeout ? timeout_ : timeout;
  if (spin_.count() > 0 && !done_.load(std::memory_order_acquire)) {
    const auto until = std::chrono::steady_clock::now() + std::min<std::chrono::microseconds>(
                                                                spin_, limit);
    // A yield, not a bare spin: with more threads than cores, the progress thread that
    // finishes this op may need this core. Not while yields lose the core to a thread that
    // keeps it (core_yield.h): the condition variable below wakes this thread at once.
    while (!done_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until &&
           !crowded()) {
      yieldCore();
    }
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto done = [this] { return completed_; };
    bool ended = cv_.wait_for(lock, limit, done);
    const auto own = ownDeadline_.load(std::memory_order_acquire);
    if (!ended && own != 0 && limit >= timeout_) {
      // This wait began before the op started (it was queued, or its thread woke late), so
      // it ends before the op's own deadline. The op's outcome is that thread's to report:
      // at the deadline it fails the group, then the Work. Raising here instead left the
      // group healthy (getError() SUCCESS) for a moment after this wait had timed out.
      const std::chrono::steady_clock::time_point deadline{
          std::chrono::steady_clock::duration(own)};
      ended = cv_.wait_until(lock, deadline + kOwnDeadlineGrace, done);
    }
    if (!ended) {
      lock.unlock();
      if (onWaitTimeout_) {
        onWaitTimeout_();
        // The withdrawal found the request done: it completed between this wait's deadline
        // and its withdrawal (a receive whose message was already in). The op succeeded and
        // its tensor holds the message: raising now would have the caller's retried recv
        // take the sender's next message in its place.
        lock.lock();
        if (completed_ && !exception_) return true;
        lock.unlock();
      }
      throwWaitTimeout(ctx_, limit.count(), probe_ ? (*probe_)(*this) : std::string());
    }
    if (exception_) {
      std::rethrow_exception(exception_);
    }
  }
  return true;
}

void TransportWork::pinStorages(c10::ArrayRef<at::Tensor> inputs) {
  inputs_.assign(inputs.begin(), inputs.end());
  for (const c10::ArrayRef<at::Tensor> tensors : {c10::ArrayRef<at::Tensor>(outputs_), inputs}) {
    for (const at::Tensor& t : tensors) {
      if (!t.defined() || !t.has_storage()) continue;
      const c10::Storage& storage = t.storage();
      c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
      if (impl == nullptr || taken(impl)) continue;
      // Host memory only. A device tensor's old block goes back to torch's caching allocator,
      // which keeps it from reuse until the internal stream the op runs on is past it (the
      // tensors are recorded there), as with NCCL; and FSDP frees and regrows its all-gather
      // storages with resize_() while a stream-ordered op may still be queued. Counted per
      // storage (storage_pins.hpp): another op, or this one (in place), may pin it too.
      if (t.is_cpu() && pinStorage(storage)) {
        pinned_.push_back(storage);
      } else {
        held_.push_back(storage);  // never resizable, or device memory
      }
    }
  }
}

bool TransportWork::taken(const c10::StorageImpl* impl) const {
  // An in-place op names its storage as output and input: pinned once, not twice (each pin
  // and unpin takes the process-wide lock of storage_pins.cpp).
  const auto same = [impl](const c10::Storage& s) { return s.unsafeGetStorageImpl() == impl; };
  return std::any_of(pinned_.begin(), pinned_.end(), same) ||
         std::any_of(held_.begin(), held_.end(), same);
}

void TransportWork::unpinStorages() {
  for (const c10::Storage& storage : pinned_) unpinStorage(storage);
  pinned_.clear();
  held_.clear();
  inputs_.clear();
}

void TransportWork::checkTensorsFit() const {
  for (const c10::ArrayRef<at::Tensor> tensors :
       {c10::ArrayRef<at::Tensor>(outputs_), c10::ArrayRef<at::Tensor>(inputs_)}) {
    for (const at::Tensor& t : tensors) {
      if (!t.defined() || !t.has_storage() || t.numel() == 0) continue;
      const size_t need = at::detail::computeStorageNbytes(
          t.sizes(), t.strides(), t.itemsize(), static_cast<size_t>(t.storage_offset()));
      const size_t have = t.storage().nbytes();
      if (need > have) {
        throw OpFailed("its tensor " + describe(t) + " needs " + std::to_string(need) +
                       " bytes but its memory holds " + std::to_string(have) +
                       ": it was resized while the op was pending (resize_() raised, but set "
                       "the new sizes); leave an async op's tensors alone until wait() returns");
      }
    }
  }
}

void TransportWork::release_resources() {
  outputs_.clear();
  future_.reset();
  gate_.reset();
  flight_.reset();
  probe_.reset();
  onWaitTimeout_ = nullptr;
}

// Future callbacks run inside markCompleted/setError, on the progress thread, often within a
// UCX callback: an exception thrown by one must not unwind through UCX or end the thread. The
// op's own outcome is already recorded by then.
void TransportWork::finishOk() {
  if (settled_.exchange(true)) return;
  unpinStorages();
  // The outputs are final on the device (the op's stream was drained): a held stream goes on
  // now, before the Future's callbacks run, which may call into the allocator and so must not
  // run while a stream waits for this op (device_holds.hpp).
  if (gate_) gate_->release(ctx_.seq);
  if (flight_) flight_->completed();  // before any waiter wakes and may dump
  try {
    future_->markCompleted(c10::IValue(outputs_));
  } catch (...) {
  }
  finish();
  done_.store(true, std::memory_order_release);
  settleHolds();
}

void TransportWork::finishError(std::exception_ptr error) { settleFailed(error, true); }

void TransportWork::finishAborted(std::exception_ptr error) { settleFailed(error, false); }

void TransportWork::finishUnissued(std::exception_ptr error) {
  settleFailed(error, true, /*releaseGate=*/false);
}

void TransportWork::settleFailed(std::exception_ptr error, bool unpin, bool releaseGate) {
  if (settled_.exchange(true)) return;
  if (unpin) unpinStorages();
  if (gate_ && releaseGate) gate_->release(ctx_.seq);  // before the callbacks, as in finishOk
  if (flight_) flight_->retired();
  try {
    future_->setError(error);
  } catch (...) {
  }
  finish(error);
  done_.store(true, std::memory_order_release);
  settleHolds();
}

}  // namespace ucxb
