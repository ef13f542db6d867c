// What keeps cuda_wait=stream from hanging (docs/cuda.md, "Stream semantics"). A Work.wait()
// that holds the caller's stream at the group's gate (stream_gate.hpp) until the op ends
// makes every device-wide synchronisation wait for that op: torch's caching allocator
// freeing cached blocks (cudaFree) to serve an allocation, on any thread. That thread holds
// the allocator's lock meanwhile, so any other call into the allocator (an allocation, a
// free, recordStream) waits too. Should the progress thread, before the held op ends, be the
// one to call into it, or to wait on such a caller, the op can never end: a hang no timeout
// cuts. So, in a group with cuda_wait=stream:
//
// * An op's scratch is allocated at issue on the caller's thread (device_op.hpp).
// * An op whose run on the progress thread may still call into the allocator (a staging
//   copy, a packed buffer, udp's pinned staging, a point-to-point op, Future callbacks) is
//   marked from issue until its references are let go; a wait() holds the stream only when
//   no op issued before it (in the order the progress thread runs them) is so marked, and
//   the op itself is not: else it waits on the host.
// * What the progress thread would otherwise let go last (the op's tensors, its Work, an
//   outgrown scratch buffer), freeing device memory there, is kept here and let go on a
//   caller's thread (prune(): at the group's next device op, a wait(), the group's end).
//
// Nothing of it runs in a group with cuda_wait=host. A CPU op of a stream-mode group only
// takes its number, and is marked while its taken Future's callbacks may still run (on the
// progress thread, where they may allocate CUDA memory).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace ucxb {

class DeviceHolds {
 public:
  // Caller's thread, while the op's place in the progress thread's queue is taken (under the
  // group's issueMu_): its number in that order, collectives and point-to-point ops alike.
  uint64_t nextTicket() { return tickets_.fetch_add(1, std::memory_order_relaxed) + 1; }

  // The op numbered `ticket` may call into the allocator on the progress thread until the
  // Mark is dropped.
  class Mark {
   public:
    Mark(std::shared_ptr<DeviceHolds> holds, uint64_t ticket);
    ~Mark();
    Mark(const Mark&) = delete;
    Mark& operator=(const Mark&) = delete;

   private:
    const std::shared_ptr<DeviceHolds> holds_;
    const uint64_t ticket_;
  };
  void add(uint64_t ticket);
  void remove(uint64_t ticket);
  // No op numbered below `ticket` is marked.
  bool clearBefore(uint64_t ticket);

  // Caller's thread: `refs` (what the progress thread holds of an op) is let go here, by a
  // later prune(), once nothing else holds it.
  void keep(std::shared_ptr<void> refs);
  // Caller's thread: lets go of what only this list still holds.
  void prune();
  // The group's end: lets go of the whole list (what is still held elsewhere goes with that
  // holder). A kept op holds its Work, which holds this: the list must not outlive the group.
  void clear();

 private:
  std::atomic<uint64_t> tickets_{0};
  std::mutex mu_;
  std::multiset<uint64_t> marked_;
  std::vector<std::shared_ptr<void>> kept_;
};

}  // namespace ucxb
