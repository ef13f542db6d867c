#include "csrc/collectives/staged_path.h"

#include "csrc/collectives/building_blocks.h"
#include "csrc/collectives/selection.h"

namespace ucxb {

namespace {

PieceSize piecesFor(StagedTraffic traffic) {
  return traffic == StagedTraffic::kOneWay ? PieceSize::kScaledToMessage
                                           : PieceSize::kCacheSized;
}

size_t floorFor(StagedTraffic traffic) {
  return traffic == StagedTraffic::kRing ? 0 : algo::kStagedMessageMin;
}

}  // namespace

std::optional<StagedPlan> planStaged(const StagingArea* staging, StagedTraffic traffic,
                                     size_t bytes, size_t elementSize, StepBudget budget) {
  if (staging == nullptr || bytes < floorFor(traffic)) return std::nullopt;
  const PieceSize pieces = piecesFor(traffic);
  // A notice and a credit per piece (staged_exchange.h).
  const size_t steps =
      2 * algo::detail::chunksOf(bytes, staging->pieceBytes(elementSize, pieces, bytes));
  if (budget.exchanges * steps > budget.steps) return std::nullopt;
  return StagedPlan{pieces, static_cast<uint32_t>(steps)};
}

}  // namespace ucxb
