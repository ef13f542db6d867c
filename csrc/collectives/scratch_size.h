// How much scratch (OpMemory::scratch) an op's algorithm asks for, known before it runs: a
// CUDA op's scratch is allocated on the caller's thread when the op is issued, never on the
// progress thread while the op runs (device_op.hpp says why), so the backend must size it
// from the op alone. One function per op that asks for scratch, mirroring the algorithms'
// chunking; tests/cpp/algorithms/scratch_groups.cpp runs every algorithm with exactly this
// much and fails on a request beyond it.
#pragma once

#include <cstddef>

#include "csrc/collectives/selection.h"

namespace ucxb::algo {

// The chunk size the algorithms use on memory of this kind (Comm::onHost()): the one place
// that reads it for sizing, so that a chunk size of its own for device memory is one change.
inline size_t chunkBytesFor(const Tuning& tuning, bool deviceMemory) {
  (void)deviceMemory;
  return tuning.chunkBytes;
}

// The largest scratch request of `op` (all_reduce, reduce, reduce_scatter; 0 for the ops that
// ask for none) over `count` elements of `elementSize` bytes in a group of `worldSize`:
// all_reduce and reduce: the tensor's elements; reduce_scatter: the whole input's (every
// rank's block). `deviceMemory`: the op's buffers are device memory, as choose() takes it.
size_t scratchBytes(const Tuning& tuning, Op op, size_t count, size_t elementSize,
                    int worldSize, bool deviceMemory);

}  // namespace ucxb::algo
