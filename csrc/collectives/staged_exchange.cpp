#include "csrc/collectives/staged_exchange.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "csrc/collectives/building_blocks.h"

namespace ucxb::algo::detail {

namespace {

struct Notice {
  uint64_t bytes;  // in this piece's slot
  uint64_t total;  // of the whole message: ranks that disagree on it fail, not corrupt
};

uint32_t noticeStep(uint32_t first, size_t k) { return first + static_cast<uint32_t>(2 * k); }
uint32_t creditStep(uint32_t first, size_t k) { return noticeStep(first, k) + 1; }

}  // namespace

void stagedExchange(Comm& c, int to, const uint8_t* src, size_t sendBytes, int from, uint8_t* dst,
                    size_t recvBytes, uint32_t firstStep, const Reduction* red, PieceSize pieces) {
  StagingArea& st = *c.staging();
  if (!st.retiredBecause().empty()) throw OpFailed(st.retiredBecause());
  const size_t esz = red != nullptr ? red->elementSize : 1;
  // Each direction is cut by its own message's length, as the rank at its other end cuts it.
  const size_t sendPiece = st.pieceBytes(esz, pieces, sendBytes);
  const size_t recvPiece = st.pieceBytes(esz, pieces, recvBytes);
  const size_t slots = st.slots();
  const size_t sendPieces = to >= 0 ? chunksOf(sendBytes, sendPiece) : 0;
  const size_t recvPieces = from >= 0 ? chunksOf(recvBytes, recvPiece) : 0;
  std::vector<Notice> sent(sendPieces);
  std::vector<Notice> arrived(slots);
  std::vector<RequestPtr> credits(sendPieces);  // from `to`: slot of piece k free again
  std::vector<RequestPtr> notices(recvPieces);  // from `from`: piece k is in its slot
  std::vector<RequestPtr> small;                // our own notices and credits, in flight
  auto postNotice = [&](size_t k) {
    notices[k] = c.recv(from, noticeStep(firstStep, k), &arrived[k % slots], sizeof(Notice));
  };
  auto pending = [&] {
    std::vector<RequestPtr> all;
    for (const auto* list : {&credits, &notices, &small}) {
      for (const auto& r : *list) {
        if (r && r->pending()) all.push_back(r);
      }
    }
    return all;
  };
  try {
    for (size_t k = 0; k < std::min(slots, recvPieces); ++k) postNotice(k);
    for (size_t k = 0; k < std::max(sendPieces, recvPieces); ++k) {
      if (k < sendPieces) {
        if (k >= slots) c.wait({credits[k - slots]});
        const size_t n = std::min(sendPiece, sendBytes - std::min(sendBytes, k * sendPiece));
        st.fillOwnSlot(k, src + k * sendPiece, n);
        sent[k] = Notice{n, sendBytes};
        small.push_back(c.send(to, noticeStep(firstStep, k), &sent[k], sizeof(Notice)));
        credits[k] = c.recv(to, creditStep(firstStep, k), nullptr, 0);
      }
      if (k < recvPieces) {
        c.wait({notices[k]});
        const Notice got = arrived[k % slots];
        const size_t n = std::min(recvPiece, recvBytes - std::min(recvBytes, k * recvPiece));
        if (got.total != recvBytes || got.bytes != n) {
          throw OpFailed("expected " + std::to_string(recvBytes) + " bytes from rank " +
                         std::to_string(from) + " but it sent " + std::to_string(got.total) +
                         ": the ranks passed tensors of different sizes");
        }
        if (k + slots < recvPieces) postNotice(k + slots);  // after `got` was read
        const uint8_t* in = st.peerSlot(from, k);
        if (red != nullptr) {
          red->fn(dst + k * recvPiece, in, n / red->elementSize);
        } else {
          std::memcpy(dst + k * recvPiece, in, n);
        }
        small.push_back(c.send(from, creditStep(firstStep, k), nullptr, 0));
      }
    }
    c.wait(pending());  // the last credits: our slots are free for the next exchange
  } catch (...) {
    c.abandon(pending());
    // A credit that never arrived (still pending, or failed: a timeout cancels it) means `to`
    // may yet read that slot, even after this op is gone.
    const bool slotsInUse = std::any_of(credits.begin(), credits.end(), [](const RequestPtr& r) {
      return r && (r->pending() || r->failed());
    });
    if (slotsInUse) {
      st.retire("rank " + std::to_string(c.rank()) +
                " stopped using its shared-memory slots after an earlier op failed while rank " +
                std::to_string(to) +
                " could still read them; destroy this process group and create a new one");
    }
    throw;
  }
}

}  // namespace ucxb::algo::detail
