// csrc/collectives/staged_path.h on its own: the one place that decides whether a message
// goes through the group's shared-memory slots, at the edges of each rule: no staging area,
// the kStagedMessageMin floor (one element either side), and the tag-step budget (one
// element either side). Built and run by tests/test_shared_memory.py.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "csrc/collectives/selection.h"
#include "csrc/collectives/staged_path.h"
#include "tests/cpp/check.h"

using ucxb::PieceSize;
using ucxb::planStaged;
using ucxb::StagedTraffic;
using ucxb::StagingArea;
using ucxb::StagingLayout;
using ucxb::StepBudget;
using ucxb::algo::kStagedMessageMin;

namespace {

// The planner reads only the layout, so the slots need no segment behind them.
StagingArea areaWithSlots(size_t slotBytes) {
  StagingLayout layout;
  layout.slotBytes = slotBytes;
  return StagingArea(layout, {}, std::vector<ucxb::shm::SharedSegment>(2));
}

constexpr StepBudget kWholeStepSpace{.exchanges = 1, .steps = size_t{1} << 15};

void noStaging() {
  CHECK(!planStaged(nullptr, StagedTraffic::kRing, 1 << 20, 8, kWholeStepSpace));
  CHECK(!planStaged(nullptr, StagedTraffic::kPair, 1 << 20, 1, kWholeStepSpace));
  CHECK(!planStaged(nullptr, StagedTraffic::kOneWay, 1 << 20, 1, kWholeStepSpace));
}

// all_to_all and the broadcast stage from kStagedMessageMin; the rings at any size.
void floorOneElementEitherSide() {
  const StagingArea area = areaWithSlots(StagingLayout::kMaxSlotBytes);
  for (const size_t esz : {size_t{1}, size_t{8}}) {
    for (const StagedTraffic t : {StagedTraffic::kPair, StagedTraffic::kOneWay}) {
      CHECK(!planStaged(&area, t, kStagedMessageMin - esz, esz, kWholeStepSpace));
      CHECK(planStaged(&area, t, kStagedMessageMin, esz, kWholeStepSpace));
      CHECK(planStaged(&area, t, kStagedMessageMin + esz, esz, kWholeStepSpace));
    }
    CHECK(planStaged(&area, StagedTraffic::kRing, kStagedMessageMin - esz, esz, kWholeStepSpace));
    CHECK(planStaged(&area, StagedTraffic::kRing, esz, esz, kWholeStepSpace));
  }
  // A 0-byte ring block still sends a notice and takes its credit.
  const auto empty = planStaged(&area, StagedTraffic::kRing, 0, 1, kWholeStepSpace);
  CHECK(empty && empty->stepsPerExchange == 2);
}

// Two steps (a notice and a credit) per piece, pieces cut by the traffic.
void piecesAndSteps() {
  const StagingArea area = areaWithSlots(StagingLayout::kMaxSlotBytes);
  const size_t sixteenMiB = size_t{16} << 20;
  const auto pair = planStaged(&area, StagedTraffic::kPair, sixteenMiB, 1, kWholeStepSpace);
  CHECK(pair && pair->pieces == PieceSize::kCacheSized);
  CHECK(pair && pair->stepsPerExchange == 2 * 64);  // 256 KiB pieces
  const auto ring = planStaged(&area, StagedTraffic::kRing, sixteenMiB, 4, kWholeStepSpace);
  CHECK(ring && ring->pieces == PieceSize::kCacheSized);
  CHECK(ring && ring->stepsPerExchange == 2 * 64);
  const auto oneWay = planStaged(&area, StagedTraffic::kOneWay, sixteenMiB, 1, kWholeStepSpace);
  CHECK(oneWay && oneWay->pieces == PieceSize::kScaledToMessage);
  CHECK(oneWay && oneWay->stepsPerExchange == 2 * 16);  // whole 1 MiB slots
}

// 40-byte slots hold 5 int64 per piece. Two exchanges in 100 steps leave each 50: 25 pieces,
// 125 elements; one element more needs a 26th piece and travels through the transport.
void stepBudgetOneElementEitherSide() {
  const StagingArea area = areaWithSlots(40);
  const StepBudget budget{.exchanges = 2, .steps = 100};
  const auto fits = planStaged(&area, StagedTraffic::kRing, 125 * 8, 8, budget);
  CHECK(fits && fits->stepsPerExchange == 50);
  CHECK(planStaged(&area, StagedTraffic::kRing, 124 * 8, 8, budget));
  CHECK(!planStaged(&area, StagedTraffic::kRing, 126 * 8, 8, budget));
  // The same bytes fit when a single exchange has the 100 steps.
  CHECK(planStaged(&area, StagedTraffic::kRing, 126 * 8, 8, {.exchanges = 1, .steps = 100}));
  // No room at all: even a one-piece message travels through the transport.
  CHECK(!planStaged(&area, StagedTraffic::kRing, 8, 8, {.exchanges = 1, .steps = 1}));
  // No exchanges (a one-rank broadcast tree) need no steps.
  CHECK(planStaged(&area, StagedTraffic::kOneWay, kStagedMessageMin, 1,
                   {.exchanges = 0, .steps = 0}));
}

const ucxb::check::Group kGroups[] = {
    {"no_staging", noStaging, true},
    {"floor", floorOneElementEitherSide, true},
    {"pieces_and_steps", piecesAndSteps, true},
    {"step_budget", stepBudgetOneElementEitherSide, true},
};

}  // namespace

int main(int argc, char** argv) {
  return ucxb::check::runGroups("staged_path_test", kGroups, argc, argv);
}
