// When lost yields begin a crowded spell (csrc/engine/core_yield.h's LostTimeBudget), on the
// lost-yield patterns recorded on this project's 2-core host (docs/performance.md#issue-23-stalls):
// a spinning thread beside a polling one, four busy udp ranks taking turns, and a thread
// outside the group seen runnable.
#include "csrc/engine/core_yield.h"

#include <sched.h>

#include <algorithm>

#include "tests/cpp/check.h"

namespace {

using ucxb::LostTimeBudget;

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kUs = 1'000;

// Next to a thread that keeps the core, about every other yield loses 3.2-4 ms (the tick that
// ends its slice): the second lost yield begins a spell, and so on after each spell.
void testSpinningNeighbour() {
  LostTimeBudget budget;
  CHECK(!budget.add(10 * kMs, 3800 * kUs, false));
  CHECK(budget.add(14 * kMs, 3800 * kUs, false));
  // The spell emptied the budget: the first lost yield after it begins none on its own.
  CHECK(!budget.add(120 * kMs, 3300 * kUs, false));
  CHECK(budget.add(124 * kMs, 3700 * kUs, false));
  // A single yield that lost the core for longer than the whole budget begins one at once.
  LostTimeBudget once;
  CHECK(once.add(500 * kMs, 9 * kMs, false));
}

// Busy ranks of one group: one lost yield of 1-4.5 ms per thread about every 50 ms (an op),
// and now and then two a few milliseconds apart. Over two seconds, no spell.
void testBusyRanks() {
  LostTimeBudget budget;
  int spells = 0;
  int64_t now = 0;
  const int64_t lost[] = {1100, 2700, 4500, 1800, 3900, 1200, 3100, 2300, 1500, 4200};
  for (int op = 0; op < 40; ++op) {
    now += 50 * kMs;
    const int64_t first = lost[op % 10] * kUs;
    spells += budget.add(now, first, false) ? 1 : 0;
    if (op % 4 == 0) {  // a second lost yield 2 ms later, shorter than the budget's rest
      spells += budget.add(now + 2 * kMs, std::min<int64_t>(6 * kMs - first, 1500 * kUs), false) ? 1 : 0;
    }
  }
  CHECK_EQ(spells, 0);
}

// The budget drains at kShare of the wall time: 5 ms held is gone after 25 ms, not before.
void testDrain() {
  LostTimeBudget budget;
  CHECK(!budget.add(0, 5 * kMs, false));
  CHECK(budget.add(4 * kMs, 2 * kMs, false));  // 5 - 0.8 + 2 > 6
  LostTimeBudget later;
  CHECK(!later.add(0, 5 * kMs, false));
  CHECK(!later.add(26 * kMs, 5900 * kUs, false));  // drained to 0, then 5.9 ms held
  CHECK(later.add(27 * kMs, 400 * kUs, false));    // 5.9 - 0.2 + 0.4 > 6
}

// A yield lost while a thread outside the group was runnable begins a spell at once, and
// empties what the group's own turns had put in the budget.
void testOutsider() {
  LostTimeBudget budget;
  CHECK(!budget.add(10 * kMs, 4 * kMs, false));
  CHECK(budget.add(60 * kMs, 1100 * kUs, true));
  CHECK(!budget.add(61 * kMs, 4 * kMs, false));
}

// /proc/loadavg's fourth field, as the kernel writes it.
void testLoadavg() {
  CHECK_EQ(ucxb::runnableInLoadavg("0.35 0.79 1.47 3/512 12345\n"), 3L);
  CHECK_EQ(ucxb::runnableInLoadavg("10.31 9.06 6.60 14/1021 98765\n"), 14L);
  CHECK_EQ(ucxb::runnableInLoadavg(""), -1L);
  CHECK_EQ(ucxb::runnableInLoadavg("0.35 0.79 1.47 /512 1"), -1L);
  CHECK_EQ(ucxb::runnableInLoadavg("0.35 0.79 1.47 x3/512 1"), -1L);
}

// A cgroup's CPU quota, in CPUs rounded up: what `docker --cpus` leaves a container, which
// sched_getaffinity does not show (none: 0).
void testQuotaCpus() {
  CHECK_EQ(ucxb::cpusOfCpuMax("max 100000"), 0);
  CHECK_EQ(ucxb::cpusOfCpuMax("200000 100000"), 2);
  CHECK_EQ(ucxb::cpusOfCpuMax("150000 100000"), 2);
  CHECK_EQ(ucxb::cpusOfCpuMax("50000 100000\n"), 1);
  CHECK_EQ(ucxb::cpusOfCpuMax(""), 0);
  CHECK_EQ(ucxb::cpusOfCpuMax("100000"), 0);
  CHECK_EQ(ucxb::cpusOfCpuMax("1x 100000"), 0);
  CHECK_EQ(ucxb::cpusOfCpuMax("100000 0"), 0);
  CHECK_EQ(ucxb::cpusOfCpuMax("100000 100000 7"), 0);
  CHECK_EQ(ucxb::cpusOfCfsQuota("-1", "100000"), 0);
  CHECK_EQ(ucxb::cpusOfCfsQuota("100000", "100000"), 1);
  CHECK_EQ(ucxb::cpusOfCfsQuota("250000", "100000"), 3);
  CHECK_EQ(ucxb::cpusOfCfsQuota("", "100000"), 0);
  CHECK_EQ(ucxb::cpusOfCfsQuota("100000", "x"), 0);
  CHECK(ucxb::quotaCpus() >= 0);  // whatever this host's cgroup says
}

// A group's creation starts a spell only where its ranks on this host outnumber the cores
// (cores 0: unknown, never).
void testStartSpell() {
  CHECK(ucxb::oversubscribedAtStart(3, 2));
  CHECK(ucxb::oversubscribedAtStart(32, 16));
  CHECK(!ucxb::oversubscribedAtStart(2, 2));
  CHECK(!ucxb::oversubscribedAtStart(8, 64));
  CHECK(!ucxb::oversubscribedAtStart(1, 1));
  CHECK(!ucxb::oversubscribedAtStart(8, 0));
  // Where it holds here, the spell is on at once and counted apart from lost yields'.
  const ucxb::WaitCounts before = ucxb::waitCounts();
  cpu_set_t set;
  CPU_ZERO(&set);
  CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
  const int cores = CPU_COUNT(&set);
  CHECK(!ucxb::crowdAtStart(cores));
  CHECK(ucxb::crowdAtStart(cores + 1));
  CHECK(ucxb::crowded());
  const ucxb::WaitCounts after = ucxb::waitCounts();
  CHECK_EQ(after.startSpells - before.startSpells, uint64_t{1});
  CHECK_EQ(after.spells, before.spells);
}

const ucxb::check::Group kGroups[] = {
    {"spinning_neighbour", testSpinningNeighbour, true},
    {"busy_ranks", testBusyRanks, true},
    {"drain", testDrain, true},
    {"outsider", testOutsider, true},
    {"loadavg", testLoadavg, true},
    {"start_spell", testStartSpell, true},
    {"quota_cpus", testQuotaCpus, true},
};

}  // namespace

int main(int argc, char** argv) { return ucxb::check::runGroups("core_yield_test", kGroups, argc, argv); }
