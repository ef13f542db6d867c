#include "csrc/engine/core_yield.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

namespace ucxb {

namespace {

using Clock = std::chrono::steady_clock;

// A yield that returned later than this lost the core: longer than a polling peer's usual turn
// (a 1 MiB piece copied or folded, a few hundred microseconds), shorter than a scheduler slice
// (0.75 ms at least, and the tick that ends it comes 4 ms apart at HZ=250).
constexpr auto kLostYield = std::chrono::microseconds(1000);
// How long waits sleep once a spell starts before they poll again: the two lost yields that
// start the next one next to a spinning thread cost under a tenth of it. tests/test_progress.py
// waits out a spell (OUTLAST_SPELL_SECONDS) before it measures a wait that must poll.
constexpr auto kCrowdedFor = std::chrono::milliseconds(100);

// Plus one for the kernel's own short-lived work that the group's traffic wakes (softirqs over
// loopback, kworkers).
constexpr int kKernelThreads = 1;

// The group's threads on this host that may run at once (ranks times each rank's threads).
std::atomic<int> groupThreadsOnHost{kThreadsPerRank};
std::atomic<int64_t> crowdedUntilNs{0};  // steady clock, ns since its epoch
std::atomic<uint64_t> yields{0};
std::atomic<uint64_t> lostYields{0};
std::atomic<uint64_t> yieldsWhenCrowded{0};
std::atomic<uint64_t> sleeps{0};
std::atomic<uint64_t> sleepTimeouts{0};

std::atomic<uint64_t> spells{0};
std::atomic<uint64_t> startSpells{0};

// countWait's, per WaitFor.
struct WaitTotals {
  std::atomic<uint64_t> waits{0};
  std::atomic<uint64_t> ns{0};
  std::atomic<uint64_t> polls{0};
  std::atomic<uint64_t> sleeps{0};
};
WaitTotals transportWaits;
WaitTotals deviceWaits;

// Process-wide: either thread of a rank may be the one next to the busy thread. Touched only
// after a lost yield, a few hundred times a second at most.
std::mutex lostTimeMu;
LostTimeBudget lostTime;

int64_t toNs(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Whether the host runs more threads now than this host's ranks do: /proc/loadavg's fourth
// field, "<runnable>/<all>", counts those running or waiting for a core at this moment. A few
// microseconds, read only after a lost yield. Unreadable: as if an outsider ran (a spell at
// every lost yield, the safe side on a loaded host).
bool outsiderRunnable() {
  static const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char text[128];
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  if (n <= 0) return true;
  text[n] = '\0';
  const long runnable = runnableInLoadavg(text);
  if (runnable < 0) return true;
  return runnable > groupThreadsOnHost.load(std::memory_order_relaxed) + kKernelThreads;
}

// Makes the crowded spell last until `until` at least.
void extendSpell(Clock::time_point until) {
  // Only ever later: another thread's spell may have set a later end already.
  const int64_t end = toNs(until);
  int64_t seen = crowdedUntilNs.load(std::memory_order_relaxed);
  while (seen < end &&
         !crowdedUntilNs.compare_exchange_weak(seen, end, std::memory_order_relaxed)) {
  }
}

bool spellBegins(Clock::time_point before, Clock::time_point after) {
  const bool outsider = outsiderRunnable();
  const std::lock_guard<std::mutex> lock(lostTimeMu);
  return lostTime.add(toNs(after), toNs(after) - toNs(before), outsider);
}

}  // namespace

long runnableInLoadavg(const char* text) {
  const char* slash = std::strchr(text, '/');
  if (slash == nullptr) return -1;
  const char* start = slash;
  while (start > text && start[-1] != ' ') --start;
  if (start == slash) return -1;
  char* end = nullptr;
  const long runnable = std::strtol(start, &end, 10);
  return end == slash ? runnable : -1;
}

bool LostTimeBudget::add(int64_t nowNs, int64_t lostNs, bool outsider) {
  if (outsider) {
    heldNs_ = 0;
    return true;
  }
  if (heldNs_ > 0) {
    const auto drained = static_cast<int64_t>(static_cast<double>(nowNs - atNs_) * kShare);
    heldNs_ = std::max<int64_t>(0, heldNs_ - drained);
  }
  heldNs_ += lostNs;
  atNs_ = nowNs;
  if (heldNs_ <= kBudgetNs) return false;
  heldNs_ = 0;
  return true;
}

Clock::time_point yieldCoreFrom(Clock::time_point before) {
  if (toNs(before) < crowdedUntilNs.load(std::memory_order_relaxed)) {
    yieldsWhenCrowded.fetch_add(1, std::memory_order_relaxed);
  }
  sched_yield();
  const auto after = Clock::now();
  yields.fetch_add(1, std::memory_order_relaxed);
  if (after - before <= kLostYield) return after;
  lostYields.fetch_add(1, std::memory_order_relaxed);
  if (!spellBegins(before, after)) return after;
  spells.fetch_add(1, std::memory_order_relaxed);
  extendSpell(after + kCrowdedFor);
  return after;
}

bool yieldCore() {
  const auto before = Clock::now();
  return yieldCoreFrom(before) - before > kLostYield;
}

void noteRanksOnHost(int ranks, int threadsPerRank) {
  const int threads = ranks * threadsPerRank;
  int seen = groupThreadsOnHost.load(std::memory_order_relaxed);
  while (seen < threads &&
         !groupThreadsOnHost.compare_exchange_weak(seen, threads, std::memory_order_relaxed)) {
  }
}

bool crowded() { return toNs(Clock::now()) < crowdedUntilNs.load(std::memory_order_relaxed); }

bool oversubscribedAtStart(int ranksOnHost, int cores) { return cores > 0 && ranksOnHost > cores; }

namespace {

// ceil(quota / period) for a quota and period in the same unit; 0 for no quota or nonsense.
int cpusOfQuota(long long quota, long long period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>(std::min<long long>((quota + period - 1) / period, 1 << 20));
}

long long parseCount(const std::string& text) {
  std::istringstream in(text);
  long long v = 0;
  std::string rest;
  if (!(in >> v) || (in >> rest)) return -1;  // one integer, nothing after it
  return v;
}

std::string readFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The cgroup path of this process in the v1 hierarchy that has the cpu controller, or in
// the v2 one (/proc/self/cgroup: "<id>:<controllers>:<path>", v2's "0::<path>").
bool ownCgroup(bool v2, std::string& path) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    bool cpu = false;
    std::istringstream names(controllers);
    for (std::string n; std::getline(names, n, ',');) cpu = cpu || n == "cpu";
    if (v2 ? (line.compare(0, a, "0") == 0 && controllers.empty()) : cpu) {
      path = line.substr(b + 1);
      return true;
    }
  }
  return false;
}

// Calls `quotaAt(dir)` for the cgroup directory `root` + `path` and each ancestor up to
// `root`, and returns the smallest nonzero answer (0 for none).
template <typename QuotaAt>
int smallestUp(const std::string& root, std::string path, QuotaAt quotaAt) {
  int best = 0;
  for (;;) {
    const int cpus = quotaAt(root + path);
    if (cpus > 0 && (best == 0 || cpus < best)) best = cpus;
    if (path.empty() || path == "/") return best;
    const size_t slash = path.find_last_of('/');
    path = slash == std::string::npos || slash == 0 ? std::string("/") : path.substr(0, slash);
  }
}

}  // namespace

int cpusOfCpuMax(const std::string& cpuMax) {
  std::istringstream in(cpuMax);
  std::string quota, period, rest;
  if (!(in >> quota >> period) || (in >> rest) || quota == "max") return 0;
  return cpusOfQuota(parseCount(quota), parseCount(period));
}

int cpusOfCfsQuota(const std::string& quotaUs, const std::string& periodUs) {
  return cpusOfQuota(parseCount(quotaUs), parseCount(periodUs));
}

int quotaCpus() {
  std::string path;
  if (ownCgroup(/*v2=*/true, path)) {
    const int cpus = smallestUp("/sys/fs/cgroup", path, [](const std::string& dir) {
      return cpusOfCpuMax(readFirstLine(dir + "/cpu.max"));
    });
    if (cpus > 0) return cpus;
  }
  if (ownCgroup(/*v2=*/false, path)) {
    // Where the v1 cpu hierarchy is mounted: alone, or with cpuacct.
    for (const char* root : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"}) {
      const int cpus = smallestUp(root, path, [](const std::string& dir) {
        return cpusOfCfsQuota(readFirstLine(dir + "/cpu.cfs_quota_us"),
                              readFirstLine(dir + "/cpu.cfs_period_us"));
      });
      if (cpus > 0) return cpus;
    }
  }
  return 0;
}

bool crowdAtStart(int ranksOnHost) {
  cpu_set_t set;
  CPU_ZERO(&set);
  // The cores this process may run on (taskset, a cgroup's cpuset), not the machine's, and
  // no more than its cgroup's CPU quota lets it use at once.
  int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  if (const int quota = quotaCpus(); quota > 0 && (cores == 0 || quota < cores)) cores = quota;
  if (!oversubscribedAtStart(ranksOnHost, cores)) return false;
  startSpells.fetch_add(1, std::memory_order_relaxed);
  extendSpell(Clock::now() + kCrowdedFor);
  return true;
}

void countSleep(bool timedOut) {
  sleeps.fetch_add(1, std::memory_order_relaxed);
  if (timedOut) sleepTimeouts.fetch_add(1, std::memory_order_relaxed);
}

void countWait(WaitFor what, std::chrono::nanoseconds spent, uint64_t polls, uint64_t sleeps) {
  WaitTotals& t = what == WaitFor::kDevice ? deviceWaits : transportWaits;
  t.waits.fetch_add(1, std::memory_order_relaxed);
  t.ns.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, spent.count())),
                 std::memory_order_relaxed);
  if (polls > 0) t.polls.fetch_add(polls, std::memory_order_relaxed);
  if (sleeps > 0) t.sleeps.fetch_add(sleeps, std::memory_order_relaxed);
}

WaitCounts waitCounts() {
  WaitCounts c;
  c.yields = yields.load(std::memory_order_relaxed);
  c.lostYields = lostYields.load(std::memory_order_relaxed);
  c.spells = spells.load(std::memory_order_relaxed);
  c.startSpells = startSpells.load(std::memory_order_relaxed);
  c.yieldsWhenCrowded = yieldsWhenCrowded.load(std::memory_order_relaxed);
  c.sleeps = sleeps.load(std::memory_order_relaxed);
  c.sleepTimeouts = sleepTimeouts.load(std::memory_order_relaxed);
  c.groupThreadsOnHost = static_cast<uint64_t>(groupThreadsOnHost.load(std::memory_order_relaxed));
  c.transportWaits = transportWaits.waits.load(std::memory_order_relaxed);
  c.transportWaitNs = transportWaits.ns.load(std::memory_order_relaxed);
  c.deviceWaits = deviceWaits.waits.load(std::memory_order_relaxed);
  c.deviceWaitNs = deviceWaits.ns.load(std::memory_order_relaxed);
  c.devicePolls = deviceWaits.polls.load(std::memory_order_relaxed);
  c.deviceSleeps = deviceWaits.sleeps.load(std::memory_order_relaxed);
  return c;
}

}  // namespace ucxb
