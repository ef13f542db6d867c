// Where an op's buffers live, and the local work the algorithms do on them: copies,
// reductions, scratch. The algorithms never touch a buffer's bytes themselves; they ask Comm,
// which asks the op's OpMemory. HostMemory is plain memcpy and the host kernels; the backend's
// device memory (csrc/device_memory.hpp) runs ATen ops on a device stream instead. Torch-free
// and UCX-free, so the algorithm tests run every algorithm over either kind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "csrc/collectives/op_driver.h"
#include "csrc/collectives/reduce_kernels.h"
#include "transports/transport.h"

namespace ucxb {

class OpMemory {
 public:
  virtual ~OpMemory() = default;

  // The memory the op's buffers (and scratch) are in.
  virtual MemoryType type() const = 0;
  // Whether the transport reads and writes that memory itself. If not, Comm moves each message
  // through a host buffer (hostBuffer, toHost, fromHost): udp stages device memory so.
  virtual bool transportCarries() const = 0;

  // Both complete before they return: a buffer handed to the transport next is final.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // acc[i] = red(acc[i], in[i]) for `count` elements.
  virtual void reduce(const Reduction& red, void* acc, const void* in, size_t count) = 0;
  // A buffer of at least `bytes` in type() memory, reused by the op's later calls (grow-only:
  // it outlives every request that points into it).
  virtual uint8_t* scratch(size_t bytes) = 0;
  // Called before a buffer goes to the transport: device work still queued on the op's
  // buffers (packing, scaling) must have finished first. A no-op for host memory.
  virtual void settle() {}

  // Staging through host memory (only when !transportCarries()). `owner` keeps the returned
  // buffer alive; a request that may outlive the op holds it (Request::keepAlive).
  virtual uint8_t* hostBuffer(size_t bytes, std::shared_ptr<void>& owner);
  virtual void toHost(void* host, const void* src, size_t bytes);
  virtual void fromHost(void* dst, const void* host, size_t bytes);
};

// Host memory: memcpy, the host reduction kernels and the driver's scratch.
class HostMemory final : public OpMemory {
 public:
  explicit HostMemory(OpDriver& driver) : driver_(driver) {}
  MemoryType type() const override { return MemoryType::kHost; }
  bool transportCarries() const override { return true; }
  void copy(void* dst, const void* src, size_t bytes) override;
  void reduce(const Reduction& red, void* acc, const void* in, size_t count) override;
  uint8_t* scratch(size_t bytes) override { return driver_.scratch(bytes); }

 private:
  OpDriver& driver_;
};

}  // namespace ucxb
