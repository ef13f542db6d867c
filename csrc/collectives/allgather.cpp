// all_gather: Bruck's log-step exchange (latency), ring (bandwidth), linear (everyone to
// everyone at once; the baseline). Every algorithm receives straight into the outputs.
#include <cstring>

#include "csrc/collectives/building_blocks.h"

namespace ucxb::algo {

using namespace detail;

namespace {

// Round k (distance d = 2^k): a rank holding blocks r..r+d-1 sends the first min(d, n-d) of
// them to r-d and receives blocks r+d.. from r+d. Each block is its own message, so no
// rotation buffer is needed; its tag step is the block's number, unique per receiver.
void bruck(Comm& c, const std::vector<void*>& outs, size_t bytes) {
  const int n = c.size();
  const int r = c.rank();
  for (int d = 1; d < n; d *= 2) {
    const int count = d < n - d ? d : n - d;
    std::vector<RequestPtr> reqs;
    for (int j = 0; j < count; ++j) {
      const int block = mod(r + d + j, n);
      reqs.push_back(c.recv(mod(r + d, n), static_cast<uint32_t>(block), outs[block], bytes));
    }
    for (int j = 0; j < count; ++j) {
      const int block = mod(r + j, n);
      reqs.push_back(c.send(mod(r - d, n), static_cast<uint32_t>(block), outs[block], bytes));
    }
    c.wait(reqs);
  }
}

void linear(Comm& c, const void* in, const std::vector<void*>& outs, size_t bytes) {
  std::vector<RequestPtr> reqs;
  for (int i = 1; i < c.size(); ++i) {
    const int p = mod(c.rank() - i, c.size());
    reqs.push_back(c.recv(p, 0, outs[p], bytes));
  }
  for (int i = 1; i < c.size(); ++i) {
    reqs.push_back(c.send(mod(c.rank() + i, c.size()), 0, in, bytes));
  }
  c.wait(reqs);
}

}  // namespace

void allgather(Comm& comm, const void* in, const std::vector<void*>& outs, size_t bytes) {
  const int n = comm.size();
  if (outs[comm.rank()] != in && bytes > 0) {
    comm.copy(outs[comm.rank()], in, bytes);
  }
  if (n == 1) return;
  switch (choose(comm.tuning(), Op::kAllgather, bytes * n, n)) {
    case Algorithm::kBruck:
      bruck(comm, outs, bytes);
      return;
    case Algorithm::kLinear:
      linear(comm, in, outs, bytes);
      return;
    default: {
      std::vector<uint8_t*> blocks;
      for (void* p : outs) blocks.push_back(static_cast<uint8_t*>(p));
      ringAllgather(comm, blocks, std::vector<size_t>(n, bytes), 0);
      return;
    }
  }
}

}  // namespace ucxb::algo
