// The send-while-receive exchange of exchangeReduce, through the group's shared-memory slots
// (engine/staging_area.h) instead of the transport's data path; whether a message takes it
// is planStaged's answer (staged_path.h, which explains the layer). Internal to
// csrc/collectives.
//
// Piece k of a message (StagingArea::pieceBytes long, the last one shorter) travels as: the
// sender copies it into its own slot k % slots, then
// sends a 16-byte notice (its length and the message's total) with step firstStep + 2k; the
// receiver folds or copies it straight out of that slot and answers with an empty credit,
// step firstStep + 2k + 1, after which the sender may reuse the slot. The notices and
// credits are ordinary tag messages, so deadlines, peer failures and cancellation behave as
// on the transport path; only the bulk bytes bypass it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "csrc/collectives/algorithms.h"

namespace ucxb::algo::detail {

// Sends `sendBytes` of `src` to `to` while receiving `recvBytes` from `from` into `dst`:
// folded into it with `red`, or copied when `red` is null. Either direction may be absent
// (peer -1). `pieces` and the steps it uses from firstStep are those of planStaged's plan
// for the longer direction (staged_path.h). A sender and receiver that disagree on the
// length fail with OpFailed naming both lengths. An exchange that fails while `to` may still
// read this rank's slots retires them (StagingArea::retire): every later staged exchange of
// the group fails with that reason.
void stagedExchange(Comm& c, int to, const uint8_t* src, size_t sendBytes, int from, uint8_t* dst,
                    size_t recvBytes, uint32_t firstStep, const Reduction* red, PieceSize pieces);

}  // namespace ucxb::algo::detail
