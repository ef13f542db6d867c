// An op's buffers in CUDA device memory (collectives/op_memory.h): copies and reductions run
// as ATen ops on the group's internal stream of the device and are waited for before they
// return, because the transport (UCX's own copy engines, or udp's host staging) reads and
// writes the buffers outside any stream of ours. Uses only c10's device-generic API, so the
// extension builds against a CPU-only torch and runs unchanged on a CUDA one.
//
// Nothing here allocates device memory on the progress thread (device_holds.hpp says why that
// matters): copy() and reduce() are in-place or out= ATen ops on views of the op's own buffers
// (from_blob, no storage of their own), elementwise over operands of one dtype and length, so
// no temporaries; scratch() hands out what was allocated at issue. Only hostBuffer() (udp's
// pinned staging) allocates, and such an op is never held at the gate.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <memory>

#include "csrc/collectives/op_memory.h"
#include "csrc/device_op.hpp"

namespace ucxb {

class DeviceMemory final : public OpMemory {
 public:
  // `stream`: the group's internal stream on `device`. `transportCarries`: the transport
  // moves device memory itself; otherwise messages stage through pinned host buffers.
  // Every wait for the device ends by `deadline` (the op's), in OpTimeout.
  // `scratch`: the scratch lent to the op at issue (device_op.hpp; null: none), which may
  // outlive it. scratch() never allocates.
  DeviceMemory(c10::Device device, c10::Stream stream, bool transportCarries,
               Clock::time_point deadline, std::shared_ptr<DeviceScratch> scratch)
      : device_(device), stream_(stream), carries_(transportCarries), deadline_(deadline),
        scratch_(std::move(scratch)), done_(device.type()) {}

  MemoryType type() const override { return MemoryType::kCuda; }
  bool transportCarries() const override { return carries_; }
  void copy(void* dst, const void* src, size_t bytes) override;
  void reduce(const Reduction& red, void* acc, const void* in, size_t count) override;
  uint8_t* scratch(size_t bytes) override;
  void settle() override { finish("the op's packing and scaling"); }
  uint8_t* hostBuffer(size_t bytes, std::shared_ptr<void>& owner) override;
  void toHost(void* host, const void* src, size_t bytes) override;
  void fromHost(void* dst, const void* host, size_t bytes) override;

 private:
  at::Tensor onDevice(const void* data, int64_t count, at::ScalarType type) const;
  // Waits (by the deadline) for what was queued on the stream.
  void finish(const char* what) const;

  const c10::Device device_;
  const c10::Stream stream_;
  const bool carries_;
  const Clock::time_point deadline_;
  const std::shared_ptr<DeviceScratch> scratch_;
  // finish()'s event, recorded again at each wait: an op waits once per chunk it copies or
  // reduces, and a CUDA event created and destroyed each time cost two more driver calls.
  mutable c10::Event done_;
};

}  // namespace ucxb
