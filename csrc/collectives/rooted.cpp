// Ops with a root. broadcast and reduce: a binomial tree (log steps; small messages) or a
// pipelined chain (each rank forwards chunk k while chunk k+1 arrives; large messages, where
// every rank then moves the message about once). gather and scatter: linear at the root.
#include <bit>
#include <cstring>
#include <optional>
#include <string>

#include "csrc/collectives/building_blocks.h"
#include "csrc/collectives/staged_exchange.h"

namespace ucxb::algo {

using namespace detail;

namespace {

// The binomial tree over ranks relative to the root, as binomialBroadcast and binomialReduce
// walk it, for the ranks of the other algorithm too (their tripwires).
struct Tree {
  uint32_t levels = 0;  // ceil(log2 n)
  explicit Tree(int n) {
    while ((size_t{1} << levels) < static_cast<size_t>(n)) ++levels;
  }
  // binomialBroadcast's staged exchange at level l starts at step l * stride(): each fits it.
  uint32_t stride() const { return static_cast<uint32_t>(kStepSpace / levels); }
};

// The level at which relative rank vr (> 0) hangs below its parent, vr - 2^level.
uint32_t parentLevel(int vr) {
  return static_cast<uint32_t>(std::countr_zero(static_cast<unsigned>(vr)));
}

// Whether a rank of `op` whose message is `bytes` long listens for the other algorithm's
// first message (selection.h, kOtherAlgorithmWireMin). Not for device memory: a transport
// that does not carry it would stage each wire's receive through a pinned host buffer.
bool wiresForOtherAlgorithm(const Comm& c, Op op, size_t bytes) {
  return bytes >= kOtherAlgorithmWireMin && c.onHost() && sizeDecides(c.tuning(), op, c.size());
}

// binomialBroadcast's receive of the `bytes` from `parent` at `level`: staged (from step
// `stagedStep`) when `plan` says so, else whole through the transport. Where the group has
// shared-memory slots, a tripwire waits meanwhile for the first message of the other path.
// `chainPrev` (-1: none) is the rank that would forward the message to this one had the
// ranks chosen the chain broadcast; where it is not the parent, tripwires wait for its
// first message too (the one of a chain of one chunk, and of several).
void receiveFromParent(Comm& c, int parent, uint8_t* data, size_t bytes,
                       const std::optional<StagedPlan>& plan, uint32_t level,
                       uint32_t stagedStep, int chainPrev) {
  const std::string mine = std::to_string(bytes) + " bytes from rank " + std::to_string(parent);
  std::vector<RequestPtr> wires;
  RequestPtr noticeWire;
  StagedNotice notice{};  // the parent's first notice, if it staged its message
  if (c.staging() != nullptr && plan) {
    wires.push_back(c.tripwire(parent, kWholeMessage + level, nullptr, 0, [mine](const Request&) {
      return "expected " + mine + " through shared memory but it sent its message whole " +
             "through the transport: the ranks passed tensors of different sizes";
    }));
  } else if (c.staging() != nullptr) {
    auto why = [mine, &notice](const Request&) {
      return "expected " + mine + " but it sent " + std::to_string(notice.total) +
             " through shared memory: the ranks passed tensors of different sizes";
    };
    noticeWire = c.tripwire(parent, stagedStep, &notice, sizeof(notice), why);
    wires.push_back(noticeWire);
  }
  if (chainPrev >= 0 && chainPrev != parent) {
    auto why = [mine, chainPrev](const Request&) {
      return "expected " + mine + " down the broadcast's tree but rank " +
             std::to_string(chainPrev) + " forwarded a message down the chain, which " +
             "carries more than " + std::to_string(kBroadcastBinomialMax) +
             " bytes: the ranks passed tensors of different sizes";
    };
    for (const uint32_t step : {kWholeMessage, uint32_t{0}}) {
      wires.push_back(c.tripwire(chainPrev, step, nullptr, 0, why));
    }
  }
  try {
    if (plan) {
      stagedExchange(c, -1, nullptr, 0, parent, data, bytes, stagedStep, nullptr, plan->pieces);
    } else {
      c.wait({c.recv(parent, kWholeMessage + level, data, bytes)});
    }
  } catch (...) {
    if (!wires.empty()) c.abandon(wires);  // (abandon() progresses the transport)
    // The parent staged its message (its notice tripped the wire) and waits for our
    // credits: tell it now, or it waits out the timeout. (A staged receive refuses in
    // stagedExchange; a parent that sent whole waits for nothing.)
    if (noticeWire && Comm::caught(*noticeWire)) refuseStaged(c, parent, bytes);
    throw;
  }
  if (!wires.empty()) c.abandon(wires);  // (abandon() progresses the transport)
}

// binomialBroadcast's staged send of the `bytes` to `child` at steps from `firstStep`. A
// child that expected another length refuses it (refuseStaged) instead of sending credits:
// a wire for that refusal ends the exchange at once. Returns that refusal's error (naming
// both lengths), or nothing when the child took the message; the caller serves its other
// children before it throws it, so that they need not wait out the timeout for it.
std::optional<std::string> stageToChild(Comm& c, int child, const uint8_t* data, size_t bytes,
                                        const StagedPlan& plan, uint32_t firstStep) {
  StagedRefusal refusal{};
  RequestPtr wire = refusalWire(c, child, bytes, refusal);
  try {
    stagedExchange(c, child, data, bytes, -1, nullptr, 0, firstStep, nullptr, plan.pieces);
  } catch (const OpFailed&) {
    c.abandon({wire});
    if (!refusedBy(c, child)) throw;
    return c.untrip();
  } catch (...) {
    c.abandon({wire});
    throw;
  }
  c.abandon({wire});
  return std::nullopt;
}

// Receive from the parent, then send to the children, over ranks relative to the root.
// Through the group's shared-memory slots when it has them and the message is large enough
// for one copy less to outweigh a notice and a credit per piece (children are then served
// one after the other). Each level's staged exchange starts at a step fixed by the level
// alone (not by the message's length), so that a rank whose parent took the other path
// (the ranks passed tensors of different sizes) knows the tag of its first message: its
// tripwire (Comm::tripwire) catches it and the op fails at once, naming both lengths where
// it can, instead of waiting out the timeout for a message that never comes.
void binomialBroadcast(Comm& c, uint8_t* data, size_t bytes, int root) {
  const int n = c.size();
  const int vr = mod(c.rank() - root, n);
  const Tree tree(n);
  const auto plan = c.staged(StagedTraffic::kOneWay, bytes, 1,
                             {.exchanges = tree.levels, .steps = kStepSpace});
  // The plan fits levels * its steps into kStepSpace, so each level's fit into this stride.
  const uint32_t stride = tree.stride();
  int mask = 1;
  uint32_t level = 0;
  while (mask < n) {
    if (vr & mask) {
      const int parent = mod(vr - mask + root, n);
      const int chainPrev =
          wiresForOtherAlgorithm(c, Op::kBroadcast, bytes) ? mod(c.rank() - 1, n) : -1;
      receiveFromParent(c, parent, data, bytes, plan, level, level * stride, chainPrev);
      break;
    }
    mask <<= 1;
    ++level;
  }
  std::vector<RequestPtr> sends;
  std::optional<std::string> refused;  // by the first child that refused the message
  for (mask >>= 1; mask > 0; mask >>= 1) {
    --level;
    if (vr + mask >= n) continue;
    const int child = mod(vr + mask + root, n);
    if (plan) {
      auto why = stageToChild(c, child, data, bytes, *plan, level * stride);
      if (why && !refused) refused = std::move(why);
    } else {
      sends.push_back(c.send(child, kWholeMessage + level, data, bytes));
    }
  }
  c.wait(sends);
  if (refused) throw OpFailed(*refused);
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
  std::vector<RequestPtr> wires;
  RequestPtr noticeWire;
  StagedNotice notice{};  // the tree parent's first notice, if it staged its message
  int parent = -1;
  try {
    for (size_t k = 0; k < chunks; ++k) {
      recvs.push_back(c.recv(prev, chunkStep(0, k, chunks), data + k * chunk,
                             piece(bytes, chunk, k)));
    }
    if (wiresForOtherAlgorithm(c, Op::kBroadcast, bytes)) {
      // Tripwires, posted after the chain's own receives (which match first where a tag is
      // shared), for the message this rank's parent in binomialBroadcast sends it when the
      // parent's tensor is small enough for the tree: staged (its first notice) or whole.
      const Tree tree(n);
      const uint32_t level = parentLevel(vr);
      parent = mod(vr - (1 << level) + root, n);
      const std::string mine = std::to_string(bytes) + " bytes from rank " +
                               std::to_string(prev) + " down the broadcast's chain but rank " +
                               std::to_string(parent) + " sent ";
      // At level 0 the parent is `prev`: its notice's step is chunk 0's of several chunks,
      // its whole message's that of a chain of one chunk (a receive of the wrong size then).
      if (c.staging() != nullptr && !(parent == prev && chunks > 1)) {
        auto why = [mine, &notice](const Request&) {
          return "expected " + mine + std::to_string(notice.total) +
                 " through shared memory down the tree: the ranks passed tensors of " +
                 "different sizes";
        };
        noticeWire = c.tripwire(parent, level * tree.stride(), &notice, sizeof(notice), why);
        wires.push_back(noticeWire);
      }
      if (!(parent == prev && chunks == 1)) {
        auto why = [mine](const Request& r) {
          return "expected " + mine + std::to_string(r.receivedBytes()) +
                 " down the tree: the ranks passed tensors of different sizes";
        };
        wires.push_back(c.tripwire(parent, kWholeMessage + level, data, bytes, why));
      }
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
    recvs.insert(recvs.end(), wires.begin(), wires.end());
    c.abandon(recvs);
    // The tree parent staged its message and waits for our credits (receiveFromParent).
    if (noticeWire && Comm::caught(*noticeWire)) refuseStaged(c, parent, bytes);
    throw;
  }
  if (!wires.empty()) c.abandon(wires);  // (abandon() progresses the transport)
}

// Binomial tree towards the root. The root folds each child's message straight into its
// output (chunked through scratch, pipelined) and a leaf sends its input as it is. A rank in
// between must send its children's sum on without writing its input, so it works one chunk
// at a time: copy its own chunk into an accumulator, fold each child's chunk into it, send
// it on. That bounds its extra memory to two chunks (accumulator + receive slot) whatever
// the message size. Chunk k of the message from the child at level l travels with step
// chunkStep(l * chunks, k, chunks) in every case, so the three kinds of rank agree.
void binomialReduce(Comm& c, const uint8_t* in, uint8_t* out, size_t count,
                    const Reduction& red, int root) {
  const int n = c.size();
  const int vr = mod(c.rank() - root, n);
  const size_t esz = red.elementSize;
  const size_t chunk = chunkElems(c, count, esz, kStepSpace / 32);
  const size_t chunks = chunksOf(count, chunk);
  const auto perLevel = static_cast<uint32_t>(chunks);
  // Levels at which this rank has a child, bottom up, and the level at which it sends.
  std::vector<uint32_t> childLevels;
  int parentLevel = -1;
  uint32_t level = 0;
  for (int mask = 1; mask < n; mask <<= 1, ++level) {
    if (vr & mask) {
      parentLevel = static_cast<int>(level);
      break;
    }
    if (vr + mask < n) childLevels.push_back(level);
  }
  auto childOf = [&](uint32_t l) { return mod(vr + (1 << l) + root, n); };
  if (parentLevel < 0) {  // the root
    if (out != in && count > 0) c.copy(out, in, count * esz);
    for (uint32_t l : childLevels) {
      exchangeReduce(c, -1, nullptr, 0, childOf(l), out, count, chunk, l * perLevel, red);
    }
    return;
  }
  const int parent = mod(vr - (1 << parentLevel) + root, n);
  const uint32_t sendStep = static_cast<uint32_t>(parentLevel) * perLevel;
  if (childLevels.empty()) {  // a leaf
    sendChunked(c, parent, in, count, esz, chunk, sendStep);
    return;
  }
  const size_t slotBytes = slotElems(count, chunk) * esz;
  uint8_t* acc = c.scratch(2 * slotBytes);
  uint8_t* slot = acc + slotBytes;
  RequestPtr pending;
  try {
    for (size_t k = 0; k < chunks; ++k) {
      const size_t elems = piece(count, chunk, k);
      if (pending) c.wait({pending});  // the accumulator is free again
      pending = nullptr;
      if (elems) c.copy(acc, in + k * chunk * esz, elems * esz);
      for (uint32_t l : childLevels) {
        pending = c.recv(childOf(l), chunkStep(l * perLevel, k, chunks), slot, elems * esz);
        c.wait({pending});
        pending = nullptr;
        if (elems) c.reduce(red, acc, slot, elems);
      }
      pending = c.send(parent, chunkStep(sendStep, k, chunks), acc, elems * esz);
    }
    if (pending) c.wait({pending});
  } catch (...) {
    if (pending) c.abandon({pending});
    throw;
  }
}

// root-1 <- ... <- root+1 <- root+n-1 ... : the partial sum flows down the chain towards
// the root. A rank receives chunk k of the partial sum into a scratch slot, folds its own
// chunk k into it (every c10d reduction is commutative) and forwards the slot, while chunk
// k+1 arrives in the other slot; its input is never written. The root folds into its output.
void chainReduce(Comm& c, const uint8_t* in, uint8_t* out, size_t count, const Reduction& red,
                 int root) {
  const int n = c.size();
  const int vr = mod(c.rank() - root, n);
  const int upstream = vr < n - 1 ? mod(c.rank() + 1, n) : -1;
  const int downstream = vr > 0 ? mod(c.rank() - 1, n) : -1;
  const size_t esz = red.elementSize;
  const size_t chunk = chunkElems(c, count, esz, kStepSpace);
  const size_t chunks = chunksOf(count, chunk);
  if (upstream < 0) {
    sendChunked(c, downstream, in, count, esz, chunk, 0);
    return;
  }
  if (downstream < 0 && out != in && count > 0) c.copy(out, in, count * esz);
  uint8_t* slots = c.scratch(pairedSlotElems(count, chunk) * esz);
  auto slotOf = [&](size_t k) { return slots + (k % 2) * chunk * esz; };
  auto postRecv = [&](size_t k) {
    return c.recv(upstream, chunkStep(0, k, chunks), slotOf(k), piece(count, chunk, k) * esz);
  };
  RequestPtr next = postRecv(0);
  RequestPtr current;
  RequestPtr sending;  // the forward of chunk k-1, out of the slot chunk k+1 arrives in
  std::vector<RequestPtr> wires;
  try {
    if (wiresForOtherAlgorithm(c, Op::kReduce, count * esz)) {
      // Tripwires for the messages this rank's children in binomialReduce send it when their
      // tensors are small enough for the tree: one chunk each (the tree's chunks are as large
      // as the chain's, and a tree message is at most kReduceBinomialMax), at step
      // kLastChunk + level. The child at level 0 is `upstream`, whose tags the chain shares.
      const Tree tree(n);
      const uint32_t below = vr == 0 ? tree.levels : parentLevel(vr);
      for (uint32_t l = 1; l < below && vr + (1 << l) < n; ++l) {
        const int child = mod(vr + (1 << l) + root, n);
        auto why = [=](const Request&) {
          return "expected " + std::to_string(count * esz) + " bytes from rank " +
                 std::to_string(upstream) + " up the reduce's chain but rank " +
                 std::to_string(child) + " sent its part up the tree, which carries at most " +
                 std::to_string(kReduceBinomialMax) +
                 " bytes: the ranks passed tensors of different sizes";
        };
        wires.push_back(c.tripwire(child, chunkStep(l, 0, 1), nullptr, 0, why));
      }
    }
    for (size_t k = 0; k < chunks; ++k) {
      current = std::move(next);
      next = nullptr;
      if (sending) c.wait({sending});
      sending = nullptr;
      if (k + 1 < chunks) next = postRecv(k + 1);
      c.wait({current});
      current = nullptr;
      const size_t elems = piece(count, chunk, k);
      if (downstream < 0) {
        if (elems) c.reduce(red, out + k * chunk * esz, slotOf(k), elems);
        continue;
      }
      if (elems) c.reduce(red, slotOf(k), in + k * chunk * esz, elems);
      sending = c.send(downstream, chunkStep(0, k, chunks), slotOf(k), elems * esz);
    }
    if (sending) c.wait({sending});
  } catch (...) {
    std::vector<RequestPtr> left = wires;
    for (auto& r : {current, next, sending}) {
      if (r) left.push_back(r);
    }
    c.abandon(left);
    throw;
  }
  if (!wires.empty()) c.abandon(wires);  // (abandon() progresses the transport)
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

void reduce(Comm& comm, const void* in, void* out, size_t count, const Reduction& red,
            int root) {
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = comm.rank() == root ? static_cast<uint8_t*>(out) : nullptr;
  if (comm.size() == 1) {
    if (dst != src && count > 0) comm.copy(dst, src, count * red.elementSize);
    return;
  }
  if (choose(comm.tuning(), Op::kReduce, count * red.elementSize, comm.size()) ==
      Algorithm::kChain) {
    chainReduce(comm, src, dst, count, red, root);
  } else {
    binomialReduce(comm, src, dst, count, red, root);
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
  if (outs[root] != in && bytes > 0) comm.copy(outs[root], in, bytes);
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
  if (ins[root] != out && bytes > 0) comm.copy(out, ins[root], bytes);
  comm.wait(reqs);
}

}  // namespace ucxb::algo
