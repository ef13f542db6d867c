#include "csrc/device_op.hpp"

#include "csrc/device_presence.hpp"

#include <ATen/ops/empty.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "csrc/engine/core_yield.h"

namespace ucxb {

namespace {

// Every stream a group has taken as its internal one; kept after the group is gone (a pool
// stream outlives it, and a later group may take it again). A few per device at most: the pool
// has a fixed number of streams.
std::mutex internalMu;
std::vector<c10::Stream>& internalStreams() {
  static auto* streams = new std::vector<c10::Stream>();
  return *streams;
}

void noteInternal(const c10::Stream& stream) {
  std::lock_guard<std::mutex> lock(internalMu);
  auto& streams = internalStreams();
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
    streams.push_back(stream);
  }
}

}  // namespace

bool cudaDeviceVisible() {
  // The guard is registered only where libtorch_cuda is loaded; its deviceCount() answers 0,
  // not an exception, where the driver is missing or sees no device.
  if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return false;
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() > 0;
}

bool isInternalStream(const c10::Stream& stream) {
  std::lock_guard<std::mutex> lock(internalMu);
  const auto& streams = internalStreams();
  return std::find(streams.begin(), streams.end(), stream) != streams.end();
}

GroupDevices::PerDevice& GroupDevices::of(c10::Device device) {
  auto it = devices_.find(device.index());
  if (it == devices_.end()) {
    const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
    const c10::Stream stream = impl->getStreamFromGlobalPool(device);
    noteInternal(stream);
    it = devices_.emplace(device.index(), PerDevice{stream, nullptr, nullptr}).first;
  }
  return it->second;
}

c10::Stream GroupDevices::stream(c10::Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  return of(device).stream;
}

std::shared_ptr<DeviceScratch> GroupDevices::scratch(c10::Device device, size_t bytes) {
  if (bytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  PerDevice& d = of(device);
  if (d.scratch && d.scratch->buffer.nbytes() >= bytes) return d.scratch;
  // On the internal stream, where the op uses it: the caching allocator may then hand the
  // block on once it is freed without waiting for another stream.
  c10::DeviceGuard onDevice(device);
  c10::StreamGuard onStream(d.stream);
  auto grown = std::make_shared<DeviceScratch>();
  grown->buffer = at::empty({static_cast<int64_t>(bytes)},
                            at::TensorOptions().dtype(at::kByte).device(device));
  d.scratch = grown;  // the old one goes with the last op issued with it
  return grown;
}

std::shared_ptr<StreamGate> GroupDevices::gate(c10::Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  PerDevice& d = of(device);
  if (!d.gateOpened) {  // its pinned word is never freed: only groups that use it pay
    d.gateOpened = true;
    try {
      d.gate = StreamGate::open(device);
    } catch (...) {
      // No pinned word (a CUDA error, no pinned memory): no gate, as where the driver offers
      // none; every wait() of the group waits on the host.
    }
  }
  return d.gate;
}

c10::Stream currentStream(c10::Device device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

std::optional<DeviceOp> issueOnDevice(const std::optional<c10::Device>& device,
                                      GroupDevices& devices, size_t scratchBytes,
                                      std::shared_ptr<StreamGate> gate) {
  if (!device) return std::nullopt;
  auto scratch = devices.scratch(*device, scratchBytes);
  auto ready = std::make_shared<c10::Event>(device->type());
  ready->record(currentStream(*device));
  return DeviceOp{*device, devices.stream(*device), std::move(ready), std::move(scratch),
                  std::move(gate)};
}

void waitForDevice(const c10::Event& event, Clock::time_point deadline, const char* what) {
  // Poll briefly (a reduction of a chunk takes tens of microseconds), then in short sleeps.
  // Counted (wait_stats(): device_wait_us, device_polls, device_sleeps): these yields and
  // sleeps are not the transport waits' `yields` and `sleeps`.
  const auto began = Clock::now();
  uint64_t polls = 0;
  uint64_t sleeps = 0;
  struct Count {
    const Clock::time_point& began;
    const uint64_t& polls;
    const uint64_t& sleeps;
    ~Count() { countWait(WaitFor::kDevice, Clock::now() - began, polls, sleeps); }
  } count{began, polls, sleeps};
  const auto spinUntil = began + std::chrono::microseconds(200);
  while (!event.query()) {
    ++polls;
    const auto now = Clock::now();
    if (now >= deadline) {
      throw OpTimeout(std::string("the device did not get through ") + what +
                      " before the op's timeout");
    }
    if (now < spinUntil) {
      std::this_thread::yield();
    } else {
      ++sleeps;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

void drainStream(const c10::Stream& stream, c10::Event& done, Clock::time_point deadline,
                 const char* what) {
  // An idle stream (the common case: every copy and reduction of DeviceMemory is waited for
  // as it is queued, so the op's next send or receive finds nothing left) has nothing to
  // wait for: one query instead of an event recorded and polled. A stream that has work
  // queued is waited for only up to now, through the event: c10's pool lends the stream to
  // others too (torch.cuda.Stream()), whose later work the op must not wait for.
  if (stream.query()) {
    countWait(WaitFor::kDevice, std::chrono::nanoseconds(0));
    return;
  }
  done.record(stream);
  waitForDevice(done, deadline, what);
}

void drainStream(const c10::Stream& stream, Clock::time_point deadline, const char* what) {
  c10::Event done(stream.device_type());
  drainStream(stream, done, deadline, what);
}

DeviceScope::DeviceScope(const std::optional<DeviceOp>& op, Clock::time_point deadline)
    : deadline_(deadline) {
  if (!op) return;
  device_.emplace(op->device);
  waitForDevice(*op->ready, deadline,
                "the work queued on the caller's stream before the op (its input's kernels)");
  stream_.emplace(op->stream);
  internal_ = op->stream;
}

void DeviceScope::drainFor(std::chrono::milliseconds limit) const {
  if (internal_) {
    drainStream(*internal_, Clock::now() + limit, "the failed op's work on the internal stream");
  }
}

void DeviceScope::drain() const {
  if (internal_) {
    drainStream(*internal_, deadline_, "the op's own work on the group's internal stream");
  }
}

}  // namespace ucxb
