// Lets Work.wait() on a CUDA op return without blocking the host, as NCCL's does: the
// caller's current stream is made to wait, on the device, for a word of pinned host memory
// that the progress thread advances as the group's collectives end (CUDA's stream memory
// operations, cuStreamWaitValue64). The driver entry points are looked up at run time in the
// libcuda that CUDA torch has loaded, so the extension has no CUDA headers and no CUDA link
// dependency; where they are missing or refused, wait() blocks the host until the op ends.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>

namespace ucxb {

class StreamGate {
 public:
  // The gate of one group on one device, or null (stream memory operations unavailable).
  static std::shared_ptr<StreamGate> open(c10::Device device);

  // Caller's thread: `stream` waits until the op numbered `seq` (or a later one) has ended.
  // False when the driver refused; the caller then waits on the host instead.
  bool holdUntil(const c10::Stream& stream, uint64_t seq) const;
  // Progress thread (or whoever ends an op): the op numbered `seq` has ended, well or not. A
  // stream must never wait forever: every op ends this way, failed and abandoned ones too.
  void release(uint64_t seq);
  // Every op, now and later: the group has failed, and refuses the ops it has not run. What
  // a failed op leaves for the progress thread to let go later (requests it gave up) may
  // then free device memory there without a held stream waiting on it (device_holds.hpp).
  void releaseAll() { release(~uint64_t{0}); }

 private:
  StreamGate(uint64_t* word, uint64_t deviceAddress);

  // Pinned host memory, never freed: a stream may still be about to read it when the group is
  // gone (8 bytes per group and device).
  uint64_t* word_;
  uint64_t deviceAddress_;
};

}  // namespace ucxb
