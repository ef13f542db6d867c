// How much scratch (OpMemory::scratch) an op's algorithm asks for, known before it runs: a
// CUDA op's scratch is allocated on the caller's thread when the op is issued, never on the
// progress thread while the op runs (device_op.hpp says why), so the backend must size it
// from the op alone, mirroring the algorithms' chunking. tests/cpp/algorithms (through
// issue_sized_scratch.h) runs every reducing algorithm with exactly this much, and a request
// beyond it fails the case.
#pragma once

#include <cstddef>

#include "csrc/collectives/selection.h"

namespace ucxb::algo {

// The largest scratch request of `op` (all_reduce, reduce, reduce_scatter; 0 for the ops that
// ask for none) over `count` elements of `elementSize` bytes in a group of `worldSize`, run
// with `tuning` (the group's for the op's memory: device_chunk_bytes for device memory):
// all_reduce and reduce: the tensor's elements; reduce_scatter: the whole input's (every
// rank's block). `deviceMemory`: the op's buffers are device memory, as choose() takes it.
size_t scratchBytes(const Tuning& tuning, Op op, size_t count, size_t elementSize,
                    int worldSize, bool deviceMemory);

}  // namespace ucxb::algo
