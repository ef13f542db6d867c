// Shared-memory staging, the layer as a whole: a second data plane beside the transport that
// the algorithms reach only through Comm. It answers two questions, each in one place:
//
//   Does a group stage at all?  Once, when the group is created (csrc/staging_setup.cpp):
//     only when every rank wants it (shared_memory "auto" and a transport that permits it,
//     Transport::permitsSharedMemory), all run on one host and each could map every peer's
//     segment. The answer is the group's StagingArea (engine/staging_area.h), or none.
//   Does this message stage?  Once per exchange, here: planStaged (asked as Comm::staged)
//     weighs the kind of traffic, the message's length and the tag steps the algorithm can
//     give it, and returns the plan or nothing. The algorithm then runs stagedExchange
//     (staged_exchange.h) with the plan, or its own transport path; both ends of a message
//     decide alike, since they know the same lengths and the same budget.
//
// The algorithms keep both paths only where the data moves differently; the thresholds and
// the step arithmetic of the staged path live here. Torch-free and UCX-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "csrc/engine/staging_area.h"

namespace ucxb {

// What an algorithm stages; it fixes how messages are cut (PieceSize) and from which length
// staging pays.
enum class StagedTraffic {
  // A ring step (all_reduce's reduce-scatter, the ring all-gather): every rank sends and
  // receives at once. Cache-sized pieces; stages whatever the size.
  kRing,
  // One message each way between two ranks (all_to_all). Cache-sized pieces; from
  // algo::kStagedMessageMin, below which one transport message beats a notice and a credit
  // per piece.
  kPair,
  // Parent to child (the binomial broadcast). Pieces scaled to the message; from
  // algo::kStagedMessageMin.
  kOneWay,
};

// The tag steps an algorithm has for its staged exchanges: `exchanges` of them, one after
// another, each of a message no longer than the one planned, within `steps`.
struct StepBudget {
  size_t exchanges = 1;
  size_t steps = 0;
};

// How a message stages: hand `pieces` to stagedExchange, and give each exchange
// `stepsPerExchange` tag steps (its notices and credits, two per piece).
struct StagedPlan {
  PieceSize pieces;
  uint32_t stepsPerExchange;
};

// The plan for `traffic` messages of `bytes` (of `elementSize`-byte elements; 1 when the
// exchange only copies) through `staging`, or nothing when they travel through the
// transport: the group has no staging, the message is below its traffic's floor, or
// `budget.exchanges` exchanges would not fit `budget.steps`. For kRing and kPair the plan
// also holds for every shorter message; kOneWay pieces grow with the message, so plan each
// message by its own length.
std::optional<StagedPlan> planStaged(const StagingArea* staging, StagedTraffic traffic,
                                     size_t bytes, size_t elementSize, StepBudget budget);

}  // namespace ucxb
