#include "csrc/device_op.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace ucxb {

c10::Stream InternalStreams::on(c10::Device device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(device.index());
  if (it == streams_.end()) {
    const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
    it = streams_.emplace(device.index(), impl->getStreamFromGlobalPool(device)).first;
  }
  return it->second;
}

std::optional<DeviceOp> issueOnDevice(const std::optional<c10::Device>& device,
                                      InternalStreams& streams) {
  if (!device) return std::nullopt;
  const auto* impl = c10::impl::getDeviceGuardImpl(device->type());
  auto ready = std::make_shared<c10::Event>(device->type());
  ready->record(impl->getStream(*device));
  return DeviceOp{*device, streams.on(*device), std::move(ready)};
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
