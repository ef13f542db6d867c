// An op memory that stands in for device memory the transport carries itself (a CUDA tensor
// on ucx): its buffers are host memory labelled device memory, handed to the transport as
// they are (the world's Fabric takes MemoryType::kCuda), with copies and reductions done as
// the host's. What it checks is routing: an op on it must take no host-only path
// (transport.h's takesHostPaths), which the world counts.
#pragma once

#include "csrc/collectives/op_memory.h"

namespace ucxb::inproc {

class CarriedMemory final : public OpMemory {
 public:
  explicit CarriedMemory(OpDriver& driver) : host_(driver) {}
  MemoryType type() const override { return MemoryType::kCuda; }
  bool transportCarries() const override { return true; }
  void copy(void* dst, const void* src, size_t bytes) override { host_.copy(dst, src, bytes); }
  void reduce(const Reduction& red, void* acc, const void* in, size_t count) override {
    host_.reduce(red, acc, in, count);
  }
  uint8_t* scratch(size_t bytes) override { return host_.scratch(bytes); }

 private:
  HostMemory host_;
};

}  // namespace ucxb::inproc
