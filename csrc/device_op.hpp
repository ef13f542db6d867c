// How an op on CUDA tensors is ordered with the caller's streams (NCCL's semantics), with
// c10's device-generic API only (no CUDA headers, no libc10_cuda link):
//
// * Issue (caller's thread): an event is recorded on the caller's current stream of the
//   tensors' device. Whatever the caller queued before the op (the kernels that produce its
//   input) is ordered before it, with no host synchronisation on the caller's side.
// * Run (progress thread): the thread waits for that event before any byte leaves, then runs
//   the op with the group's internal stream of the device current: packing, scaling and
//   reductions are ATen ops on it (device_memory.hpp), and the transport moves the bytes.
//   The stream is drained before the op's Work completes, so a completed op's outputs are
//   final for every stream.
// * Wait (caller's thread): Work.wait() blocks the host until the op has ended, as Gloo's does
//   (cuda_wait=host, the default). With cuda_wait=stream, on a collective, it makes the
//   caller's current stream wait for the op's end on the device through the group's
//   StreamGate (stream_gate.hpp) and returns at once, except where the driver offers no gate
//   or the stream is the legacy default one or some group's internal stream
//   (transport_work.cpp, holdAtGate): there it blocks the host as with cuda_wait=host.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "csrc/collectives/op_driver.h"
#include "csrc/stream_gate.hpp"
#include "transports/transport.h"

namespace ucxb {

// The memory of an op whose tensors are on `device` (Checker::device(): the CUDA device, none
// for CPU tensors). What the backend asks takesHostPaths (transports/transport.h) about.
inline MemoryType memoryOf(const std::optional<c10::Device>& device) {
  return device ? MemoryType::kCuda : MemoryType::kHost;
}

// Device scratch (DeviceMemory::scratch), allocated on the caller's thread when an op is
// issued (issueOnDevice), never on the progress thread: there an allocation that makes torch's
// caching allocator free cached blocks synchronises the device, which a stream held by
// cuda_wait=stream (device_holds.hpp) would keep from ever returning. A group keeps its
// largest so far and lends it to every op that fits; an op that needs more gets a larger one,
// which becomes the group's, while the ops issued before it keep the old one (their DeviceOp
// holds it) until they are done. It may outlive the op: a request a failed op could not
// withdraw may still point into it (Comm::keep).
struct DeviceScratch {
  at::Tensor buffer;
};

// What a CUDA op carries from the caller's thread to the progress thread.
struct DeviceOp {
  c10::Device device;
  c10::Stream stream;                 // the group's internal stream on `device`
  std::shared_ptr<c10::Event> ready;  // recorded on the caller's current stream at issue
  // At least the op's algo::scratchBytes; null when it needs none.
  std::shared_ptr<DeviceScratch> scratch;
  // The group's gate (cuda_wait=stream; else null): an op that fails its group opens it for
  // good (StreamGate::releaseAll), so no stream stays held by the ops the failure refuses.
  std::shared_ptr<StreamGate> gate;
};

// What a group keeps per CUDA device: its internal stream, taken from the device's stream
// pool once, and its StreamGate (null where the driver offers none).
class GroupDevices {
 public:
  c10::Stream stream(c10::Device device);
  // Caller's thread: a scratch of at least `bytes` on `device` (null for 0), allocated on the
  // internal stream where the group's is smaller.
  std::shared_ptr<DeviceScratch> scratch(c10::Device device, size_t bytes);
  std::shared_ptr<StreamGate> gate(c10::Device device);

 private:
  struct PerDevice {
    c10::Stream stream;
    std::shared_ptr<DeviceScratch> scratch;
    // Opened at the first gate() (cuda_wait=stream only); null where it could not be.
    std::shared_ptr<StreamGate> gate;
    bool gateOpened = false;
  };
  PerDevice& of(c10::Device device);

  std::mutex mu_;
  std::map<c10::DeviceIndex, PerDevice> devices_;
};

// On the caller's thread: records the op's ready event and lends it `scratchBytes` of scratch
// (algo::scratchBytes). None for a CPU op. `gate`: the group's, where it has one.
std::optional<DeviceOp> issueOnDevice(const std::optional<c10::Device>& device,
                                      GroupDevices& devices, size_t scratchBytes = 0,
                                      std::shared_ptr<StreamGate> gate = nullptr);

// This thread's current stream of `device`.
c10::Stream currentStream(c10::Device device);

// Whether `stream` is the internal stream of some group (GroupDevices) in this process, now or
// before. c10's stream pool hands out the same few streams round-robin to groups and to users
// (torch.cuda.Stream()), so a caller's stream may be one: a Work must never hold it at its
// gate, since the op that would open the gate queues its own device work on it.
bool isInternalStream(const c10::Stream& stream);

// Waits until the device has passed `event`, polling, so that a device that never gets there
// (a stream held up by something that waits on this very thread) ends in OpTimeout at
// `deadline`, naming `what`, instead of hanging the progress thread.
void waitForDevice(const c10::Event& event, Clock::time_point deadline, const char* what);
// The same for everything queued on `stream` so far: at once where the stream is idle, else
// through `done`, recorded on the stream now (a caller that drains often reuses one event
// instead of creating and destroying one each time).
void drainStream(const c10::Stream& stream, c10::Event& done, Clock::time_point deadline,
                 const char* what);
// The same with an event of its own.
void drainStream(const c10::Stream& stream, Clock::time_point deadline, const char* what);

// On the progress thread, for the op's run: the device current, the ready event waited for
// (by `deadline`), and the internal stream current (ATen ops run on it). Does nothing for a
// CPU op.
class DeviceScope {
 public:
  DeviceScope(const std::optional<DeviceOp>& op, Clock::time_point deadline);
  // Waits (by the deadline) until everything queued on the internal stream has run.
  void drain() const;
  // The same, by now + `limit` (after a failure, when the op's deadline may have passed).
  void drainFor(std::chrono::milliseconds limit) const;

 private:
  std::optional<c10::DeviceGuard> device_;
  std::optional<c10::StreamGuard> stream_;
  std::optional<c10::Stream> internal_;
  Clock::time_point deadline_;
};

}  // namespace ucxb
