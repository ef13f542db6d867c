#include "csrc/engine/progress_engine.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <pthread.h>
#include <sched.h>

#include "csrc/engine/core_yield.h"

namespace ucxb {

namespace {

std::string errnoMessage(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

void addToEpoll(int epollFd, int fd) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(epollFd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    throw TransportError(errnoMessage("epoll_ctl"));
  }
}

std::string describe(const Request& r) {
  std::string peer = r.peer() == kAnySource ? "any rank" : "rank " + std::to_string(r.peer());
  return r.isSend() ? "send of " + std::to_string(r.postedBytes()) + " bytes to " + peer
                    : "receive of " + std::to_string(r.postedBytes()) + " bytes from " + peer;
}

}  // namespace

FailureKind failureKindOf(std::exception_ptr cause) {
  try {
    std::rethrow_exception(cause);
  } catch (const OpTimeout&) {
    return FailureKind::kTimeout;
  } catch (const PeerFailed&) {
    return FailureKind::kPeer;
  } catch (...) {
    return FailureKind::kLocal;
  }
}

ProgressEngine::ProgressEngine(std::unique_ptr<Transport> transport, EngineConfig config,
                               std::unique_ptr<StagingArea> staging, NoticeSetup notices)
    : transport_(std::move(transport)),
      config_(config),
      rank_(transport_->rank()),
      notices_(notices.group),
      onTold_(std::move(notices.onTold)),
      staging_(std::move(staging)),
      traffic_(*transport_) {
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  idleEpollFd_ = epoll_create1(EPOLL_CLOEXEC);
  waitEpollFd_ = epoll_create1(EPOLL_CLOEXEC);
  parkEpollFd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wakeFd_ < 0 || idleEpollFd_ < 0 || waitEpollFd_ < 0 || parkEpollFd_ < 0) {
    const std::string msg = errnoMessage("eventfd/epoll_create1");
    for (int fd : {wakeFd_, idleEpollFd_, waitEpollFd_, parkEpollFd_}) {
      if (fd >= 0) close(fd);
    }
    throw TransportError(msg);
  }
  addToEpoll(idleEpollFd_, wakeFd_);
  addToEpoll(parkEpollFd_, wakeFd_);
  if (transport_->eventFd() >= 0) {
    addToEpoll(idleEpollFd_, transport_->eventFd());
    addToEpoll(waitEpollFd_, transport_->eventFd());
  }
}

std::shared_ptr<ProgressEngine> ProgressEngine::start(std::unique_ptr<Transport> transport,
                                                     EngineConfig config,
                                                     std::unique_ptr<StagingArea> staging,
                                                     NoticeSetup notices) {
  auto engine = std::make_shared<ProgressEngine>(std::move(transport), config, std::move(staging),
                                                 std::move(notices));
  engine->thread_ = std::thread([self = engine] { self->threadMain(); });
  engine->threadId_.store(engine->thread_.get_id());
  return engine;
}

ProgressEngine::~ProgressEngine() {
  stop();
  close(wakeFd_);
  close(idleEpollFd_);
  close(waitEpollFd_);
  close(parkEpollFd_);
}

void ProgressEngine::stop() {
  stopping_.store(true);
  const uint64_t one = 1;
  (void)!write(wakeFd_, &one, sizeof(one));
  if (std::this_thread::get_id() == threadId_.load()) {
    // Asked from the progress thread (a callback aborted or dropped the group): it exits by
    // itself once the callback returns, and its own reference then destroys the engine.
    // Another thread may be joining it right now (holding joinMu_): never wait for that.
    std::unique_lock<std::mutex> lock(joinMu_, std::try_to_lock);
    if (lock.owns_lock() && thread_.joinable()) thread_.detach();
    return;
  }
  std::lock_guard<std::mutex> lock(joinMu_);
  if (thread_.joinable()) thread_.join();
}

void ProgressEngine::abort(const std::string& why) {
  fail(why, FailureKind::kAborted);
  stopping_.store(true);
  const uint64_t one = 1;
  (void)!write(wakeFd_, &one, sizeof(one));
  // Never join here. Detached, the thread ends by itself, and its own reference then destroys
  // the engine; a later stop() has nothing to wait for. A thread joining it right now holds
  // joinMu_: leave it that.
  std::unique_lock<std::mutex> lock(joinMu_, std::try_to_lock);
  if (lock.owns_lock() && thread_.joinable()) thread_.detach();
}

void ProgressEngine::post(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) {
      if (task.abandon) {
        task.abandon(failed() ? GroupFailed(failure()).what() : "the process group was shut down");
      }
      return;
    }
    queue_.push_back(std::move(task));
    queued_.fetch_add(1, std::memory_order_seq_cst);
  }
  // Pairs with threadMain's store to sleeping_ and its re-check of queued_ (both seq_cst):
  // either the thread sees this task before it sleeps, or this sees it asleep and wakes it.
  // A thread still spinning after its last op is not woken: that saves a system call.
  if (config_.mode == ProgressMode::kSleep && sleeping_.load(std::memory_order_seq_cst)) {
    const uint64_t one = 1;
    (void)!write(wakeFd_, &one, sizeof(one));
  }
}

std::string ProgressEngine::waitingFor() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waitingFor_;
}

void ProgressEngine::setWaitingFor(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  waitingFor_ = std::move(what);
}

void ProgressEngine::fail(const std::string& why, FailureKind kind) {
  // An abort is this rank's own decision, and a destroy ends the group anyway: neither is
  // the peers' failure (docs/failure-model.md#abort-and-geterror).
  std::optional<FailureNotice> tell;
  if (kind != FailureKind::kAborted && !stopping_.load()) {
    tell = FailureNotice{rank_, rank_, why};
  }
  record(why, kind, std::move(tell));
}

bool ProgressEngine::record(const std::string& why, FailureKind kind,
                            std::optional<FailureNotice> tell) {
  {
    std::lock_guard<std::mutex> lock(failMu_);
    if (failed_.load(std::memory_order_relaxed)) return false;  // the first reason wins
    failure_ = why;
    failureKind_ = kind;
    if (tell) toTell_ = std::move(*tell);
    failed_.store(true, std::memory_order_release);
  }
  if (tell) {
    tellDue_.store(true, std::memory_order_release);
    // The thread sends the notice at its next turn: wake it if it sleeps.
    const uint64_t one = 1;
    (void)!write(wakeFd_, &one, sizeof(one));
  }
  return true;
}

void ProgressEngine::tellPeers() {
  std::lock_guard<std::mutex> owner(ownerMu_);
  sendDueNotice();
}

void ProgressEngine::sendDueNotice() {
  if (!tellDue_.exchange(false) || !transport_) return;
  try {
    FailureNotice notice;
    {
      std::lock_guard<std::mutex> lock(failMu_);
      notice = toTell_;
    }
    notices_.tell(*transport_, notice);
  } catch (...) {
    // Best effort (the copies may not get their memory): the thread's loop calls this outside
    // its try, and an exception leaving the thread would end the process.
  }
}

std::optional<std::string> ProgressEngine::heardNotice(Clock::time_point now, bool force) {
  if (!force && now < nextNoticeLook_) return std::nullopt;
  nextNoticeLook_ = now + FailureNotices::kCheckEvery;
  if (failed()) return std::nullopt;  // a group that failed ignores later notices
  const auto notice = notices_.take(*transport_);
  if (!notice) return std::nullopt;
  std::string reason = "rank " + std::to_string(notice->failed) + " failed the group: " +
                       notice->text;
  // Passed on to the ranks the failing one may not reach (failure_notice.h).
  if (!record(transport_->name() + " rank " + std::to_string(transport_->rank()) + ": " + reason,
              FailureKind::kPeer, *notice)) {
    return std::nullopt;  // another failure came first
  }
  return reason;
}

void ProgressEngine::throwIfTold(const std::vector<RequestPtr>& requests, Clock::time_point now,
                                 bool force) {
  const auto told = heardNotice(now, force);
  if (!told) return;
  abandonPending(requests);
  runTold(*told);
  throw PeerFailed(*told);
}

void ProgressEngine::runTold(const std::string& reason) {
  if (!onTold_) return;
  try {
    onTold_(reason);
  } catch (...) {
    // The group is failed already; a Work the backend could not settle here settles when
    // its op is refused or its request ends.
  }
}

FailureKind ProgressEngine::failureKind() const {
  std::lock_guard<std::mutex> lock(failMu_);
  return failureKind_;
}

std::string ProgressEngine::failure() const {
  std::lock_guard<std::mutex> lock(failMu_);
  return failure_;
}

void ProgressEngine::failThread(const std::string& what, Task* running) {
  fail(transport_->name() + " rank " + std::to_string(transport_->rank()) +
       ": the progress thread failed " + (running ? "while running an op" : "while idle") +
       ": " + what);
  stopping_.store(true);  // later posts are refused (post() names the failure)
  // Its Work may have finished already; a TransportWork keeps its first outcome.
  if (running != nullptr && running->abandon) running->abandon(GroupFailed(failure()).what());
}

void ProgressEngine::runTask(Task& task) {
  std::lock_guard<std::mutex> owner(ownerMu_);
  currentKeepAlive_ = task.keepAlive;
  leftBehind_ = false;
  const bool counted = traffic_.enabled() && !task.op.empty();
  if (counted) traffic_.beforeOp(*transport_);
  task.run();  // reports its own errors to its Work
  if (counted) traffic_.afterOp(*transport_, task.op, task.seq);
  // Destroyed while this thread owns the transport: a handed-over op's Comm gives up what
  // is still posted as it goes.
  task.run = nullptr;
  currentKeepAlive_.reset();
  setWaitingFor({});
}

void ProgressEngine::threadMain() {
  pthread_setname_np(pthread_self(), "ucxb-progress");
  auto lastActivity = Clock::now();
  for (;;) {
    // The group's first failure is told between tasks, while no lease is out (a failed
    // inline op's: the lease ends before the thread wakes to this).
    if (tellDue_.load(std::memory_order_relaxed) && !lent_.load()) tellPeers();
    Task task;
    bool haveTask = false;
    if (queued_.load(std::memory_order_acquire) > 0 || stopping_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_.load()) {
        break;
      }
      // Tasks posted while a lease is out wait for it (they were issued after its op).
      if (!queue_.empty() && !lent_.load()) {
        task = std::move(queue_.front());
        queue_.pop_front();
        queued_.fetch_sub(1, std::memory_order_release);
        haveTask = true;
        taskRunning_ = true;
      }
    }
    // Nothing may escape this thread (that would be std::terminate): an exception from the
    // transport (progress, arm), or one a task let through, fails the group and ends the
    // thread, which then fails what is queued and posted.
    try {
      if (haveTask) {
        runTask(task);
        {
          std::lock_guard<std::mutex> lock(mu_);
          taskRunning_ = false;
        }
        lastActivity = Clock::now();
        continue;
      }
      if (!idleStep(lastActivity)) break;
    } catch (const std::exception& e) {
      failThread(e.what(), haveTask ? &task : nullptr);
      break;
    } catch (...) {
      failThread("an exception of unknown type", haveTask ? &task : nullptr);
      break;
    }
  }
  // A borrowing caller notices stopping_ within one poll and gives the transport back.
  std::lock_guard<std::mutex> owner(ownerMu_);
  // A failure not told yet (the group was destroyed right after it) is told now, and what
  // was told is given a moment to leave before the transport goes.
  if (transport_) {
    try {
      sendDueNotice();
      notices_.finish(*transport_);
    } catch (...) {
      // Best effort (a transport that threw from progress() may throw again).
    }
  }
  std::deque<Task> abandoned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned.swap(queue_);
  }
  const std::string why = failed() ? GroupFailed(failure()).what()
                                   : "the process group was shut down before the op ran";
  for (auto& t : abandoned) {
    if (t.abandon) t.abandon(why);
  }
  // Before the transport: a handed-over op's continuation gives up its requests as it goes.
  abandoned.clear();
  // The transport goes with its thread (its owner): requests still posted, such as an
  // irecv nobody matched, fail now instead of waiting for the last reference to the group.
  transport_.reset();
}

void ProgressEngine::park() {
  epoll_event ev;
  const int ms = leaseSleeps_.load(std::memory_order_seq_cst) ? kLongParkMs : kParkMs;
  if (epoll_wait(parkEpollFd_, &ev, 1, ms) == 1) {
    uint64_t count;
    (void)!read(wakeFd_, &count, sizeof(count));
  }
}

bool ProgressEngine::idleStep(Clock::time_point& lastActivity) {
  if (lent_.load()) {
    park();
    return true;
  }
  std::unique_lock<std::mutex> owner(ownerMu_);
  if (transport_->progress()) {
    trafficDirty_ = true;
    lastActivity = Clock::now();
    return true;
  }
  if (trafficDirty_) {
    traffic_.publish(*transport_);  // idle now: what Python reads is up to date
    trafficDirty_ = false;
  }
  // A peer's notice, while idle, fails what this rank still waits for (its sends and
  // receives; a queued op is refused when it comes to run). Looked for every kCheckEvery
  // while the thread polls, and always before it sleeps, which may last until the next
  // message.
  const auto now = Clock::now();
  const bool polls = config_.mode == ProgressMode::kPoll ||
                     (now - lastActivity < config_.spin && !crowded());
  if (auto told = heardNotice(now, /*force=*/!polls)) {
    owner.unlock();
    runTold(*told);
    return true;
  }
  if (config_.mode == ProgressMode::kPoll) {
    owner.unlock();
    if (stopping_.load()) return false;
    // On a machine with fewer cores than spinning threads, give the caller's thread a turn.
    sched_yield();
    return true;
  }
  if (polls) {
    owner.unlock();
    // Ops come in bursts (a training step's buckets, a benchmark loop): stay awake for
    // `spin` after the last one, so the next is picked up without a wake-up. Not while
    // yields lose the core (core_yield.h): the post's eventfd write wakes a sleeper at once.
    yieldCore();
    return true;
  }
  if (!transport_->arm()) {
    return true;
  }
  owner.unlock();
  sleeping_.store(true, std::memory_order_seq_cst);
  if (queued_.load(std::memory_order_seq_cst) > 0 || stopping_.load()) {
    sleeping_.store(false);
    return true;
  }
  epoll_event events[2];
  const int n = epoll_wait(idleEpollFd_, events, 2, -1);
  sleeping_.store(false);
  countSleep(false);
  lastActivity = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (events[i].data.fd == wakeFd_) {
      uint64_t count;
      (void)!read(wakeFd_, &count, sizeof(count));
    }
  }
  return true;
}

void ProgressEngine::sleepUntilEvent(int epollFd, Clock::time_point deadline) {
  if (!transport_->arm()) {
    return;
  }
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  // Wake at least every 100 ms: peer failures and cancellations are re-checked then.
  const int timeoutMs = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(left + 1, 100)));
  epoll_event ev;
  countSleep(epoll_wait(epollFd, &ev, 1, timeoutMs) == 0);
}

void ProgressEngine::abandonPending(const std::vector<RequestPtr>& requests) {
  for (const auto& r : requests) {
    if (r->pending()) r->cancel();
  }
  // The op is failing already: a transport that throws now fails the group too (recorded),
  // and the peers are still cut off below, so that no request outlives the op's buffers.
  const auto recordFailure = [this](const char* during, const std::exception& e) {
    fail(transport_->name() + " rank " + std::to_string(transport_->rank()) + ": " + during +
         " failed while giving up on a failed op's requests: " + e.what());
  };
  // A cancel that settled its request at once (an unmatched receive: the tripwires of every
  // large broadcast and reduce end so) needs no progress: the rounds are for those still
  // settling.
  const auto anyPending = [&requests] {
    return std::any_of(requests.begin(), requests.end(),
                       [](const RequestPtr& r) { return r->pending(); });
  };
  try {
    for (int i = 0; i < 16 && anyPending(); ++i) {
      transport_->progress();
    }
  } catch (const std::exception& e) {
    recordFailure("progress()", e);
  }
  // Cancel cannot stop a send or a receive already matched to a rendezvous: the op's buffers
  // are about to be freed, so cut those peers off (the group is unusable with them anyway).
  for (const auto& r : requests) {
    const int peer = r->boundPeer();  // an any-source receive's, once it has taken a message
    if (r->pending() && peer >= 0) {
      try {
        transport_->abortPeer(peer, "connection to rank " + std::to_string(peer) +
                                        " was closed after an earlier op on it failed");
      } catch (const std::exception& e) {
        recordFailure("abortPeer()", e);
      }
    }
  }
  for (const auto& r : requests) {
    if (r->pending()) {
      r->keepAlive(currentKeepAlive_);  // last resort: at least the user's tensors survive
      leftBehind_ = true;
    }
  }
}

uint8_t* ProgressEngine::scratch(size_t bytes) {
  if (bytes > scratchBytes_) {
    scratch_ = std::make_unique_for_overwrite<uint8_t[]>(bytes);  // no zero-fill: all written
    scratchBytes_ = bytes;
  }
  return scratch_.get();
}

bool ProgressEngine::waitUntil(const std::vector<RequestPtr>& requests,
                               Clock::time_point deadline, Clock::time_point giveUpAt,
                               bool borrowed) {
  // Counted however the wait ends (done, handed over, failed): wait_stats() splits an op's
  // time into what it waited for.
  struct Timed {
    Clock::time_point began = Clock::now();
    ~Timed() { countWait(WaitFor::kTransport, Clock::now() - began); }
  } timed;
  // Ranks sharing a host see where this rank's driver waits, the caller of an inline op or
  // the progress thread of a queued one (see the top of the header). Only a pair: in a larger
  // group whose ranks outnumber the cores, every higher rank finds some lower rank on its
  // core at nearly every yield, and moving would only migrate it, twice per yield, for
  // nothing.
  StagingArea* const cores = transport_->size() == 2 ? staging_.get() : nullptr;
  if (cores) cores->publishCore(sched_getcpu());
  auto lastEvent = Clock::now();
  const auto barePollUntil = borrowed ? lastEvent + kBarePoll : lastEvent;
  bool published = false;
  for (;;) {
    bool done = true;
    for (const auto& r : requests) {
      if (r->failed()) {
        const std::string why = r->error();
        abandonPending(requests);
        throw PeerFailed(why);
      }
      done = done && !r->pending();
    }
    if (done) {
      return true;
    }
    if (stopping_.load()) {
      abandonPending(requests);
      throw OpFailed("the process group was shut down (abort or destroy) while the op ran");
    }
    if (transport_->progress()) {
      lastEvent = Clock::now();
      continue;
    }
    const auto now = Clock::now();
    throwIfTold(requests, now, false);
    if (now >= deadline) {
      std::string what;
      for (const auto& r : requests) {
        if (r->pending()) {
          what += (what.empty() ? "" : "; ") + describe(*r);
        }
      }
      abandonPending(requests);
      throw OpTimeout("no progress before the timeout; still waiting for: " + what);
    }
    if (now >= giveUpAt) {
      return false;
    }
    if (config_.mode == ProgressMode::kPoll) {
      sched_yield();
      continue;
    }
    if (now < barePollUntil) continue;  // kBarePoll
    // Spin politely: with more busy threads than cores (several ranks per core), a bare
    // spin holds the core the peer needs to make the progress we wait for. sched_yield
    // costs nothing when a core is free, and a slice when a thread that never yields shares
    // it: the progress thread, whose op may wait dozens of times, then sleeps instead
    // (crowded(), core_yield.h). A borrowing caller polls on: it loses at most one slice,
    // since it hands the op over at giveUpAt, `spin` after it began.
    // One that never gives up (Lease::wait's toTheEnd) waits as the thread would, but in a
    // pair that shares a host (`cores`), where its yields are what moves the higher rank off
    // a core both share.
    const bool pollsOn = borrowed && (giveUpAt != Clock::time_point::max() || cores != nullptr);
    if (now - lastEvent < config_.spin && (pollsOn || !crowded())) {
      const auto after = yieldCoreFrom(now);
      if (cores && after - now > kCrowdedYield) leaveSharedCore(sched_getcpu());
      continue;
    }
    if (!published) {
      std::string what;
      for (const auto& r : requests) {
        if (r->pending()) {
          what += (what.empty() ? "" : "; ") + describe(*r);
        }
      }
      setWaitingFor(std::move(what));
      published = true;
    }
    // Before a sleep, which lasts until the next message or 100 ms: a notice already here
    // would not wake it.
    throwIfTold(requests, now, true);
    if (borrowed && !leaseSleeps_.load(std::memory_order_relaxed)) {
      leaseSleeps_.store(true, std::memory_order_seq_cst);
    }
    sleepUntilEvent(waitEpollFd_, std::min(deadline, giveUpAt));
    lastEvent = Clock::now();
  }
}

void ProgressEngine::leaveSharedCore(int core) {
  if (core < 0) return;
  staging_->publishCore(core);
  bool shared = false;
  for (int peer = 0; peer < transport_->rank(); ++peer) {  // the higher rank of a pair moves
    shared = shared || staging_->peerCore(peer) == core;
  }
  if (!shared) return;
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;  // over 1024 cores: stay
  cpu_set_t others = allowed;
  CPU_CLR(core, &others);
  if (CPU_COUNT(&others) == 0) return;  // pinned to this core by its owner: stay
  if (sched_setaffinity(0, sizeof(others), &others) != 0) return;  // the kernel moves us now
  // Restoring the mask leaves this thread where it now runs.
  if (sched_setaffinity(0, sizeof(allowed), &allowed) != 0) {
    throw OpFailed(errnoMessage("restoring this thread's CPU affinity after leaving a core "
                                "shared with a peer rank: sched_setaffinity"));
  }
  coreMoves_.fetch_add(1, std::memory_order_relaxed);
  staging_->publishCore(sched_getcpu());
}

// --- inline ops ---------------------------------------------------------------------------------

std::unique_ptr<ProgressEngine::Lease> ProgressEngine::lend(const std::string& op, uint64_t seq,
                                                            std::shared_ptr<void> keepAlive) {
  if (std::this_thread::get_id() == threadId_.load()) return nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!queue_.empty() || taskRunning_ || lent_.load() || stopping_.load() || failed()) {
      return nullptr;
    }
    lent_.store(true);
  }
  // From here the thread starts no task and begins no idle pass; one may be under way (a
  // progress() call). Never wait for it long: it may be running a callback that issues an
  // op, and the caller may hold the backend's issue lock. A few yields cover a pass.
  std::unique_lock<std::mutex> owner(ownerMu_, std::try_to_lock);
  if (!owner.owns_lock()) {  // no clock reading in the common case
    const auto until = Clock::now() + kLendWait;
    while (!owner.owns_lock() && Clock::now() < until) {
      yieldCore();
      owner.try_lock();
    }
  }
  if (!owner.owns_lock() || !transport_ || stopping_.load()) {
    // Busy, or the thread ended between the check and here: the op is queued instead.
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      lent_.store(false);
      wake = !queue_.empty();
    }
    if (wake) {
      const uint64_t one = 1;
      (void)!write(wakeFd_, &one, sizeof(one));
    }
    return nullptr;
  }
  currentKeepAlive_ = std::move(keepAlive);
  leftBehind_ = false;
  return std::unique_ptr<Lease>(new Lease(*this, std::move(owner), op, seq));
}

ProgressEngine::Lease::Lease(ProgressEngine& engine, std::unique_lock<std::mutex> owner,
                             std::string op, uint64_t seq)
    : engine_(engine),
      owner_(std::move(owner)),
      op_(std::move(op)),
      seq_(seq),
      handOverAt_(Clock::now() + engine.config_.spin) {
  counted_ = engine_.traffic_.enabled() && !op_.empty();
  if (counted_) engine_.traffic_.beforeOp(*engine_.transport_);
}

bool ProgressEngine::Lease::wait(const std::vector<RequestPtr>& requests,
                                 Clock::time_point deadline, bool toTheEnd) {
  return engine_.waitUntil(requests, deadline, toTheEnd ? Clock::time_point::max() : handOverAt_,
                           /*borrowed=*/true);
}

void ProgressEngine::Lease::handOver(Task continuation) {
  std::lock_guard<std::mutex> lock(engine_.mu_);
  engine_.queue_.push_front(std::move(continuation));
  engine_.queued_.fetch_add(1, std::memory_order_seq_cst);
  handedOver_ = true;
}

ProgressEngine::Lease::~Lease() { engine_.endLease(*this); }

void ProgressEngine::endLease(Lease& lease) {
  if (lease.counted_) {
    try {
      traffic_.afterOp(*transport_, lease.op_, lease.seq_);
    } catch (...) {
    }
  }
  (lease.handedOver_ ? handedOver_ : inlineOps_).fetch_add(1, std::memory_order_relaxed);
  trafficDirty_ = true;
  currentKeepAlive_.reset();
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lent_.store(false);
    wake = !queue_.empty();
  }
  // A thread parked for kLongParkMs must not wait that long to listen again.
  if (leaseSleeps_.exchange(false, std::memory_order_seq_cst)) wake = true;
  lease.owner_.unlock();
  // Queued work (a handed-over op, ops posted meanwhile) must not wait for the thread's next
  // look. Without it the parked thread resumes listening within kParkMs by itself.
  if (wake) {
    const uint64_t one = 1;
    (void)!write(wakeFd_, &one, sizeof(one));
  }
}

}  // namespace ucxb
