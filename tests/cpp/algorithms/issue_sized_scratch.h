// The scratch a CUDA op is given when it is issued (algo::scratchBytes, csrc/device_op.hpp):
// an op run inside an IssueSizedScratch on a rank's thread may ask for that much and no more
// (ThreadDriver::scratchLimit throws beyond it, as DeviceMemory::scratch refuses), so an
// algorithm that asks for more than the backend sized fails its case, in every world.
#pragma once

#include <cstddef>
#include <cstdint>

#include "csrc/collectives/comm.h"
#include "csrc/collectives/scratch_size.h"
#include "tests/cpp/inproc/thread_driver.h"

namespace ucxb::algotest {

class IssueSizedScratch {
 public:
  // `count`: as scratchBytes takes it (reduce_scatter: the whole input's elements).
  IssueSizedScratch(const Comm& c, algo::Op op, size_t count, size_t esz) {
    inproc::ThreadDriver::scratchLimit =
        algo::scratchBytes(c.tuning(), op, count, esz, c.size(), !c.onHost());
  }
  ~IssueSizedScratch() { inproc::ThreadDriver::scratchLimit = SIZE_MAX; }
  IssueSizedScratch(const IssueSizedScratch&) = delete;
  IssueSizedScratch& operator=(const IssueSizedScratch&) = delete;
};

}  // namespace ucxb::algotest
