// Op memories that stand in for device memory in the algorithm tests: host memory labelled
// MemoryType::kCuda, copied and reduced as the host's. BouncingMemory is a device the
// transport cannot carry (a CUDA tensor on udp): Comm must stage every message through host
// buffers (the in-process transport refuses device memory), so every algorithm runs over the
// staging path that csrc/device_memory.hpp takes on a GPU. CarriedMemory is one the transport
// carries itself (a CUDA tensor on ucx; the world's Fabric then takes kCuda): what it checks
// is routing, that an op on it takes no host-only path (transport.h's takesHostPaths).
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "csrc/collectives/op_memory.h"

namespace ucxb::inproc {

class DeviceLabelledMemory : public OpMemory {
 public:
  explicit DeviceLabelledMemory(OpDriver& driver) : host_(driver) {}
  MemoryType type() const override { return MemoryType::kCuda; }
  void copy(void* dst, const void* src, size_t bytes) override { host_.copy(dst, src, bytes); }
  void reduce(const Reduction& red, void* acc, const void* in, size_t count) override {
    host_.reduce(red, acc, in, count);
  }
  uint8_t* scratch(size_t bytes) override { return host_.scratch(bytes); }

 private:
  HostMemory host_;
};

class BouncingMemory final : public DeviceLabelledMemory {
 public:
  using DeviceLabelledMemory::DeviceLabelledMemory;
  bool transportCarries() const override { return false; }
  uint8_t* hostBuffer(size_t bytes, std::shared_ptr<void>& owner) override {
    // Filled with a pattern: a receive that is not copied back leaves it in the result.
    auto buffer = std::make_shared<std::vector<uint8_t>>(bytes + 1, 0xA5);
    owner = buffer;
    return buffer->data();
  }
  void toHost(void* host, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, src, bytes);
  }
  void fromHost(void* dst, const void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host, bytes);
  }
};

class CarriedMemory final : public DeviceLabelledMemory {
 public:
  using DeviceLabelledMemory::DeviceLabelledMemory;
  bool transportCarries() const override { return true; }
};

}  // namespace ucxb::inproc
