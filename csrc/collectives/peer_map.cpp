// The peer-mapped all_reduce of two ranks (device_peer_map; docs/algorithms.md): each rank maps
// the peer's buffer into its own address space (Transport::exposeMemory, mapPeerMemory: UCX's
// cuda_ipc for CUDA tensors of one node) and moves no bulk bytes through the transport.
//
//   offer    each rank exposes its buffer once the work queued on it has run, and sends the
//            blob (or why it cannot) with the op's size: a notice each way.
//   answer   each rank maps the peer's buffer and says whether it could: a notice each way.
//            Both ranks now hold both answers, so both map or both fall back (kAuto: the
//            caller runs its automatic choice; kOn: the op fails, naming the rank and why).
//   fold     rank r folds half r of the vector in place, own op peer's, reading the peer's
//            half r through the mapping (the peer meanwhile folds the other half of its own
//            buffer, so no byte is read by one rank while the other writes it). The fold has
//            run (OpMemory::reduce returns when it has) before "folded" goes: a notice each way.
//   copy     rank r copies the peer's folded half (1-r) out of the peer's buffer into its own;
//            the copy has run before "done" goes: a notice each way.
//   release  once the peer's "done" is here (the peer has stopped reading this rank's
//            buffer), "released": a notice each way. A rank returns (letting its buffer be
//            reused) only with the peer's "released" in hand, which the peer sent only after
//            this rank's reads had ended while it still held its own buffer: whichever rank
//            gives up part-way (its timeout), the other never returns bytes read after that.
//
// Each half is folded by one rank only and copied to the other, so the ranks end
// bit-identical; the fold takes the lower rank's value first (lowerFirst), as recursive
// doubling's does, so that MIN and MAX of -0 and +0 (and the order of any non-commutative
// bits) come out as every other algorithm's. Device traffic for the pair: each rank reads
// S/2 of its own and S/2 of the peer's and writes S/2 (the fold), then reads S/2 of the
// peer's and writes S/2 (the copy): 5 S in all, against the ring's 7 S and its rendezvous.
#include <algorithm>
#include <cstring>
#include <string>

#include "csrc/collectives/building_blocks.h"
#include "csrc/collectives/staged_exchange.h"

namespace ucxb::algo {

using namespace detail;

namespace {

// Steps of the five notices, just below a staged refusal's (kRefusedStep): the top of the step
// space, which the algorithms a fallback runs reach only with the last chunk of a message of
// 32763+ chunks, and never while a notice of this op is outstanding (both ranks have taken
// both notices of the offer and the answer before either falls back).
constexpr uint32_t kOfferStep = kRefusedStep - 5;
constexpr uint32_t kAnswerStep = kRefusedStep - 4;
constexpr uint32_t kFoldedStep = kRefusedStep - 3;
constexpr uint32_t kDoneStep = kRefusedStep - 2;
constexpr uint32_t kReleasedStep = kRefusedStep - 1;

// What a blob (or a reason) may take in the offer. A packed UCX key for device memory is a
// few hundred bytes (cuda_ipc's handle, plus one short key per other memory domain); a longer
// one is answered as "cannot map" rather than failing the op.
constexpr size_t kOfferBlobMax = 2048;
constexpr size_t kReasonMax = 256;

struct Offer {
  uint64_t bytes = 0;     // the op's vector: ranks that disagree fail
  uint32_t blobBytes = 0;  // of `text` holding the blob; 0: `text` holds why there is none
  uint32_t reasonBytes = 0;
  char text[kOfferBlobMax] = {};
};

struct Answer {
  uint32_t mapped = 0;  // 1: this rank mapped the peer's buffer
  uint32_t reasonBytes = 0;
  char reason[kReasonMax] = {};
};

template <size_t N>
uint32_t putReason(char (&into)[N], const std::string& why) {
  const size_t n = std::min(why.size(), N);
  std::memcpy(into, why.data(), n);
  return static_cast<uint32_t>(n);
}

std::string label(const Comm& c, const Reduction& red, size_t count) {
  return "peer-mapped all_reduce of " + std::to_string(count) + " elements of " +
         std::to_string(red.elementSize) + " bytes on rank " + std::to_string(c.rank());
}

// One notice each way at `step`, waited for (by the op's deadline).
void exchangeNotices(Comm& c, int peer, uint32_t step, const void* mine, void* theirs,
                     size_t bytes) {
  c.wait({c.recvNotice(peer, step, theirs, bytes), c.sendNotice(peer, step, mine, bytes)});
}

// A notice that says only that its step has been reached.
void exchangeFlags(Comm& c, int peer, uint32_t step) {
  const uint8_t mine = 1;
  uint8_t theirs = 0;
  exchangeNotices(c, peer, step, &mine, &theirs, 1);
}

}  // namespace

bool peerMapAllreduce(Comm& c, void* data, size_t count, const Reduction& red) {
  if (c.size() != 2) throw OpFailed("internal: the peer-mapped all_reduce is for two ranks");
  const int me = c.rank();
  const int peer = 1 - me;
  const size_t bytes = count * red.elementSize;
  auto* own = static_cast<uint8_t*>(data);

  // Offer: this rank's buffer, or why not. A transport that fails to expose it is a reason to
  // fall back like any other: the peer must hear of it either way.
  std::string why;
  std::unique_ptr<ExposedMemory> exposed;
  try {
    // An empty vector has nothing to map; the offers still travel, for the size check.
    if (bytes > 0) exposed = c.expose(own, bytes, why);
  } catch (const TransportError& e) {
    why = std::string("exposing the buffer failed: ") + e.what();
  }
  auto mine = std::make_unique<Offer>();
  auto theirs = std::make_unique<Offer>();
  mine->bytes = bytes;
  if (exposed && exposed->blob().size() > kOfferBlobMax) {
    why = "the transport's key for the buffer takes " + std::to_string(exposed->blob().size()) +
          " bytes, more than an offer carries (" + std::to_string(kOfferBlobMax) + ")";
    exposed.reset();
  }
  if (exposed) {
    mine->blobBytes = static_cast<uint32_t>(exposed->blob().size());
    std::memcpy(mine->text, exposed->blob().data(), exposed->blob().size());
  } else {
    mine->reasonBytes = putReason(mine->text, why);
  }
  exchangeNotices(c, peer, kOfferStep, mine.get(), theirs.get(), sizeof(Offer));
  if (theirs->bytes != bytes) {
    throw OpFailed(label(c, red, count) + ": this rank has " + std::to_string(bytes) +
                   " bytes, rank " + std::to_string(peer) + " " + std::to_string(theirs->bytes) +
                   ": the ranks passed tensors of different sizes");
  }
  if (bytes == 0) return true;

  // Answer: whether this rank mapped the peer's buffer.
  std::unique_ptr<PeerMapping> mapping;
  if (theirs->blobBytes > 0 && theirs->blobBytes <= kOfferBlobMax) {
    const std::vector<uint8_t> blob(theirs->text, theirs->text + theirs->blobBytes);
    try {
      mapping = c.mapPeer(peer, blob, bytes, why);
    } catch (const TransportError& e) {
      why = std::string("mapping failed: ") + e.what();
    }
  } else {
    why = "rank " + std::to_string(peer) + " exposed no buffer: " +
          std::string(theirs->text, std::min<size_t>(theirs->reasonBytes, kOfferBlobMax));
  }
  Answer myAnswer;
  Answer theirAnswer;
  myAnswer.mapped = mapping ? 1 : 0;
  if (!mapping) myAnswer.reasonBytes = putReason(myAnswer.reason, why);
  exchangeNotices(c, peer, kAnswerStep, &myAnswer, &theirAnswer, sizeof(Answer));
  if (!mapping || theirAnswer.mapped != 1) {
    if (c.tuning().peerMap != PeerMapMode::kOn) return false;  // both ranks fall back
    const bool here = !mapping;
    const std::string reason =
        here ? why
             : std::string(theirAnswer.reason,
                           std::min<size_t>(theirAnswer.reasonBytes, kReasonMax));
    throw OpFailed(label(c, red, count) + ": device_peer_map=on, but rank " +
                   std::to_string(here ? me : peer) + " could not map rank " +
                   std::to_string(here ? peer : me) + "'s buffer: " + reason);
  }

  // Fold this rank's half, reading the peer's half through the mapping.
  const Blocks b = split(count, 2);
  const auto* peerData = static_cast<const uint8_t*>(mapping->data());
  const size_t esz = red.elementSize;
  c.reduce(lowerFirst(red, me, peer), own + b.offset[me] * esz, peerData + b.offset[me] * esz,
           b.count[me]);
  exchangeFlags(c, peer, kFoldedStep);

  // Copy the peer's folded half out of its buffer.
  c.copy(own + b.offset[peer] * esz, peerData + b.offset[peer] * esz, b.count[peer] * esz);
  exchangeFlags(c, peer, kDoneStep);
  // Released: sent only once the peer's "done" is here, so a rank that gets it knows that the
  // peer still held its buffer when this rank's reads had ended. Without it a rank whose peer
  // gave up (its timeout) while this rank still copied out of the peer's buffer would return
  // what the caller wrote there next: "done" alone orders nothing for the rank that sent it.
  exchangeFlags(c, peer, kReleasedStep);
  return true;
}

}  // namespace ucxb::algo
