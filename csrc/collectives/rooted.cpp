// Ops with a root. broadcast and reduce: a binomial tree (log steps; small messages) or a
// pipelined chain (each rank forwards chunk k while chunk k+1 arrives; large messages, where
// every rank then moves the message about once). gather and scatter: linear at the root.
#include <cstring>

#include "csrc/collectives/building_blocks.h"
#include "csrc/collectives/staged_exchange.h"

namespace ucxb::algo {

using namespace detail;

namespace {

// Receive from the parent, then send to the children, over ranks relative to the root.
// Through the group's shared-memory slots when it has them and the message is large enough
// for one copy less to outweigh a notice and a credit per piece (children are then served
// one after the other).
void binomialBroadcast(Comm& c, uint8_t* data, size_t bytes, int root) {
  const int n = c.size();
  const int vr = mod(c.rank() - root, n);
  const StagingArea* st = c.staging();
  uint32_t levels = 0;  // of the tree: ceil(log2 n)
  while ((size_t{1} << levels) < static_cast<size_t>(n)) ++levels;
  const size_t stagedPerLevel =
      st != nullptr ? stagedSteps(*st, bytes, 1, PieceSize::kScaledToMessage) : 0;
  const bool staged =
      st != nullptr && bytes >= kStagedMessageMin && levels * stagedPerLevel <= kStepSpace;
  const auto perLevel = static_cast<uint32_t>(stagedPerLevel);
  int mask = 1;
  uint32_t level = 0;
  while (mask < n) {
    if (vr & mask) {
      const int parent = mod(vr - mask + root, n);
      if (staged) {
        stagedExchange(c, -1, nullptr, 0, parent, data, bytes, level * perLevel, nullptr,
                       PieceSize::kScaledToMessage);
      } else {
        c.wait({c.recv(parent, kWholeMessage + level, data, bytes)});
      }
      break;
    }
    mask <<= 1;
    ++level;
  }
  std::vector<RequestPtr> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    --level;
    if (vr + mask >= n) continue;
    const int child = mod(vr + mask + root, n);
    if (staged) {
      stagedExchange(c, child, data, bytes, -1, nullptr, 0, level * perLevel, nullptr,
                     PieceSize::kScaledToMessage);
    } else {
      sends.push_back(c.send(child, kWholeMessage + level, data, bytes));
    }
  }
  c.wait(sends);
}

// root -> root+1 -> ... : every chunk is received in place, then forwarded.
void chainBroadcast(Comm& c, uint8_t* data, size_t bytes, int root) {
  const int n = c.size();
  const int vr = mod(c.rank() - root, n);
  const int prev = vr > 0 ? mod(c.rank() - 1, n) : -1;
  const int next = vr < n - 1 ? mod(c.rank() + 1, n) : -1;
  const size_t chunk = chunkElems(c, bytes, 1, kStepSpace);
  const size_t chunks = chunksOf(bytes, chunk);
  if (prev < 0) {
    sendChunked(c, next, data, bytes, 1, chunk, 0);
    return;
  }
  std::vector<RequestPtr> recvs;
  std::vector<RequestPtr> sends;
  try {
    for (size_t k = 0; k < chunks; ++k) {
      recvs.push_back(c.recv(prev, chunkStep(0, k, chunks), data + k * chunk,
                             piece(bytes, chunk, k)));
    }
    for (size_t k = 0; k < chunks; ++k) {
      c.wait({recvs[k]});
      if (next >= 0) {
        sends.push_back(c.send(next, chunkStep(0, k, chunks), data + k * chunk,
                               piece(bytes, chunk, k)));
      }
    }
    c.wait(sends);
  } catch (...) {
    recvs.insert(recvs.end(), sends.begin(), sends.end());
    c.abandon(recvs);
    throw;
  }
}

// Binomial tree towards the root; each level's message is chunked through scratch.
void binomialReduce(Comm& c, uint8_t* data, size_t count, const Reduction& red, int root) {
  const int n = c.size();
  const int vr = mod(c.rank() - root, n);
  const size_t chunk = chunkElems(c, count, red.elementSize, kStepSpace / 32);
  const auto perLevel = static_cast<uint32_t>(chunksOf(count, chunk));
  uint32_t level = 0;
  for (int mask = 1; mask < n; mask <<= 1, ++level) {
    if (vr & mask) {
      exchangeReduce(c, mod(vr - mask + root, n), data, count, -1, nullptr, 0, chunk,
                     level * perLevel, red);
      return;
    }
    if (vr + mask < n) {
      exchangeReduce(c, -1, nullptr, 0, mod(vr + mask + root, n), data, count, chunk,
                     level * perLevel, red);
    }
  }
}

// root-1 <- ... <- root+1 <- root+n-1 ... : the partial sum flows down the chain towards
// the root; a rank folds chunk k into its own data (clobbered off the root) and forwards it
// while chunk k+1 arrives in the other scratch slot.
void chainReduce(Comm& c, uint8_t* data, size_t count, const Reduction& red, int root) {
  const int n = c.size();
  const int vr = mod(c.rank() - root, n);
  const int upstream = vr < n - 1 ? mod(c.rank() + 1, n) : -1;
  const int downstream = vr > 0 ? mod(c.rank() - 1, n) : -1;
  const size_t esz = red.elementSize;
  const size_t chunk = chunkElems(c, count, esz, kStepSpace);
  const size_t chunks = chunksOf(count, chunk);
  if (upstream < 0) {
    sendChunked(c, downstream, data, count, esz, chunk, 0);
    return;
  }
  uint8_t* slots = c.scratch(2 * chunk * esz);
  auto postRecv = [&](size_t k) {
    return c.recv(upstream, chunkStep(0, k, chunks), slots + (k % 2) * chunk * esz,
                  piece(count, chunk, k) * esz);
  };
  RequestPtr next = postRecv(0);
  RequestPtr current;
  std::vector<RequestPtr> sends;
  try {
    for (size_t k = 0; k < chunks; ++k) {
      current = std::move(next);
      next = nullptr;
      if (k + 1 < chunks) next = postRecv(k + 1);  // its slot held chunk k-1, already folded
      c.wait({current});
      const size_t elems = piece(count, chunk, k);
      if (elems) red.fn(data + k * chunk * esz, slots + (k % 2) * chunk * esz, elems);
      if (downstream >= 0) {
        sends.push_back(c.send(downstream, chunkStep(0, k, chunks), data + k * chunk * esz,
                               elems * esz));
      }
    }
    c.wait(sends);
  } catch (...) {
    for (auto& r : {current, next}) {
      if (r) sends.push_back(r);
    }
    c.abandon(sends);
    throw;
  }
}

}  // namespace

void broadcast(Comm& comm, void* data, size_t bytes, int root) {
  if (comm.size() == 1) return;
  if (choose(comm.tuning(), Op::kBroadcast, bytes, comm.size()) == Algorithm::kChain) {
    chainBroadcast(comm, static_cast<uint8_t*>(data), bytes, root);
  } else {
    binomialBroadcast(comm, static_cast<uint8_t*>(data), bytes, root);
  }
}

void reduce(Comm& comm, void* data, size_t count, const Reduction& red, int root) {
  if (comm.size() == 1) return;
  auto* bytes = static_cast<uint8_t*>(data);
  if (choose(comm.tuning(), Op::kReduce, count * red.elementSize, comm.size()) ==
      Algorithm::kChain) {
    chainReduce(comm, bytes, count, red, root);
  } else {
    binomialReduce(comm, bytes, count, red, root);
  }
}

void gather(Comm& comm, const void* in, const std::vector<void*>& outs, size_t bytes, int root) {
  if (comm.rank() != root) {
    comm.wait({comm.send(root, 0, in, bytes)});
    return;
  }
  std::vector<RequestPtr> reqs;
  for (int p = 0; p < comm.size(); ++p) {
    if (p != root) reqs.push_back(comm.recv(p, 0, outs[p], bytes));
  }
  if (outs[root] != in && bytes > 0) std::memcpy(outs[root], in, bytes);
  comm.wait(reqs);
}

void scatter(Comm& comm, const std::vector<const void*>& ins, void* out, size_t bytes, int root) {
  if (comm.rank() != root) {
    comm.wait({comm.recv(root, 0, out, bytes)});
    return;
  }
  std::vector<RequestPtr> reqs;
  for (int p = 0; p < comm.size(); ++p) {
    if (p != root) reqs.push_back(comm.send(p, 0, ins[p], bytes));
  }
  if (ins[root] != out && bytes > 0) std::memcpy(out, ins[root], bytes);
  comm.wait(reqs);
}

}  // namespace ucxb::algo
