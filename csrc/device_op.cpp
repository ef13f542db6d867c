#include "csrc/device_op.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace ucxb {

GroupDevices::PerDevice& GroupDevices::of(c10::Device device) {
  auto it = devices_.find(device.index());
  if (it == devices_.end()) {
    const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
    it = devices_
             .emplace(device.index(),
                      PerDevice{impl->getStreamFromGlobalPool(device), StreamGate::open(device)})
             .first;
  }
  return it->second;
}

c10::Stream GroupDevices::stream(c10::Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  return of(device).stream;
}

std::shared_ptr<StreamGate> GroupDevices::gate(c10::Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  return of(device).gate;
}

std::optional<DeviceOp> issueOnDevice(const std::optional<c10::Device>& device,
                                      GroupDevices& devices) {
  if (!device) return std::nullopt;
  const auto* impl = c10::impl::getDeviceGuardImpl(device->type());
  auto ready = std::make_shared<c10::Event>(device->type());
  ready->record(impl->getStream(*device));
  return DeviceOp{*device, devices.stream(*device), std::move(ready)};
}

DeviceScope::DeviceScope(const std::optional<DeviceOp>& op) {
  if (!op) return;
  device_.emplace(op->device);
  op->ready->synchronize();
  stream_.emplace(op->stream);
  internal_ = op->stream;
}

void DeviceScope::drain() const {
  if (internal_) internal_->synchronize();
}

}  // namespace ucxb
