// The collective algorithms, written once against Comm (and so against any Transport).
// Each op has exactly one entry point here; the backend calls only these. An entry point
// picks its algorithm with algo::choose (selection.h): by message size and group size, or as
// the group's configuration forces. One file per op family implements them.
//
// Buffers are contiguous memory prepared by the backend, in the memory the op's OpMemory
// describes (op_memory.h): host memory, or a device's, which the algorithms touch only through
// Comm (send, recv, copy, reduce, scratch). Counts are in elements.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "csrc/collectives/comm.h"
#include "csrc/collectives/reduce_kernels.h"
#include "csrc/collectives/selection.h"

namespace ucxb::algo {

// The reduction of an op (reduce_kernels.h); OpMemory::reduce applies it where the buffers live.
using ucxb::Reduction;

// In place over `data`.
void allreduce(Comm& comm, void* data, size_t count, const Reduction& red);

// An op split where it waits, so that a driver other than the algorithm's own waits can
// drive it (the backend's inline path runs it on the caller's thread and, when a peer is
// late, hands the rest to the progress thread): it has posted its first requests when it is
// made; once requests() have completed, advance() does its next part.
class PostedOp {
 public:
  virtual ~PostedOp() = default;
  // What the op waits for next.
  const std::vector<RequestPtr>& requests() const { return requests_; }
  // Call once requests() have completed: true when the op is complete; otherwise requests()
  // is what it waits for next.
  virtual bool advance(Comm& comm) = 0;
  // Waits and advances until the op is complete (on whichever thread drives the transport).
  void finish(Comm& comm);

 protected:
  std::vector<RequestPtr> requests_;
};

// Whether an all_reduce of `count` elements runs as a PostedOp (postAllreduce): recursive
// doubling in one chunk (small messages), at any group size, through the transport; or, at
// two ranks in a group whose ranks stage through shared memory (`staging`: the group's slots,
// null when it has none or the op's memory is not the host's), one exchange of the whole
// vector through the slots where the automatic choice is the ring and the vector fits the
// slots at once. allreduce() runs such an op through postAllreduce too, so a rank that drives
// it on the caller's thread and a rank that runs it on its progress thread exchange the same
// messages.
bool allreducePostable(const Tuning& tuning, size_t count, size_t elementSize, int worldSize,
                       const StagingArea* staging);
// The peer-mapped all_reduce of two ranks (peer_map.cpp): each rank maps the other's buffer
// and folds its half straight out of it, with five notices and no bulk message. True once
// done; false where a rank could not map (both ranks return false, having agreed through the
// notices, and nothing of `data` has changed): the caller runs another algorithm. With
// device_peer_map=on (Tuning::peerMap kOn) that throws OpFailed instead, naming the rank and
// why. allreduce() runs it where peerMapApplies.
bool peerMapAllreduce(Comm& comm, void* data, size_t count, const Reduction& red);

// Posts the op (allreducePostable must hold for the Comm's group and memory).
std::unique_ptr<PostedOp> postAllreduce(Comm& comm, void* data, size_t count,
                                        const Reduction& red);

// blocks[r] is this rank's contribution to rank r's block (`blockCount` elements each; never
// modified); the reduction of every rank's block rank() is written to `out`.
void reduceScatter(Comm& comm, const std::vector<const void*>& blocks, void* out,
                   size_t blockCount, const Reduction& red);

// `in` is this rank's contribution and is never written (unless it is `out`); the root gets
// the result in `out` (which may be `in`); `out` is ignored elsewhere. Extra memory: two
// chunks of scratch, whatever `count` is.
void reduce(Comm& comm, const void* in, void* out, size_t count, const Reduction& red,
            int root);

void broadcast(Comm& comm, void* data, size_t bytes, int root);

// outs[r] receives rank r's `bytes` bytes (outs[rank()] gets a local copy of `in`).
void allgather(Comm& comm, const void* in, const std::vector<void*>& outs, size_t bytes);

// At the root outs[r] receives rank r's bytes; outs is ignored elsewhere.
void gather(Comm& comm, const void* in, const std::vector<void*>& outs, size_t bytes, int root);

// At the root ins[r] is sent to rank r; every rank receives into `out`.
void scatter(Comm& comm, const std::vector<const void*>& ins, void* out, size_t bytes, int root);

// Rank r sends sendBytes[p] from sends[p] to every p and receives recvBytes[p] into recvs[p].
void alltoall(Comm& comm, const std::vector<const void*>& sends,
              const std::vector<size_t>& sendBytes, const std::vector<void*>& recvs,
              const std::vector<size_t>& recvBytes);

void barrier(Comm& comm);

}  // namespace ucxb::algo
