// Yielding the core in a polling wait, and when to stop polling. Torch-free.
//
// The waits of this backend poll with sched_yield() between polls for `spin_us`, then sleep
// (docs/architecture.md#progress-and-sleeping). Next to a thread that polls too, or that
// blocks soon, a yield costs a microsecond or the other thread's short turn. Next to one that
// keeps the core (a compiler, a training step's compute thread, another job), it costs that
// thread's whole slice: on an EEVDF kernel (Linux 6.6 and later) the yielder goes behind it and
// gets the core back at the next tick that ends the slice, 4-6 ms at HZ=250 (measured on this
// project's host, 6.18: ten yields next to a spinning thread took 64 ms). A wait that polls
// for 250 us then loses milliseconds at every poll: a 16 MB all_reduce (dozens of waits) took
// a median of 205 ms on the loaded host, against 14-55 ms with waits that sleep at once
// (docs/performance.md#issue-23-stalls).
//
// So every polling wait yields through yieldCore(), which times it. A yield that kept this
// thread off its core for longer than kLostYield (1 ms) lost it. One lost while the host runs
// more threads than this host's ranks do (a thread outside the group took the core), or lost
// yields that add up (LostTimeBudget), start a crowded spell of kCrowdedFor (100 ms) in the
// process, in which waits
// sleep (the progress thread), block (Work.wait) or hand over (an inline caller) instead of
// polling. A sleeping thread is woken by the event it waits for, not by a tick.
// Process-wide: the crowding is the host's, not a group's.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ucxb {

// Whether lost yields crowd the process. A yield lost while a thread outside the group was
// runnable does at once: another job's thread keeps the core for its slice, again and again.
// One lost among the group's own threads alone does not: ranks oversubscribed on their host
// take turns of 1-5 ms too (four udp ranks, eight busy threads on two cores: about one lost
// yield per thread every 50 ms, all of it the op's own work), and sleeping through a spell
// there cost a 4-rank incast 10-30% (docs/performance.md#issue-23-stalls). A thread that
// keeps the core and is not seen (the host's count of runnable threads is a moment's) makes
// every second or third yield lost, back to back. So lost time drains at kShare of the wall
// time, and a spell begins when more than kBudgetNs is held: next to a spinning thread after
// two lost yields (3-4 ms each at HZ=250), among busy ranks almost never. Clock-free, for
// tests (tests/cpp/core_yield_test.cpp).
class LostTimeBudget {
 public:
  static constexpr double kShare = 0.2;
  static constexpr int64_t kBudgetNs = 6'000'000;

  // Adds a yield that lost the core for lostNs and ended at nowNs (steady clock), with
  // whether a thread outside the group was runnable then: whether a spell begins (and the
  // budget empties).
  bool add(int64_t nowNs, int64_t lostNs, bool outsider);

 private:
  int64_t heldNs_ = 0;
  int64_t atNs_ = 0;
};

// The threads runnable on the host now, from /proc/loadavg's text ("0.35 0.79 1.47 3/512
// 12345": 3, the fourth field's first number); -1 when the text is not of that form.
long runnableInLoadavg(const char* text);

// sched_yield(), timed: a yield that returned later than kLostYield lost the core, and may
// begin a crowded spell (LostTimeBudget). Returns whether it lost the core.
bool yieldCore();
// The same, timed from `before`, the caller's clock reading taken just before (the inline
// wait reads the clock once a pass, and two more readings per yield cost it about 0.4 us an
// 8-byte op): returns the clock after the yield.
std::chrono::steady_clock::time_point yieldCoreFrom(std::chrono::steady_clock::time_point before);

// Threads of a rank that poll or run its ops' work: the caller and the progress thread. A
// transport may run more (Transport::threadsOfItsOwn: ucx's send lane).
constexpr int kThreadsPerRank = 2;

// This process runs `ranks` ranks of a group on this host, itself included, each with
// `threadsPerRank` threads (the largest of its groups counts): their threads are the group's
// own when a lost yield asks whether a thread outside it took the core. One rank of
// kThreadsPerRank until a group says more.
void noteRanksOnHost(int ranks, int threadsPerRank);

// Whether the process is in a crowded spell: polling waits should sleep.
bool crowded();

// Whether a group just created with `ranksOnHost` ranks on this host, which gives this process
// `cores` cores, starts a crowded spell: where the ranks outnumber the cores. Its ranks reach
// the group's first op over milliseconds as each finishes its creation, and a wait that polls
// for its late peers takes the core one of them needs to get there (8 ranks on 2 cores: the
// first 8-byte all_reduce took 16 ms of a 31 ms start polling, 11 ms sleeping; docs/
// performance.md, start-up). Pure, for tests (tests/cpp/core_yield_test.cpp).
bool oversubscribedAtStart(int ranksOnHost, int cores);
// Starts that spell where oversubscribedAtStart(ranksOnHost, this process's cores) holds;
// returns whether it did. Called once a group's creation is complete. This process's cores:
// those it may run on (sched_getaffinity: taskset, a cpuset), and no more than a CPU quota of
// its cgroup leaves it (quotaCpus: docker --cpus, a Kubernetes CPU limit), which affinity
// does not show.
bool crowdAtStart(int ranksOnHost);

// The CPUs a cgroup CPU quota leaves, rounded up: cgroup v2's cpu.max ("<quota> <period>",
// "max <period>" for none) and cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us (quota -1
// for none). 0 where there is no quota or the text does not parse. Pure, for tests.
int cpusOfCpuMax(const std::string& cpuMax);
int cpusOfCfsQuota(const std::string& quotaUs, const std::string& periodUs);
// The smallest such quota over this process's cgroup and its ancestors (both versions);
// 0 where none applies or none can be read.
int quotaCpus();

// A polling wait that sleeps instead of yielding: counted, with whether the sleep ended by
// its timeout rather than by an event (for wait_stats()).
void countSleep(bool timedOut);

// What an op's thread waited for, and how long (for wait_stats(): an op's time split into its
// waits for the transport's requests and for the device's work, and the rest). kTransport: a
// wait for requests (ProgressEngine::waitUntil, the progress thread's or an inline caller's),
// whose yields and sleeps are `yields` and `sleeps` above. kDevice: a wait for a CUDA stream or
// event (waitForDevice, device_op.hpp), with the polls that found the device not there yet and
// the sleeps between them, which are in neither `yields` nor `sleeps`.
enum class WaitFor { kTransport, kDevice };
void countWait(WaitFor what, std::chrono::nanoseconds spent, uint64_t polls = 0,
               uint64_t sleeps = 0);

// This process's counts since it started (any thread): yields, yields that lost the core
// (LostTimeBudget weighs them), yields begun while crowded() (none but a race:
// waits check it first), sleeps of the waits in ops and of the idle progress thread, and
// sleeps that ended by their timeout with no event; spells: crowded spells begun.
struct WaitCounts {
  uint64_t yields = 0;
  uint64_t lostYields = 0;
  uint64_t spells = 0;
  uint64_t startSpells = 0;  // begun by crowdAtStart, not among `spells`
  uint64_t yieldsWhenCrowded = 0;
  uint64_t sleeps = 0;
  uint64_t sleepTimeouts = 0;
  uint64_t groupThreadsOnHost = 0;  // noteRanksOnHost's largest: what the outsider check allows
  // countWait's: waits, their nanoseconds, and a device wait's polls and sleeps.
  uint64_t transportWaits = 0;
  uint64_t transportWaitNs = 0;
  uint64_t deviceWaits = 0;
  uint64_t deviceWaitNs = 0;
  uint64_t devicePolls = 0;
  uint64_t deviceSleeps = 0;
};
WaitCounts waitCounts();

}  // namespace ucxb
