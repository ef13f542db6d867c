// An op memory that stands in for a device the transport cannot carry (a CUDA tensor on udp):
// its buffers are host memory labelled device memory, so Comm must stage every message
// through host buffers (the in-process transport refuses device memory), and every algorithm
// runs over the staging path that csrc/device_memory.hpp takes on a GPU.
#pragma once

#include <cstring>
#include <memory>
#include <vector>

#include "csrc/collectives/op_memory.h"

namespace ucxb::inproc {

class BouncingMemory final : public OpMemory {
 public:
  explicit BouncingMemory(OpDriver& driver) : host_(driver) {}
  MemoryType type() const override { return MemoryType::kCuda; }
  bool transportCarries() const override { return false; }
  void copy(void* dst, const void* src, size_t bytes) override { host_.copy(dst, src, bytes); }
  void reduce(const Reduction& red, void* acc, const void* in, size_t count) override {
    host_.reduce(red, acc, in, count);
  }
  uint8_t* scratch(size_t bytes) override { return host_.scratch(bytes); }
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

 private:
  HostMemory host_;
};

}  // namespace ucxb::inproc
