#include "csrc/collectives/building_blocks.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "csrc/collectives/staged_exchange.h"

namespace ucxb::algo::detail {

size_t chunkElems(const Tuning& tuning, size_t count, size_t esz, size_t maxChunks) {
  const size_t elems = std::max<size_t>(1, tuning.chunkBytes / esz);
  maxChunks = std::max<size_t>(1, maxChunks);
  const size_t needed = count == 0 ? 0 : (count + maxChunks - 1) / maxChunks;
  return std::max(elems, needed);
}

namespace {

// A ring all-gather receives blocks of this size and up through Comm::recvStreamed: a block of
// half a 32 MiB L3 or more is neither in the cache when it is written nor still there when the
// user reads it, so stores that go around the cache cost least; a smaller one may be read from
// the cache next and goes through recv(). A 64 MB all_reduce's 32 MB all-gather half over TCP
// is received so (docs/performance.md, "The all-gather's copy-out around the cache").
constexpr size_t kStreamedRecvMinBytes = size_t{16} << 20;

bool overlap(const uint8_t* a, size_t aBytes, const uint8_t* b, size_t bBytes) {
  return a != nullptr && b != nullptr && a < b + bBytes && b < a + aBytes;
}

// exchangeReduce where the transport folds each piece into `dst` as it arrives
// (Comm::recvFolded): every receive is posted at once (they hold no buffer), sends stay two
// chunks ahead of the receives, as in the bounce path. False, with nothing posted, where the
// transport cannot fold.
bool exchangeFolded(Comm& c, int to, const uint8_t* src, size_t sendCount, int from,
                    uint8_t* dst, size_t recvCount, size_t chunk, uint32_t firstStep,
                    const Reduction& red) {
  const size_t esz = red.elementSize;
  const size_t sendChunks = to >= 0 ? chunksOf(sendCount, chunk) : 0;
  const size_t recvChunks = chunksOf(recvCount, chunk);
  std::vector<RequestPtr> recvs;
  std::vector<RequestPtr> sends;
  auto postRecv = [&](size_t k) {
    return c.recvFolded(from, chunkStep(firstStep, k, recvChunks), dst + k * chunk * esz,
                        piece(recvCount, chunk, k) * esz, red);
  };
  RequestPtr first = postRecv(0);
  if (!first) return false;
  recvs.push_back(std::move(first));
  auto postSends = [&](size_t upTo) {
    while (sends.size() < std::min(upTo, sendChunks)) {
      const size_t k = sends.size();
      sends.push_back(c.send(to, chunkStep(firstStep, k, sendChunks), src + k * chunk * esz,
                             piece(sendCount, chunk, k) * esz));
    }
  };
  try {
    for (size_t k = 1; k < recvChunks; ++k) {
      recvs.push_back(postRecv(k));
      if (!recvs.back()) {
        throw std::logic_error("exchangeReduce: the transport folded chunk 0 only");
      }
    }
    postSends(2);
    for (size_t k = 0; k < std::max(sendChunks, recvChunks); ++k) {
      std::vector<RequestPtr> reqs;
      if (k < sendChunks) reqs.push_back(sends[k]);
      if (k < recvChunks) reqs.push_back(recvs[k]);
      c.wait(reqs);
      postSends(k + 3);
    }
  } catch (...) {
    std::vector<RequestPtr> left;
    for (const auto* list : {&recvs, &sends}) {
      for (const auto& r : *list) {
        if (r && r->pending()) left.push_back(r);
      }
    }
    c.abandon(left);
    throw;
  }
  return true;
}

}  // namespace

void exchangeReduce(Comm& c, int to, const uint8_t* src, size_t sendCount, int from,
                    uint8_t* dst, size_t recvCount, size_t chunk, uint32_t firstStep,
                    const Reduction& red) {
  const size_t esz = red.elementSize;
  // Folding as the bytes arrive needs the chunks being sent to stay apart from those being
  // folded (a send reads its chunk until it completes).
  if (from >= 0 && recvCount > 0 && !overlap(src, sendCount * esz, dst, recvCount * esz) &&
      exchangeFolded(c, to, src, sendCount, from, dst, recvCount, chunk, firstStep, red)) {
    return;
  }
  const size_t sendChunks = to >= 0 ? chunksOf(sendCount, chunk) : 0;
  const size_t recvChunks = from >= 0 ? chunksOf(recvCount, chunk) : 0;
  uint8_t* slots = recvChunks > 0 ? c.scratch(pairedSlotElems(recvCount, chunk) * esz) : nullptr;
  auto postRecv = [&](size_t k) {
    return c.recv(from, chunkStep(firstStep, k, recvChunks), slots + (k % 2) * chunk * esz,
                  piece(recvCount, chunk, k) * esz);
  };
  auto postSend = [&](size_t k) {
    return c.send(to, chunkStep(firstStep, k, sendChunks), src + k * chunk * esz,
                  piece(sendCount, chunk, k) * esz);
  };
  // One receive and one send stay posted ahead of the chunk being folded, so the peer can
  // move chunk k+1 while this rank reduces chunk k.
  RequestPtr next = recvChunks > 0 ? postRecv(0) : nullptr;
  RequestPtr nextSend = sendChunks > 0 ? postSend(0) : nullptr;
  RequestPtr current;
  RequestPtr currentSend;
  try {
    for (size_t k = 0; k < std::max(sendChunks, recvChunks); ++k) {
      std::vector<RequestPtr> reqs;
      current = std::move(next);
      currentSend = std::move(nextSend);
      next = nullptr;
      nextSend = nullptr;
      if (k + 1 < recvChunks) next = postRecv(k + 1);  // its slot held chunk k-1, now folded
      // A send of chunk k+1 reads src; when src is dst, chunk k+1 is folded only later.
      if (k + 1 < sendChunks) nextSend = postSend(k + 1);
      if (currentSend) reqs.push_back(currentSend);
      if (current) reqs.push_back(current);
      c.wait(reqs);
      currentSend = nullptr;
      if (current) {
        c.reduce(red, dst + k * chunk * esz, slots + (k % 2) * chunk * esz, piece(recvCount, chunk, k));
      }
    }
  } catch (...) {
    std::vector<RequestPtr> left;
    for (auto& r : {current, next, currentSend, nextSend}) {
      if (r) left.push_back(r);
    }
    c.abandon(left);
    throw;
  }
}

void sendChunked(Comm& c, int to, const uint8_t* data, size_t count, size_t esz, size_t chunk,
                 uint32_t firstStep) {
  const size_t chunks = chunksOf(count, chunk);
  std::vector<RequestPtr> reqs;
  reqs.reserve(chunks);
  for (size_t k = 0; k < chunks; ++k) {
    reqs.push_back(c.send(to, chunkStep(firstStep, k, chunks), data + k * chunk * esz,
                          piece(count, chunk, k) * esz));
  }
  c.wait(reqs);
}

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

Pow2Fold::Pow2Fold(int rank, int n) {
  while (pof2 * 2 <= n) pof2 *= 2;
  rem = n - pof2;
  if (rank < 2 * rem) {
    participant = rank % 2 == 1 ? rank / 2 : -1;
  } else {
    participant = rank - rem;
  }
}

int Pow2Fold::foldPartner(int rank) const {
  if (rank >= 2 * rem) return -1;
  return rank % 2 == 0 ? rank + 1 : rank - 1;
}

int Pow2Fold::levels() const {
  int l = 0;
  while ((1 << l) < pof2) ++l;
  return l;
}

}  // namespace ucxb::algo::detail

namespace ucxb::algo::detail {

void ringAllgather(Comm& c, const std::vector<uint8_t*>& blocks, const std::vector<size_t>& bytes,
                   uint32_t firstStep) {
  const int n = c.size();
  const int r = c.rank();
  const size_t largest = *std::max_element(bytes.begin(), bytes.end());
  const StepBudget budget{.exchanges = static_cast<size_t>(n - 1),
                          .steps = kStepSpace - std::min<size_t>(firstStep, kStepSpace)};
  if (const auto plan = c.staged(StagedTraffic::kRing, largest, 1, budget)) {
    const uint32_t perStep = plan->stepsPerExchange;
    for (int s = 0; s < n - 1; ++s) {
      const int sendBlock = mod(r - s, n);
      const int recvBlock = mod(r - s - 1, n);
      stagedExchange(c, mod(r + 1, n), blocks[sendBlock], bytes[sendBlock], mod(r - 1, n),
                     blocks[recvBlock], bytes[recvBlock], firstStep + s * perStep, nullptr,
                     plan->pieces);
    }
    return;
  }
  for (int s = 0; s < n - 1; ++s) {
    const int sendBlock = mod(r - s, n);
    const int recvBlock = mod(r - s - 1, n);
    RequestPtr rq = bytes[recvBlock] >= kStreamedRecvMinBytes
                        ? c.recvStreamed(mod(r - 1, n), firstStep + s, blocks[recvBlock],
                                         bytes[recvBlock])
                        : nullptr;
    if (!rq) rq = c.recv(mod(r - 1, n), firstStep + s, blocks[recvBlock], bytes[recvBlock]);
    auto sq = c.send(mod(r + 1, n), firstStep + s, blocks[sendBlock], bytes[sendBlock]);
    c.wait({rq, sq});
  }
}

uint32_t foldIn(Comm& c, const Pow2Fold& fold, uint8_t* data, size_t count, size_t chunk,
                const Reduction& red) {
  const int partner = fold.foldPartner(c.rank());
  if (partner >= 0) {
    if (fold.folded()) {
      sendChunked(c, partner, data, count, red.elementSize, chunk, 0);
    } else {
      exchangeReduce(c, -1, nullptr, 0, partner, data, count, chunk, 0, red);
    }
  }
  return static_cast<uint32_t>(chunksOf(count, chunk));
}

uint32_t halvingReduceScatter(Comm& c, const Pow2Fold& fold, uint8_t* data,
                              const std::vector<size_t>& bound, size_t chunk, uint32_t firstStep,
                              const Reduction& red) {
  const size_t esz = red.elementSize;
  const int me = fold.participant;
  const auto perLevel = static_cast<uint32_t>(chunksOf(bound[fold.pof2] - bound[0], chunk));
  int lo = 0;
  int hi = fold.pof2;
  uint32_t step = firstStep;
  for (int mask = fold.pof2 / 2; mask >= 1; mask /= 2, step += perLevel) {
    const int mid = lo + mask;
    const int peer = fold.oldRank(me ^ mask);
    const bool lower = me < mid;
    const int keepLo = lower ? lo : mid, keepHi = lower ? mid : hi;
    const int sendLo = lower ? mid : lo, sendHi = lower ? hi : mid;
    exchangeReduce(c, peer, data + bound[sendLo] * esz, bound[sendHi] - bound[sendLo], peer,
                   data + bound[keepLo] * esz, bound[keepHi] - bound[keepLo], chunk, step, red);
    lo = keepLo;
    hi = keepHi;
  }
  return step - firstStep;
}

void doublingAllgather(Comm& c, const Pow2Fold& fold, uint8_t* data,
                       const std::vector<size_t>& bound, size_t esz, uint32_t firstStep) {
  const int me = fold.participant;
  uint32_t step = firstStep;
  for (int mask = 1; mask < fold.pof2; mask *= 2, ++step) {
    const int partner = me ^ mask;
    const int mine = me & ~(mask - 1);     // first participant whose range this rank holds
    const int theirs = partner & ~(mask - 1);
    const int peer = fold.oldRank(partner);
    auto rq = c.recv(peer, step, data + bound[theirs] * esz,
                     (bound[theirs + mask] - bound[theirs]) * esz);
    auto sq = c.send(peer, step, data + bound[mine] * esz,
                     (bound[mine + mask] - bound[mine]) * esz);
    c.wait({rq, sq});
  }
}

}  // namespace ucxb::algo::detail
