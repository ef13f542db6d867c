#include "csrc/transport_work.hpp"

#include <ATen/core/ivalue.h>
#include <sched.h>

namespace ucxb {

TransportWork::TransportWork(OpContext ctx, c10d::OpType type, std::vector<at::Tensor> outputs,
                             std::chrono::milliseconds timeout, std::vector<c10::Device> devices)
    : c10d::Work(ctx.rank, type),
      ctx_(std::move(ctx)),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), std::move(devices))) {}

bool TransportWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == ::kNoTimeout ? timeout_ : timeout;
  if (spin_.count() > 0 && !done_.load(std::memory_order_acquire)) {
    const auto until = std::chrono::steady_clock::now() + std::min<std::chrono::microseconds>(
                                                                spin_, limit);
    // sched_yield, not a bare spin: with more threads than cores, the progress thread that
    // finishes this op may need this core.
    while (!done_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
      sched_yield();
    }
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, limit, [this] { return completed_; })) {
      lock.unlock();
      if (onWaitTimeout_) onWaitTimeout_();
      throwWaitTimeout(ctx_, limit.count(), waitingFor_ ? waitingFor_() : std::string());
    }
    if (exception_) {
      std::rethrow_exception(exception_);
    }
  }
  return true;
}

// Future callbacks run inside markCompleted/setError, on the progress thread, often within a
// UCX callback: an exception thrown by one must not unwind through UCX or end the thread. The
// op's own outcome is already recorded by then.
void TransportWork::finishOk() {
  if (settled_.exchange(true)) return;
  try {
    future_->markCompleted(c10::IValue(outputs_));
  } catch (...) {
  }
  finish();
  done_.store(true, std::memory_order_release);
}

void TransportWork::finishError(std::exception_ptr error) {
  if (settled_.exchange(true)) return;
  try {
    future_->setError(error);
  } catch (...) {
  }
  finish(error);
  done_.store(true, std::memory_order_release);
}

}  // namespace ucxb
