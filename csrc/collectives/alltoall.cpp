// all_to_all: linear (post everything at once; few, small messages) and pairwise exchange
// (one partner per step, so no rank is flooded and each step has one message in flight each
// way); in both, blocks from kStagedMessageMin go through the group's shared-memory slots
// when it has them. Barrier: dissemination.
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "csrc/collectives/building_blocks.h"
#include "csrc/collectives/staged_exchange.h"

namespace ucxb::algo {

using namespace detail;

namespace {

// How a message of `bytes` travels through the group's shared-memory slots, if it does.
// Sender and receiver both know the length of the message between them, so they decide
// alike, even for an uneven all_to_all whose ranks chose different algorithms (each chooses
// by its own largest block).
std::optional<StagedPlan> stagedMessage(const Comm& c, size_t bytes) {
  return c.staged(StagedTraffic::kPair, bytes, 1, {.exchanges = 1, .steps = kStepSpace});
}

// The op's per-peer blocks (index = peer rank).
struct Buffers {
  const std::vector<const void*>& sends;
  const std::vector<size_t>& sendBytes;
  const std::vector<void*>& recvs;
  const std::vector<size_t>& recvBytes;
};

// Posts the messages of pairwise step i (send to r+i, receive from r-i) that go through UCX.
void postUnstaged(Comm& c, const Buffers& b, int i, std::vector<RequestPtr>& reqs) {
  const int n = c.size();
  const int to = mod(c.rank() + i, n);
  const int from = mod(c.rank() - i, n);
  if (!stagedMessage(c, b.recvBytes[from])) {
    reqs.push_back(c.recv(from, kWholeMessage, b.recvs[from], b.recvBytes[from]));
  }
  if (!stagedMessage(c, b.sendBytes[to])) {
    reqs.push_back(c.send(to, kWholeMessage, b.sends[to], b.sendBytes[to]));
  }
}

// The staged messages of step i, both directions interleaved piece by piece. Every rank runs
// these in step order, whichever algorithm it chose: a ring of waits, never a cycle. Tag
// step 0 for every step: the source rank keeps them apart (notices and credits from one peer
// differ in parity).
void exchangeStaged(Comm& c, const Buffers& b, int i, std::vector<RequestPtr>& reqs) {
  const int n = c.size();
  const int to = mod(c.rank() + i, n);
  const int from = mod(c.rank() - i, n);
  const auto out = stagedMessage(c, b.sendBytes[to]);
  const auto in = stagedMessage(c, b.recvBytes[from]);
  if (!out && !in) return;
  try {
    stagedExchange(c, out ? to : -1, static_cast<const uint8_t*>(b.sends[to]), b.sendBytes[to],
                   in ? from : -1, static_cast<uint8_t*>(b.recvs[from]), b.recvBytes[from], 0,
                   nullptr, (out ? out : in)->pieces);
  } catch (...) {
    c.abandon(reqs);
    throw;
  }
}

// Everything through UCX posted at once (rotated, so that not every rank starts with rank 0).
void linear(Comm& c, const Buffers& b) {
  std::vector<RequestPtr> reqs;
  for (int i = 1; i < c.size(); ++i) postUnstaged(c, b, i, reqs);
  for (int i = 1; i < c.size(); ++i) exchangeStaged(c, b, i, reqs);
  c.wait(reqs);
}

// Tripwires (Comm::tripwire) for the whole block of every peer from which this rank expects a
// staged one: a peer whose block is below the staging threshold sends it whole, with
// another tag, and waits for a whole block from this rank, which stages it. Each side would
// wait out the timeout (until 2026-11-27); the wire fails this rank at once, naming both
// paths, and its failure notice (engine/failure_notice.h) fails the others. A staged block
// is 64 KiB or more (kStagedMessageMin), where one receive posted and cancelled per peer
// does not show.
std::vector<RequestPtr> wholeBlockWires(Comm& c, const Buffers& b) {
  std::vector<RequestPtr> wires;
  for (int i = 1; i < c.size(); ++i) {
    const int from = mod(c.rank() - i, c.size());
    if (!stagedMessage(c, b.recvBytes[from])) continue;
    const std::string mine = std::to_string(b.recvBytes[from]) + " bytes from rank " +
                             std::to_string(from);
    wires.push_back(c.tripwire(from, kWholeMessage, nullptr, 0, [mine](const Request&) {
      return "expected " + mine + " through shared memory but it sent its block whole " +
             "through the transport: the ranks passed tensors of different sizes";
    }));
  }
  return wires;
}

// One partner each way per step.
void pairwise(Comm& c, const Buffers& b) {
  for (int i = 1; i < c.size(); ++i) {
    std::vector<RequestPtr> reqs;
    postUnstaged(c, b, i, reqs);
    exchangeStaged(c, b, i, reqs);
    c.wait(reqs);
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
  const Buffers blocks{sends, sendBytes, recvs, recvBytes};
  const std::vector<RequestPtr> wires = wholeBlockWires(comm, blocks);
  try {
    if (choose(comm.tuning(), Op::kAlltoall, largest, comm.size()) == Algorithm::kLinear) {
      linear(comm, blocks);
    } else {
      pairwise(comm, blocks);
    }
  } catch (...) {
    comm.abandon(wires);
    throw;
  }
  comm.abandon(wires);
  if (sendBytes[r] > 0) comm.copy(recvs[r], sends[r], sendBytes[r]);
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
