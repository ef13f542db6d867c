#include "csrc/collectives/algorithms.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>


namespace ucxb::algo {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// Received data that must be combined with local data arrives in chunks of at most this
// size, into two reused scratch slots: extra memory per op stays at 2 chunks whatever the
// tensor size, and reducing one chunk overlaps receiving the next.
constexpr size_t kChunkBytes = size_t{4} << 20;

// A message's last chunk carries this bit in its tag step. Ranks that disagree on a
// message's size then disagree on which chunk is last, so the chunks do not match and the op
// fails (at the latest at its timeout) instead of returning a partial result.
constexpr uint32_t kLastChunk = uint32_t{1} << 15;
// Step numbers an op may use below kLastChunk.
constexpr size_t kStepSpace = kLastChunk;

// Elements per chunk: kChunkBytes worth, or more when `count` would otherwise need more
// than `maxChunks` chunks (each chunk takes one tag step).
size_t chunkElems(size_t count, size_t esz, size_t maxChunks) {
  const size_t elems = std::max<size_t>(1, kChunkBytes / esz);
  maxChunks = std::max<size_t>(1, maxChunks);
  const size_t needed = count == 0 ? 0 : (count + maxChunks - 1) / maxChunks;
  return std::max(elems, needed);
}

// A 0-element message still travels, so ranks that disagree on sizes find out.
size_t chunksOf(size_t count, size_t chunk) { return count == 0 ? 1 : (count + chunk - 1) / chunk; }

size_t piece(size_t total, size_t chunk, size_t k) {
  return std::min(chunk, total - std::min(total, k * chunk));
}

// Sends `sendCount` elements of `src` to `to` while receiving `recvCount` from `from` and
// folding them into `dst`; chunk k travels with tag step `firstStep + k` (plus kLastChunk on
// the last one). Either direction may be absent (peer -1). Both sides of a message derive the
// chunk size from values every rank shares, and the chunk count from the message's size.
void exchangeReduce(Comm& c, int to, const uint8_t* src, size_t sendCount, int from,
                    uint8_t* dst, size_t recvCount, size_t chunk, uint32_t firstStep,
                    const Reduction& red) {
  const size_t esz = red.elementSize;
  const size_t sendChunks = to >= 0 ? chunksOf(sendCount, chunk) : 0;
  const size_t recvChunks = from >= 0 ? chunksOf(recvCount, chunk) : 0;
  uint8_t* slots = recvChunks > 0 ? c.scratch(2 * chunk * esz) : nullptr;
  auto stepOf = [firstStep](size_t k, size_t chunks) {
    return firstStep + static_cast<uint32_t>(k) + (k + 1 == chunks ? kLastChunk : 0);
  };
  auto postRecv = [&](size_t k) {
    return c.recv(from, stepOf(k, recvChunks), slots + (k % 2) * chunk * esz,
                  piece(recvCount, chunk, k) * esz);
  };
  RequestPtr next = recvChunks > 0 ? postRecv(0) : nullptr;
  try {
    for (size_t k = 0; k < std::max(sendChunks, recvChunks); ++k) {
      std::vector<RequestPtr> reqs;
      RequestPtr current = std::move(next);
      next = nullptr;
      if (k + 1 < recvChunks) next = postRecv(k + 1);  // its slot held chunk k-1, now folded
      if (k < sendChunks) {
        reqs.push_back(c.send(to, stepOf(k, sendChunks), src + k * chunk * esz,
                              piece(sendCount, chunk, k) * esz));
      }
      if (current) reqs.push_back(current);
      c.wait(reqs);
      if (current) {
        red.fn(dst + k * chunk * esz, slots + (k % 2) * chunk * esz, piece(recvCount, chunk, k));
      }
    }
  } catch (...) {
    if (next) c.abandon({next});
    throw;
  }
}

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
// Step s: send block (r-s-1), receive block (r-s-2) from the left and fold it in, chunked.
// Returns the number of tag steps used.
uint32_t ringReduceScatter(Comm& c, uint8_t* data, const Blocks& b, const Reduction& red) {
  const int n = c.size();
  const int r = c.rank();
  const size_t esz = red.elementSize;
  // Every rank derives the same chunking from the largest block; the all-gather that may
  // follow needs n-1 more steps.
  const size_t perStep = (kStepSpace - std::min<size_t>(kStepSpace, n)) / std::max(1, n - 1);
  const size_t chunk = chunkElems(b.largest, esz, perStep);
  const auto stepsPerBlock = static_cast<uint32_t>(chunksOf(b.largest, chunk));
  for (int s = 0; s < n - 1; ++s) {
    const int sendBlock = mod(r - s - 1, n);
    const int recvBlock = mod(r - s - 2, n);
    exchangeReduce(c, mod(r + 1, n), data + b.offset[sendBlock] * esz, b.count[sendBlock],
                   mod(r - 1, n), data + b.offset[recvBlock] * esz, b.count[recvBlock], chunk,
                   static_cast<uint32_t>(s) * stepsPerBlock, red);
  }
  return static_cast<uint32_t>(n - 1) * stepsPerBlock;
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
  const uint32_t used = ringReduceScatter(comm, bytes, blocks, red);
  ringAllgather(comm, bytes, blocks, red.elementSize, used);
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

// Binomial tree towards the root over ranks relative to it; each level's message is chunked
// and takes `perLevel` tag steps.
void reduce(Comm& comm, void* data, size_t count, const Reduction& red, int root) {
  const int n = comm.size();
  const int vr = mod(comm.rank() - root, n);
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t chunk = chunkElems(count, red.elementSize, kStepSpace / 32);
  const auto perLevel = static_cast<uint32_t>(chunksOf(count, chunk));
  uint32_t level = 0;
  for (int mask = 1; mask < n; mask <<= 1, ++level) {
    if (vr & mask) {
      exchangeReduce(comm, mod(vr - mask + root, n), bytes, count, -1, nullptr, 0, chunk,
                     level * perLevel, red);
      return;
    }
    if (vr + mask < n) {
      exchangeReduce(comm, -1, nullptr, 0, mod(vr + mask + root, n), bytes, count, chunk,
                     level * perLevel, red);
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
