// The execution model of one group (one backend instance):
//
// * One progress thread owns the group's Transport (the UCX worker is single-threaded).
// * The caller's thread validates an op, queues it as a Task and returns a Work; the progress
//   thread runs tasks one at a time in issue order, so every rank executes a group's
//   collectives in the same order. An op costs two thread hops: caller -> progress thread
//   and back. Both sides poll (yielding the core) for `spin` before they block, so ops in a
//   burst cost no wake-up: the thread stays awake for `spin` after its last op (and is then
//   woken by an eventfd write), and Work::wait polls for `spin` before its condition variable.
// * A task's algorithm posts non-blocking sends/receives and waits in waitAll(), which drives
//   progress itself: it polls (yielding the core between polls) for up to `spin` after the
//   last event, then arms the transport and sleeps on its event fd (progress mode "sleep"),
//   or keeps polling (mode "poll"). In a crowded spell (a yield lost the core to a thread that
//   keeps it: core_yield.h) it sleeps at once, and so does the idle thread after its last op.
// * With no task queued the thread arms the transport and sleeps on {transport fd, eventfd}, so
//   an idle group costs nothing. Point-to-point requests complete from this idle loop too.
// * Inline ops: a caller may borrow the transport while the group is idle (no task queued or
//   running, no other borrower), post a small op and drive it on its own thread, which saves
//   the two thread hops (lend(); the backend decides which ops qualify). The transport has
//   one driver at a time: the thread holds ownerMu_ while it runs a task or polls, and while
//   a Lease is out it touches nothing of the transport and runs no task; it parks on its
//   eventfd (re-checking every kParkMs) instead of listening on the transport's fd, so a
//   burst of inline ops does not wake it. An op that does not finish within `spin` (a
//   caller is held no longer than Work.wait() would poll) is handed over: its continuation
//   (the requests already posted, and what completes the op) is queued first and the thread
//   finishes it, so nothing is posted twice and nothing is lost.
// * Two ranks on one core: a borrowing caller that yields runs the peer rank, which then
//   runs only while this one yields, so each op costs both ranks' time in turn (30-40 us at
//   8 B here, against 7 us with a core each), and two threads that never block are not moved
//   apart within a short burst of ops. So where the group's ranks share a host (staging
//   slots), a caller publishes its core in its slots' header while it waits; one whose
//   sched_yield() lost the core for longer than kCrowdedYield and finds a lower rank waiting
//   on the same core moves itself to another core it may run on (narrowing its affinity
//   and restoring it at once: the scheduler may move it again as before). The lower rank
//   never moves, so the two cannot chase each other. The progress threads of a pair do the
//   same in a queued op's waits: stacked on one core (a peer's wake-up places the woken thread
//   on the waker's core when its own is busy for a moment), each yield next to the peer that
//   copies costs up to a tick, and the lost yields start crowded spells (core_yield.h) in
//   which every wait sleeps: a 64 MB all_reduce took 2-3x as long for as long as they stayed
//   stacked (docs/performance.md#pair-progress-threads-on-one-core-2026-11-27-issue-23).
// * A group that has failed (an op failed or timed out, a point-to-point request failed, an
//   exception escaped the transport on this thread) refuses every later op: fail() records
//   the first reason, and the backend fails each later Work with GroupFailed naming it. So a
//   peer's message left unmatched by a failed op can never be taken for a later op's, even
//   once the tag's sequence field has wrapped. An exception on this thread outside an op also
//   ends the thread (instead of std::terminate): queued ops and posted requests fail with it.
// * The first failure of the group on this rank (not abort(), not a destroy) is told to every
//   other rank: a small notice with its text (failure_notice.h), sent by the thread at its
//   next turn. A rank that finds a peer's notice, where it waits anyway (before it sleeps, and
//   every FailureNotices::kCheckEvery while it polls without progress), fails its group with
//   the peer's reason (kPeer): the running op ends at once, and the backend's `onTold` fails
//   every other unsettled op, as abort() does. A group that failed already ignores notices.
// * abort() records the abort as the group's failure (unless one came first) and asks the
//   thread to stop without waiting for it: the thread may be stuck (a callback that blocks),
//   and it ends by itself. The backend fails its unsettled Works on the caller's thread.
//
// This file is torch-free: failures are ucxb exceptions; the backend turns them into c10 errors.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "csrc/collectives/op_driver.h"
#include "csrc/engine/failure_notice.h"
#include "csrc/engine/staging_area.h"
#include "csrc/engine/traffic_stats.h"
#include "transports/transport.h"

namespace ucxb {

enum class ProgressMode { kSleep, kPoll };

// An op refused because its group failed earlier; what() names that first failure.
class GroupFailed : public std::runtime_error {
 public:
  explicit GroupFailed(const std::string& firstFailure)
      : std::runtime_error("the group is unusable after an earlier failure (destroy it and "
                           "create a new one); the first failure was: " + firstFailure) {}
};

// A request the transport failed: a peer is gone, reset or closed its connection, or refused
// the message. The group's failure is then the peer's (torch's ErrorType REMOTE_ERROR).
class PeerFailed : public OpFailed {
 public:
  using OpFailed::OpFailed;
};

// What kind of failure failed a group (the first one, recorded with its text). The backend
// reports it as torch's ErrorType: kTimeout as TIMEOUT, kPeer as REMOTE_ERROR, kAborted and
// kLocal as COMM_ERROR.
enum class FailureKind { kNone, kTimeout, kPeer, kAborted, kLocal };

// The kind of the exception that failed an op: OpTimeout is kTimeout, PeerFailed kPeer,
// anything else kLocal. Every caller of ProgressEngine::fail classifies through this.
FailureKind failureKindOf(std::exception_ptr cause);

struct EngineConfig {
  ProgressMode mode = ProgressMode::kSleep;
  std::chrono::microseconds spin{250};
};

// What a group's failure notices need (failure_notice.h): the group's field of the notice tag,
// and what runs when a peer's notice fails the group, with the reason ("rank 0 failed the
// group: ..."), on the thread that drives the transport (the backend fails its unsettled
// Works there, as abort() does). Set before the thread starts.
struct NoticeSetup {
  uint32_t group = 0;
  std::function<void(const std::string& reason)> onTold;
};

struct Task {
  std::string op;  // for traffic statistics ("allreduce", ...); empty for internal tasks
  uint64_t seq = 0;
  std::function<void()> run;                      // on the progress thread
  std::function<void(const std::string&)> abandon;  // if the engine stops before running it
  std::shared_ptr<void> keepAlive;                // buffers the task's requests touch
};

class ProgressEngine : public OpDriver, public std::enable_shared_from_this<ProgressEngine> {
 public:
  // Starts the progress thread. The thread holds a reference to its engine, so the engine
  // (and its transport) is destroyed only after the thread has left it, even when the last
  // outside reference is dropped on the progress thread itself (a Future callback).
  // `staging`: the group's shared-memory slots when all its ranks share this host, else null.
  static std::shared_ptr<ProgressEngine> start(std::unique_ptr<Transport> transport,
                                               EngineConfig config,
                                               std::unique_ptr<StagingArea> staging = nullptr,
                                               NoticeSetup notices = {});
  ProgressEngine(std::unique_ptr<Transport> transport, EngineConfig config,
                 std::unique_ptr<StagingArea> staging = nullptr, NoticeSetup notices = {});
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // Any thread.
  void post(Task task);

  // The transport lent to one caller's thread for one inline op (see the top of this file).
  // Destroying it gives the transport back. Used on the borrowing thread only.
  class Lease {
   public:
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Transport& transport() { return *engine_.transport_; }
    // Drives progress on this thread until every request has completed (true) or `spin` has
    // passed since the lease began (false: hand the op over). Failures as waitAll. With
    // `toTheEnd` (the caller blocks on the op's Work right after issuing it) it never gives
    // up before the deadline: past `spin` since the last event it sleeps on the transport's
    // fd, as the progress thread's waits do, so every message of the op reaches the waiting
    // thread without a hop through the progress thread.
    bool wait(const std::vector<RequestPtr>& requests, Clock::time_point deadline,
              bool toTheEnd = false);
    // Queues `continuation` ahead of every task posted meanwhile; the thread runs it once the
    // lease has ended. The lease counts as handed over.
    void handOver(Task continuation);

   private:
    friend class ProgressEngine;
    Lease(ProgressEngine& engine, std::unique_lock<std::mutex> owner, std::string op,
          uint64_t seq);
    ProgressEngine& engine_;
    std::unique_lock<std::mutex> owner_;
    const std::string op_;
    const uint64_t seq_;
    const Clock::time_point handOverAt_;
    bool counted_ = false;
    bool handedOver_ = false;
  };
  // Lends the transport to the calling thread when the group is idle (nothing queued, no
  // task running, no other lease, not stopping or failed); null otherwise, and the caller
  // queues its op as a task. Never on the progress thread (a Future callback): there the
  // thread is busy by definition. `keepAlive`: what a failing op's requests keep (waitAll).
  std::unique_ptr<Lease> lend(const std::string& op, uint64_t seq,
                              std::shared_ptr<void> keepAlive);
  // How many ops completed on a borrowing thread, and how many were handed over to this
  // thread (for tests and the bench). Any thread.
  uint64_t inlineOps() const { return inlineOps_.load(std::memory_order_relaxed); }
  uint64_t handedOver() const { return handedOver_.load(std::memory_order_relaxed); }
  // How many times a borrowing caller moved off a core it shared with a peer rank (see the
  // top of this file). Any thread.
  uint64_t coreMoves() const { return coreMoves_.load(std::memory_order_relaxed); }
  // Describes what the running op is waiting for (empty when idle). Any thread.
  std::string waitingFor() const;
  // The transport's traffic counters as last published (after each op, and whenever the
  // thread goes idle). Any thread.
  TrafficSnapshot traffic() const { return traffic_.snapshot(); }
  // The transport's trace samples since the last call (udp trace_samples). Any thread.
  std::vector<OpTraceSeries> drainTraceSeries() { return traffic_.drainTraceSeries(); }
  // Stops the thread: the running op fails within ~100 ms, queued tasks are abandoned.
  // Idempotent; from any thread (on the progress thread itself it only asks).
  void stop();
  // Records `why` as the group's failure and asks the thread to stop, without waiting for
  // it (stop() waits): the running op fails within ~100 ms, queued tasks are abandoned, and
  // the thread ends by itself, even when it is stuck for a while. Any thread, any number of
  // times; the first recorded failure wins.
  void abort(const std::string& why);
  // Records that the group failed, with `why` and its kind (the first call wins; later ones
  // are ignored). From then on the backend refuses every op. The first failure is told to
  // the other ranks (the thread sends the notice at its next turn), unless it is an abort
  // (kAborted) or the group is shutting down (stop(), abort()). Any thread.
  void fail(const std::string& why, FailureKind kind = FailureKind::kLocal);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The first failure's reason; empty while the group is healthy. Any thread.
  std::string failure() const;
  // The first failure's kind; kNone while the group is healthy. Any thread.
  FailureKind failureKind() const;
  // stop() was called, or the thread ended on an exception. Any thread.
  bool stopping() const { return stopping_.load(); }
  // Whether the caller is the progress thread (a Future callback, a task). Any thread.
  bool onThread() const { return std::this_thread::get_id() == threadId_.load(); }

  // Progress thread only (the thread destroys the transport when it exits).
  Transport& transport() { return *transport_; }
  // Drives progress until every request has completed. Throws OpFailed on the first failed
  // request and OpTimeout at the deadline; either way the rest are cancelled first.
  void waitAll(const std::vector<RequestPtr>& requests, Clock::time_point deadline) override {
    waitUntil(requests, deadline, Clock::time_point::max());
  }
  // Gives up on requests outside a waitAll (see waitAll for what that entails).
  void abandon(const std::vector<RequestPtr>& requests) override { abandonPending(requests); }
  // A buffer of at least `bytes`, reused by every op of the group (grow-only, so its size is
  // the largest chunk any algorithm asked for). It outlives every request that points into it.
  uint8_t* scratch(size_t bytes) override;
  // Null unless every rank of the group runs on this host (and shared memory is enabled).
  StagingArea* staging() const override { return staging_.get(); }
  // Whether the op now running (a task's, or a borrowing caller's) gave up a request that
  // the transport could not stop: it holds the op's keepAlive and may still write into the
  // op's tensors (abandonPending). Whoever drives the transport.
  bool leftRequestsBehind() const { return leftBehind_; }

 private:
  void threadMain();
  // One pass of the loop without a task: progress, publish, spin or sleep. False: leave.
  bool idleStep(Clock::time_point& lastActivity);
  void runTask(Task& task);
  // An exception escaped the thread's loop: fail the group and end the thread.
  void failThread(const std::string& what, Task* running);
  void sleepUntilEvent(int epollFd, Clock::time_point deadline);
  void abandonPending(const std::vector<RequestPtr>& requests);
  // Records `why` as the group's failure unless one came first; returns whether it did.
  // `tell`: the notice the other ranks are to hear (this rank's own failure, or a peer's
  // passed on); none for a failure they must not hear of.
  bool record(const std::string& why, FailureKind kind, std::optional<FailureNotice> tell);
  // Sends the notice of the group's first failure if one is due (tellDue_). Takes ownerMu_;
  // sendDueNotice() is the same for a caller that holds it.
  void tellPeers();
  void sendDueNotice();
  // A peer's notice, looked for when `force` or kCheckEvery has passed since the last look
  // and the group has not failed: records the group's failure with the peer's reason and
  // returns that reason ("rank 0 failed the group: ..."). Whoever drives the transport.
  std::optional<std::string> heardNotice(Clock::time_point now, bool force);
  // In a wait: a peer's notice (heardNotice) gives up `requests`, fails the group's other
  // Works (runTold) and ends the op with PeerFailed naming that peer.
  void throwIfTold(const std::vector<RequestPtr>& requests, Clock::time_point now, bool force);
  // Runs onTold (the backend fails the group's unsettled Works); never throws.
  void runTold(const std::string& reason);
  void setWaitingFor(std::string what);
  // waitAll that returns false once `giveUpAt` has passed with requests still pending (left
  // posted); only an inline op's first attempt gives up early, and only it (`borrowed`)
  // moves off a core it shares with a peer rank.
  bool waitUntil(const std::vector<RequestPtr>& requests, Clock::time_point deadline,
                 Clock::time_point giveUpAt, bool borrowed = false);
  // A borrowing caller's sched_yield() took long: move off `core` if a lower rank waits on it.
  void leaveSharedCore(int core);
  // The thread, while a lease is out: wait on the eventfd (never the transport's fd), for
  // kParkMs, or kLongParkMs while the borrower sleeps (leaseSleeps_).
  void park();
  void endLease(Lease& lease);

  std::unique_ptr<Transport> transport_;
  const EngineConfig config_;
  const int rank_;  // the transport's, kept for threads that must not touch the transport
  int wakeFd_ = -1;        // eventfd: "a task was posted"
  int idleEpollFd_ = -1;   // {transport fd, wakeFd_}
  int waitEpollFd_ = -1;   // {transport fd}: a running op ignores new posts
  int parkEpollFd_ = -1;   // {wakeFd_}: the thread while a caller has borrowed the transport
  // How often a parked thread looks again: a burst of inline ops keeps it parked (so their
  // traffic never wakes it), and within this long after the burst it listens again.
  static constexpr int kParkMs = 1;
  // While the borrower sleeps on the transport's fd (a blocking caller's op waits for a late
  // peer) the thread parks this long: the lease's end wakes it (endLease), so a short park
  // would only cost the parked threads of oversubscribed ranks a wake-up every kParkMs.
  static constexpr int kLongParkMs = 100;
  // How long lend() waits for an idle pass of the thread to end before the op is queued.
  static constexpr std::chrono::microseconds kLendWait{50};
  // A sched_yield() that returns later than this ran another thread on this core (a bare
  // yield costs well under a microsecond here; a peer rank's turn between two of its ops, 10
  // us or more).
  static constexpr std::chrono::microseconds kCrowdedYield{5};
  // How long an inline caller polls without yielding at the start of each wait. A peer that
  // runs on its own core answers a small op within a few microseconds, and a sched_yield
  // between two polls (a syscall, 0.3-0.6 us here) adds part of its cost to every such
  // answer. Bounded per wait, so it is no busy-poll: after it the wait yields as before, and
  // two ranks on one core lose at most this much of a 30-40 us op.
  static constexpr std::chrono::microseconds kBarePoll{2};

  mutable std::mutex mu_;
  std::deque<Task> queue_;
  bool taskRunning_ = false;  // guarded by mu_
  std::atomic<bool> lent_{false};  // a Lease is out (written under mu_)
  // Held by whoever drives the transport: the thread while it runs a task or polls, a
  // borrowing caller while its Lease lives. Never taken while holding mu_ (the other order is
  // fine: a lease ends by taking mu_).
  std::mutex ownerMu_;
  std::atomic<uint64_t> inlineOps_{0};
  std::atomic<uint64_t> handedOver_{0};
  std::atomic<uint64_t> coreMoves_{0};
  std::atomic<bool> stopping_{false};
  mutable std::mutex failMu_;
  std::string failure_;  // the first failure (guarded by failMu_)
  FailureKind failureKind_ = FailureKind::kNone;  // its kind (guarded by failMu_)
  std::atomic<bool> failed_{false};
  FailureNotices notices_;
  const std::function<void(const std::string&)> onTold_;
  // The first failure is to be told to the other ranks (record(); cleared by tellPeers),
  // with this notice (guarded by failMu_).
  std::atomic<bool> tellDue_{false};
  FailureNotice toTell_;
  // When the driver of the transport next looks for a peer's notice (heardNotice).
  Clock::time_point nextNoticeLook_{};
  std::mutex joinMu_;
  std::atomic<std::thread::id> threadId_{};
  std::atomic<size_t> queued_{0};
  std::atomic<bool> sleeping_{false};  // the idle thread is (about to be) in epoll_wait
  std::shared_ptr<void> currentKeepAlive_;
  bool leftBehind_ = false;  // leftRequestsBehind(); reset with currentKeepAlive_
  std::unique_ptr<uint8_t[]> scratch_;
  size_t scratchBytes_ = 0;
  std::unique_ptr<StagingArea> staging_;
  std::string waitingFor_;
  TrafficStats traffic_;
  bool trafficDirty_ = false;  // progress happened since the last publish (progress thread)
  std::thread thread_;
  // The borrowing caller has slept on the transport's fd during its lease (Lease::wait with
  // toTheEnd); endLease then wakes the parked thread.
  std::atomic<bool> leaseSleeps_{false};
};

}  // namespace ucxb
