// all_reduce: ring (bandwidth), recursive doubling (latency), Rabenseifner (in between).
// Every element is reduced in the same order on every rank, so all ranks end bit-identical.
#include <algorithm>

#include "csrc/collectives/building_blocks.h"
#include "csrc/collectives/staged_exchange.h"

namespace ucxb::algo {

using namespace detail;

namespace {

// After size()-1 steps, block rank() of `data` holds the reduction of every rank's block.
// Step s: send block (r-s-1), receive block (r-s-2) from the left and fold it in, chunked.
// Returns the number of tag steps used.
uint32_t ringReduceScatterInPlace(Comm& c, uint8_t* data, const Blocks& b, const Reduction& red) {
  const int n = c.size();
  const int r = c.rank();
  const size_t esz = red.elementSize;
  // Through shared memory when the group has it and both ring phases (this one and the
  // all-gather that follows) fit the step space.
  if (const auto plan = c.staged(StagedTraffic::kRing, b.largest * esz, esz,
                                 {.exchanges = 2 * static_cast<size_t>(n - 1),
                                  .steps = kStepSpace})) {
    const uint32_t perStep = plan->stepsPerExchange;
    for (int s = 0; s < n - 1; ++s) {
      const int sendBlock = mod(r - s - 1, n);
      const int recvBlock = mod(r - s - 2, n);
      stagedExchange(c, mod(r + 1, n), data + b.offset[sendBlock] * esz, b.count[sendBlock] * esz,
                     mod(r - 1, n), data + b.offset[recvBlock] * esz, b.count[recvBlock] * esz,
                     static_cast<uint32_t>(s) * perStep, &red, plan->pieces);
    }
    return static_cast<uint32_t>(n - 1) * perStep;
  }
  // Every rank derives the same chunking from the largest block; the all-gather that
  // follows needs n-1 more steps.
  const size_t perStep = (kStepSpace - std::min<size_t>(kStepSpace, n)) / std::max(1, n - 1);
  const size_t chunk = chunkElems(c, b.largest, esz, perStep);
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

void ring(Comm& c, uint8_t* data, size_t count, const Reduction& red) {
  const int n = c.size();
  const Blocks b = split(count, n);
  const size_t esz = red.elementSize;
  // Two ranks that stage run both phases as one pass (stagedPairAllreduce): the same
  // blocks, pieces and fold order as the two phases below, one read of each byte less.
  if (n == 2) {
    const auto plan = c.staged(StagedTraffic::kRing, b.largest * esz, esz,
                               {.exchanges = 2, .steps = kStepSpace});
    if (plan && pairFusedFits(*c.staging())) {
      const int r = c.rank();
      stagedPairAllreduce(c, data, b.offset[r] * esz, b.count[r] * esz, b.offset[1 - r] * esz,
                          b.count[1 - r] * esz, 0, red, plan->pieces);
      return;
    }
  }
  const uint32_t used = ringReduceScatterInPlace(c, data, b, red);
  std::vector<uint8_t*> blocks;
  std::vector<size_t> bytes;
  for (int i = 0; i < n; ++i) {
    blocks.push_back(data + b.offset[i] * red.elementSize);
    bytes.push_back(b.count[i] * red.elementSize);
  }
  ringAllgather(c, blocks, bytes, used);
}

// The odd rank of a folded pair hands the result back to its even partner.
void foldOut(Comm& c, const Pow2Fold& f, uint8_t* data, size_t bytes, uint32_t step) {
  const int partner = f.foldPartner(c.rank());
  if (partner < 0) return;
  if (f.folded()) {
    c.wait({c.recv(partner, step, data, bytes)});
  } else {
    c.wait({c.send(partner, step, data, bytes)});
  }
}

// Recursive doubling's schedule, the one source of which peer a rank meets at which tag step:
// recursiveDoubling() runs it chunked, PostedRecursiveDoubling in one chunk, so that both send
// the same messages. A non-power-of-two group folds first (Pow2Fold: the fold's first phase
// takes steps from kFoldInStep), then each participant exchanges its whole vector with the
// participant at distance 2^k (level k, log2(pof2) levels), then the fold's last phase hands the
// result back, unchunked, at foldOutStep().
struct DoublingSchedule {
  DoublingSchedule(const Tuning& tuning, int rank, int size, size_t count, size_t elementSize)
      : fold(rank, size),
        foldPartner(fold.foldPartner(rank)),
        chunk(chunkElems(tuning, count, elementSize,
                         kStepSpace / static_cast<size_t>(fold.levels() + 2))),
        perPhase(static_cast<uint32_t>(chunksOf(count, chunk))) {}

  // foldIn() sends the fold's first phase from step 0.
  static constexpr uint32_t kFoldInStep = 0;

  int levelPeer(int level) const { return fold.oldRank(fold.participant ^ (1 << level)); }
  // The first step of level `level` (the fold's first phase comes before level 0).
  uint32_t levelStep(int level) const { return perPhase * static_cast<uint32_t>(level + 1); }
  uint32_t foldOutStep() const { return levelStep(fold.levels()); }

  Pow2Fold fold;
  int foldPartner;    // the rank this one folds with; -1 outside the first 2*rem
  size_t chunk;       // elements per chunk
  uint32_t perPhase;  // tag steps of each phase: chunks of the vector
};

// log2(n) rounds; each exchanges the whole vector with the partner at distance 2^k. Both
// partners fold in one order (lowerFirst), so that they end each round with the same bits.
void recursiveDoubling(Comm& c, uint8_t* data, size_t count, const Reduction& red) {
  const DoublingSchedule s(c.tuning(), c.rank(), c.size(), count, red.elementSize);
  foldIn(c, s.fold, data, count, s.chunk, red);
  if (!s.fold.folded()) {
    for (int level = 0; level < s.fold.levels(); ++level) {
      const int peer = s.levelPeer(level);
      exchangeReduce(c, peer, data, count, peer, data, count, s.chunk, s.levelStep(level),
                     lowerFirst(red, c.rank(), peer));
    }
  }
  foldOut(c, s.fold, data, count * red.elementSize, s.foldOutStep());
}

// Recursive-halving reduce-scatter then recursive-doubling all-gather: log steps like
// recursive doubling, but each rank sends about 2x the vector instead of log2(n)x.
void rabenseifner(Comm& c, uint8_t* data, size_t count, const Reduction& red) {
  const Pow2Fold f(c.rank(), c.size());
  const int levels = f.levels();
  const size_t chunk =
      chunkElems(c, count, red.elementSize, kStepSpace / static_cast<size_t>(levels + 2));
  const uint32_t perPhase = foldIn(c, f, data, count, chunk, red);
  const uint32_t doublingStep = perPhase * static_cast<uint32_t>(levels + 1);
  if (!f.folded()) {
    const Blocks b = split(count, f.pof2);
    std::vector<size_t> bound(b.offset);
    bound.push_back(count);
    halvingReduceScatter(c, f, data, bound, chunk, perPhase, red);
    doublingAllgather(c, f, data, bound, red.elementSize, doublingStep);
  }
  foldOut(c, f, data, count * red.elementSize, doublingStep + static_cast<uint32_t>(levels));
}

}  // namespace

void PostedOp::finish(Comm& comm) {
  for (;;) {
    comm.wait(requests_);
    if (advance(comm)) return;
  }
}

namespace {

// What a 2-rank op that folds the peer's vector into its own folds with (lowerFirst).
Reduction foldOrder(const Comm& comm, Reduction red) {
  return lowerFirst(red, comm.rank(), 1 - comm.rank());
}

// Recursive doubling in one chunk (small messages), any group size: DoublingSchedule's messages
// for a vector that fits one chunk, so that a rank that drives it on the caller's thread and a
// rank that runs it (or recursiveDoubling()) on its progress thread meet. Each wait is one part:
// the fold's first phase (a folded rank sends its vector; its partner receives it into scratch
// and folds it in), one exchange per level (received into scratch, folded in with lowerFirst),
// and the fold's last phase (the partner sends the result back; the folded rank receives it in
// place).
class PostedRecursiveDoubling : public PostedOp {
 public:
  static bool applies(const Tuning& tuning, size_t count, size_t elementSize, int worldSize) {
    if (worldSize < 2 || choose(tuning, Op::kAllreduce, count * elementSize, worldSize) !=
                             Algorithm::kRecursiveDoubling) {
      return false;
    }
    return DoublingSchedule(tuning, 0, worldSize, count, elementSize).perPhase == 1;
  }

  PostedRecursiveDoubling(Comm& comm, void* data, size_t count, const Reduction& red)
      : data_(static_cast<uint8_t*>(data)),
        count_(count),
        bytes_(count * red.elementSize),
        red_(red),
        schedule_(comm.tuning(), comm.rank(), comm.size(), count, red.elementSize) {
    requests_.reserve(2);  // a level's exchange at once, not grown one at a time
    const int partner = schedule_.foldPartner;
    const uint32_t step = chunkStep(DoublingSchedule::kFoldInStep, 0, 1);
    if (partner >= 0 && schedule_.fold.folded()) {
      requests_.push_back(comm.send(partner, step, data_, bytes_));
      return;
    }
    peerData_ = comm.scratch(bytes_);
    if (partner >= 0) {
      requests_.push_back(comm.recv(partner, step, peerData_, bytes_));
      return;
    }
    postLevel(comm);
  }

  bool advance(Comm& comm) override {
    requests_.clear();
    switch (stage_) {
      case Stage::kFoldIn:
        if (schedule_.fold.folded()) {
          // Sent: the result comes back in place (unchunked).
          requests_.push_back(
              comm.recv(schedule_.foldPartner, schedule_.foldOutStep(), data_, bytes_));
          stage_ = Stage::kFoldOut;
          return false;
        }
        comm.reduce(red_, data_, peerData_, count_);
        postLevel(comm);
        return false;
      case Stage::kLevels:
        comm.reduce(lowerFirst(red_, comm.rank(), schedule_.levelPeer(level_)), data_, peerData_,
                    count_);
        ++level_;
        if (level_ < schedule_.fold.levels()) {
          postLevel(comm);
          return false;
        }
        if (schedule_.foldPartner < 0) return true;
        requests_.push_back(
            comm.send(schedule_.foldPartner, schedule_.foldOutStep(), data_, bytes_));
        stage_ = Stage::kFoldOut;
        return false;
      case Stage::kFoldOut:
        return true;
    }
    return true;
  }

 private:
  enum class Stage { kFoldIn, kLevels, kFoldOut };

  void postLevel(Comm& comm) {
    stage_ = Stage::kLevels;
    const int peer = schedule_.levelPeer(level_);
    const uint32_t step = chunkStep(schedule_.levelStep(level_), 0, 1);
    requests_.push_back(comm.recv(peer, step, peerData_, bytes_));
    requests_.push_back(comm.send(peer, step, data_, bytes_));
  }

  uint8_t* data_;
  size_t count_;
  size_t bytes_;
  Reduction red_;
  DoublingSchedule schedule_;
  uint8_t* peerData_ = nullptr;
  int level_ = 0;  // the exchange of this level is next
  Stage stage_ = Stage::kFoldIn;
};

// Where the ring would run at two ranks in a group that stages: each rank copies its whole vector
// into its own slots and folds the peer's straight out of the peer's slots. The ring
// (stagedPairAllreduce at two ranks) moves the same bytes between the cores but waits for its peer
// at every piece and cannot be split where it waits; this waits once (and may run on the caller's
// thread), and each rank folds the whole vector (a + b on one rank, b + a on the other: IEEE
// addition and multiplication are commutative, and foldOrder makes min and max so, so both ranks
// end bit-identical but for which of two NaNs comes out). From kAllreducePairSlotsMin it also takes
// the place of recursive doubling's one transport message, for a vector that fits a pair slot: that
// exchange waits for the peer once, as the transport message does, and copies each byte across the
// cores once (staged_exchange.h).
class PostedStagedAllreduce : public PostedOp {
 public:
  static constexpr PieceSize kPieces = PieceSize::kCacheSized;

  static bool applies(const Tuning& tuning, size_t count, size_t elementSize, int worldSize,
                      const StagingArea* staging) {
    const size_t bytes = count * elementSize;
    if (worldSize != 2 || staging == nullptr ||
        tuning.forced[static_cast<size_t>(Op::kAllreduce)] != Algorithm::kAuto) {
      return false;
    }
    if (bytes >= kAllreducePairSlotsMin && staging->pairFits(bytes)) return true;
    return choose(tuning, Op::kAllreduce, bytes, worldSize) == Algorithm::kRing &&
           PostedStagedExchange::fits(*staging, bytes, elementSize, kPieces);
  }

  PostedStagedAllreduce(Comm& comm, void* data, size_t count, const Reduction& red)
      : data_(static_cast<uint8_t*>(data)),
        red_(foldOrder(comm, red)),
        exchange_(comm, 1 - comm.rank(), data_, count * red.elementSize, red.elementSize, 0,
                  kPieces) {
    requests_ = exchange_.notices();
  }

  bool advance(Comm& comm) override {
    if (consumed_) return true;  // the peer's credits (if any) and our own sends have completed
    requests_ = exchange_.consume(comm, data_, &red_);
    consumed_ = true;
    return false;
  }

 private:
  uint8_t* data_;
  Reduction red_;
  PostedStagedExchange exchange_;
  bool consumed_ = false;
};

}  // namespace

bool allreducePostable(const Tuning& tuning, size_t count, size_t elementSize, int worldSize,
                       const StagingArea* staging) {
  return PostedRecursiveDoubling::applies(tuning, count, elementSize, worldSize) ||
         PostedStagedAllreduce::applies(tuning, count, elementSize, worldSize, staging);
}

std::unique_ptr<PostedOp> postAllreduce(Comm& comm, void* data, size_t count,
                                        const Reduction& red) {
  // Staged first: from kAllreducePairSlotsMin both apply, and the pair slot wins.
  if (PostedStagedAllreduce::applies(comm.tuning(), count, red.elementSize, comm.size(),
                                     comm.staging())) {
    return std::make_unique<PostedStagedAllreduce>(comm, data, count, red);
  }
  if (PostedRecursiveDoubling::applies(comm.tuning(), count, red.elementSize, comm.size())) {
    return std::make_unique<PostedRecursiveDoubling>(comm, data, count, red);
  }
  throw OpFailed("internal: postAllreduce called for an all_reduce that is not postable");
}

void allreduce(Comm& comm, void* data, size_t count, const Reduction& red) {
  if (comm.size() == 1) return;
  if (peerMapApplies(comm.tuning(), count * red.elementSize, comm.size(),
                     /*deviceMemory=*/!comm.onHost()) &&
      peerMapAllreduce(comm, data, count, red)) {
    return;
  }
  if (allreducePostable(comm.tuning(), count, red.elementSize, comm.size(), comm.staging())) {
    postAllreduce(comm, data, count, red)->finish(comm);
    return;
  }
  auto* bytes = static_cast<uint8_t*>(data);
  switch (choose(comm.tuning(), Op::kAllreduce, count * red.elementSize, comm.size(),
                 /*deviceMemory=*/!comm.onHost())) {
    case Algorithm::kRecursiveDoubling:
      recursiveDoubling(comm, bytes, count, red);
      return;
    case Algorithm::kRabenseifner:
      rabenseifner(comm, bytes, count, red);
      return;
    default:
      ring(comm, bytes, count, red);
      return;
  }
}

}  // namespace ucxb::algo
