// all_to_all: linear (post everything at once; few, small messages) and pairwise exchange
// (one partner per step, so no rank is flooded and each step has one message in flight each
// way). Barrier: dissemination.
#include <cstring>
#include <string>

#include "csrc/collectives/building_blocks.h"

namespace ucxb::algo {

using namespace detail;

namespace {

void linear(Comm& c, const std::vector<const void*>& sends, const std::vector<size_t>& sendBytes,
            const std::vector<void*>& recvs, const std::vector<size_t>& recvBytes) {
  const int n = c.size();
  const int r = c.rank();
  std::vector<RequestPtr> reqs;
  // Rotated order, so that not every rank starts with rank 0.
  for (int i = 1; i < n; ++i) {
    const int p = mod(r - i, n);
    reqs.push_back(c.recv(p, 0, recvs[p], recvBytes[p]));
  }
  for (int i = 1; i < n; ++i) {
    const int p = mod(r + i, n);
    reqs.push_back(c.send(p, 0, sends[p], sendBytes[p]));
  }
  c.wait(reqs);
}

// Step i: send to r+i, receive from r-i.
void pairwise(Comm& c, const std::vector<const void*>& sends,
              const std::vector<size_t>& sendBytes, const std::vector<void*>& recvs,
              const std::vector<size_t>& recvBytes) {
  const int n = c.size();
  const int r = c.rank();
  for (int i = 1; i < n; ++i) {
    const int to = mod(r + i, n);
    const int from = mod(r - i, n);
    auto rq = c.recv(from, 0, recvs[from], recvBytes[from]);
    auto sq = c.send(to, 0, sends[to], sendBytes[to]);
    c.wait({rq, sq});
  }
}

}  // namespace

void alltoall(Comm& comm, const std::vector<const void*>& sends,
              const std::vector<size_t>& sendBytes, const std::vector<void*>& recvs,
              const std::vector<size_t>& recvBytes) {
  const int r = comm.rank();
  if (sendBytes[r] != recvBytes[r]) {  // checked before anything is posted
    throw OpFailed("all_to_all: rank " + std::to_string(r) + " sends " +
                   std::to_string(sendBytes[r]) + " bytes to itself but expects " +
                   std::to_string(recvBytes[r]));
  }
  size_t largest = 0;
  for (size_t b : sendBytes) largest = b > largest ? b : largest;
  if (choose(comm.tuning(), Op::kAlltoall, largest, comm.size()) == Algorithm::kLinear) {
    linear(comm, sends, sendBytes, recvs, recvBytes);
  } else {
    pairwise(comm, sends, sendBytes, recvs, recvBytes);
  }
  if (sendBytes[r] > 0) std::memmove(recvs[r], sends[r], sendBytes[r]);
}

// Round k: signal rank+2^k, wait for rank-2^k.
void barrier(Comm& comm) {
  const int n = comm.size();
  static char token;
  uint32_t round = 0;
  for (int k = 1; k < n; k <<= 1, ++round) {
    auto rq = comm.recv(mod(comm.rank() - k, n), round, &token, 0);
    auto sq = comm.send(mod(comm.rank() + k, n), round, &token, 0);
    comm.wait({rq, sq});
  }
}

}  // namespace ucxb::algo
