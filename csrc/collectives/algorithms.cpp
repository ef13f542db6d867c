#include "csrc/collectives/algorithms.h"

#include <cstdint>
#include <cstring>

namespace ucxb::algo {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

struct Blocks {
  std::vector<size_t> offset;  // elements
  std::vector<size_t> count;   // elements
  size_t largest = 0;
};

// n nearly equal blocks; the first count % n blocks get one extra element.
Blocks split(size_t count, int n) {
  Blocks b;
  b.offset.resize(n);
  b.count.resize(n);
  size_t at = 0;
  for (int i = 0; i < n; ++i) {
    b.count[i] = count / n + (static_cast<size_t>(i) < count % n ? 1 : 0);
    b.offset[i] = at;
    at += b.count[i];
    b.largest = std::max(b.largest, b.count[i]);
  }
  return b;
}

Blocks uniform(size_t blockCount, int n) {
  Blocks b;
  for (int i = 0; i < n; ++i) {
    b.offset.push_back(blockCount * i);
    b.count.push_back(blockCount);
  }
  b.largest = blockCount;
  return b;
}

// After size()-1 steps, block rank() of `data` holds the reduction of every rank's block.
// Step s: send block (r-s-1), receive block (r-s-2) from the left and fold it in.
void ringReduceScatter(Comm& c, uint8_t* data, const Blocks& b, const Reduction& red) {
  const int n = c.size();
  const int r = c.rank();
  const size_t esz = red.elementSize;
  std::vector<uint8_t> scratch(b.largest * esz);
  for (int s = 0; s < n - 1; ++s) {
    const int sendBlock = mod(r - s - 1, n);
    const int recvBlock = mod(r - s - 2, n);
    auto rq = c.recv(mod(r - 1, n), s, scratch.data(), b.count[recvBlock] * esz);
    auto sq = c.send(mod(r + 1, n), s, data + b.offset[sendBlock] * esz, b.count[sendBlock] * esz);
    c.wait({rq, sq});
    red.fn(data + b.offset[recvBlock] * esz, scratch.data(), b.count[recvBlock]);
  }
}

// Rank r starts with block r final; step s forwards block (r-s) and receives (r-s-1) in place.
void ringAllgather(Comm& c, uint8_t* data, const Blocks& b, size_t esz, uint32_t firstStep) {
  const int n = c.size();
  const int r = c.rank();
  for (int s = 0; s < n - 1; ++s) {
    const int sendBlock = mod(r - s, n);
    const int recvBlock = mod(r - s - 1, n);
    auto rq = c.recv(mod(r - 1, n), firstStep + s, data + b.offset[recvBlock] * esz,
                     b.count[recvBlock] * esz);
    auto sq = c.send(mod(r + 1, n), firstStep + s, data + b.offset[sendBlock] * esz,
                     b.count[sendBlock] * esz);
    c.wait({rq, sq});
  }
}

}  // namespace

void allreduce(Comm& comm, void* data, size_t count, const Reduction& red) {
  const int n = comm.size();
  if (n == 1) {
    return;
  }
  const Blocks blocks = split(count, n);
  auto* bytes = static_cast<uint8_t*>(data);
  ringReduceScatter(comm, bytes, blocks, red);
  ringAllgather(comm, bytes, blocks, red.elementSize, static_cast<uint32_t>(n - 1));
}

void reduceScatter(Comm& comm, void* work, void* out, size_t blockCount, const Reduction& red) {
  auto* bytes = static_cast<uint8_t*>(work);
  const Blocks blocks = uniform(blockCount, comm.size());
  if (comm.size() > 1) {
    ringReduceScatter(comm, bytes, blocks, red);
  }
  std::memcpy(out, bytes + blocks.offset[comm.rank()] * red.elementSize,
              blockCount * red.elementSize);
}

// Binomial tree towards the root over ranks relative to it; step = tree level.
void reduce(Comm& comm, void* data, size_t count, const Reduction& red, int root) {
  const int n = comm.size();
  const int vr = mod(comm.rank() - root, n);
  const size_t bytes = count * red.elementSize;
  std::vector<uint8_t> scratch;
  uint32_t level = 0;
  for (int mask = 1; mask < n; mask <<= 1, ++level) {
    if (vr & mask) {
      comm.wait({comm.send(mod(vr - mask + root, n), level, data, bytes)});
      return;
    }
    if (vr + mask < n) {
      scratch.resize(bytes);
      comm.wait({comm.recv(mod(vr + mask + root, n), level, scratch.data(), bytes)});
      red.fn(data, scratch.data(), count);
    }
  }
}

// Binomial tree away from the root: receive from the parent, then send to the children.
void broadcast(Comm& comm, void* data, size_t bytes, int root) {
  const int n = comm.size();
  const int vr = mod(comm.rank() - root, n);
  int mask = 1;
  uint32_t level = 0;
  while (mask < n) {
    if (vr & mask) {
      comm.wait({comm.recv(mod(vr - mask + root, n), level, data, bytes)});
      break;
    }
    mask <<= 1;
    ++level;
  }
  std::vector<RequestPtr> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    --level;
    if (vr + mask < n) {
      sends.push_back(comm.send(mod(vr + mask + root, n), level, data, bytes));
    }
  }
  comm.wait(sends);
}

void allgather(Comm& comm, const void* in, const std::vector<void*>& outs, size_t bytes) {
  std::vector<RequestPtr> reqs;
  for (int p = 0; p < comm.size(); ++p) {
    if (p != comm.rank()) {
      reqs.push_back(comm.recv(p, 0, outs[p], bytes));
    }
  }
  for (int p = 0; p < comm.size(); ++p) {
    if (p != comm.rank()) {
      reqs.push_back(comm.send(p, 0, in, bytes));
    }
  }
  if (outs[comm.rank()] != in) {
    std::memcpy(outs[comm.rank()], in, bytes);
  }
  comm.wait(reqs);
}

void gather(Comm& comm, const void* in, const std::vector<void*>& outs, size_t bytes, int root) {
  if (comm.rank() != root) {
    comm.wait({comm.send(root, 0, in, bytes)});
    return;
  }
  std::vector<RequestPtr> reqs;
  for (int p = 0; p < comm.size(); ++p) {
    if (p != root) {
      reqs.push_back(comm.recv(p, 0, outs[p], bytes));
    }
  }
  if (outs[root] != in) {
    std::memcpy(outs[root], in, bytes);
  }
  comm.wait(reqs);
}

void scatter(Comm& comm, const std::vector<const void*>& ins, void* out, size_t bytes, int root) {
  if (comm.rank() != root) {
    comm.wait({comm.recv(root, 0, out, bytes)});
    return;
  }
  std::vector<RequestPtr> reqs;
  for (int p = 0; p < comm.size(); ++p) {
    if (p != root) {
      reqs.push_back(comm.send(p, 0, ins[p], bytes));
    }
  }
  if (ins[root] != out) {
    std::memcpy(out, ins[root], bytes);
  }
  comm.wait(reqs);
}

void alltoall(Comm& comm, const std::vector<const void*>& sends,
              const std::vector<size_t>& sendBytes, const std::vector<void*>& recvs,
              const std::vector<size_t>& recvBytes) {
  const int n = comm.size();
  const int r = comm.rank();
  if (sendBytes[r] != recvBytes[r]) {  // checked before anything is posted
    throw OpFailed("all_to_all: rank " + std::to_string(r) + " sends " +
                   std::to_string(sendBytes[r]) + " bytes to itself but expects " +
                   std::to_string(recvBytes[r]));
  }
  std::vector<RequestPtr> reqs;
  // Post in rotated order so that rank r does not make everyone start with rank 0.
  for (int i = 1; i < n; ++i) {
    const int p = mod(r - i, n);
    reqs.push_back(comm.recv(p, 0, recvs[p], recvBytes[p]));
  }
  for (int i = 1; i < n; ++i) {
    const int p = mod(r + i, n);
    reqs.push_back(comm.send(p, 0, sends[p], sendBytes[p]));
  }
  if (sendBytes[r] > 0) std::memmove(recvs[r], sends[r], sendBytes[r]);
  comm.wait(reqs);
}

// Dissemination: in round k every rank signals rank+2^k and waits for rank-2^k.
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
