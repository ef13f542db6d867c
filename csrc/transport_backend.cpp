// Construction, queuing, point-to-point, barrier and coalescing. Collectives live in
// collective_ops.cpp.
#include "csrc/transport_backend.hpp"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <optional>

#include "csrc/address_exchange.hpp"
#include "csrc/engine/core_yield.h"
#include "csrc/creation_liveness.hpp"
#include "csrc/device_memory.hpp"
#include "csrc/collectives/algorithms.h"
#include "csrc/collectives/scratch_size.h"
#include "csrc/handshake.h"
#include "csrc/p2p_withdraw.hpp"
#include "csrc/staging_setup.hpp"
#include "csrc/transport_factory.hpp"
#include "csrc/udp_auth_setup.hpp"
#include "transports/tag.h"

namespace ucxb {

namespace {

BackendOptions parseOptionsOrThrow(const std::map<std::string, std::string>& options) {
  try {
    return parseBackendOptions(options);
  } catch (const config::ConfigError& e) {
    const auto it = options.find("transport");
    throwBadOption(it == options.end() ? "ucxbackend" : it->second, e.what());
  }
}

// Test-only hooks (docs/testing.md#test-only-hooks), read once per group at creation.
const char* testHook(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// UCXBACKEND_TEST_SEQ_BITS=n: only the low n bits of the collective sequence number go into
// tags, so the field wraps after 2^n ops instead of 2^20 (a wrap within a test's reach).
uint64_t tagSeqMask(const std::string& backend) {
  const char* v = testHook("UCXBACKEND_TEST_SEQ_BITS");
  if (v == nullptr) return tag::kSeqMask;
  char* end = nullptr;
  const unsigned long bits = std::strtoul(v, &end, 10);
  if (*end != '\0' || bits < 1 || bits > static_cast<unsigned long>(tag::kSeqBits)) {
    throwBadOption(backend, "UCXBACKEND_TEST_SEQ_BITS (a test-only hook) must be 1.." +
                                std::to_string(tag::kSeqBits) + ", got '" + v + "'");
  }
  return (uint64_t{1} << bits) - 1;
}

// UCXBACKEND_TEST_FAULT_INJECTION=1: the group's transport is wrapped so that a test can make
// it throw (injectTransportFault).
std::shared_ptr<FaultSwitch> faultSwitch() {
  const char* v = testHook("UCXBACKEND_TEST_FAULT_INJECTION");
  return v != nullptr && std::string(v) == "1" ? std::make_shared<FaultSwitch>() : nullptr;
}

// UCXBACKEND_TEST_ANY_HOST=round|fail, set on every rank: the group takes the second exchange
// round as if its one-host guess had been proven wrong (Transport::reachesAll), and with
// "fail" this rank's second-round transport cannot be made, as when its worker fails.
enum class AnyHostHook { kNone, kRound, kFail };
AnyHostHook anyHostHook(const std::string& backend) {
  const char* v = testHook("UCXBACKEND_TEST_ANY_HOST");
  if (v == nullptr) return AnyHostHook::kNone;
  const std::string value = v;
  if (value == "round") return AnyHostHook::kRound;
  if (value == "fail") return AnyHostHook::kFail;
  throwBadOption(backend, "UCXBACKEND_TEST_ANY_HOST (a test-only hook) must be round or fail, "
                          "got '" + value + "'");
}

// What a send's or receive's task, request and callback hold of it. `held` (its DeviceHolds
// mark, cuda_wait=stream; else null) is declared first, so let go last: after every tensor,
// whose memory may be freed on the progress thread as it goes (device_holds.hpp).
struct P2PRefs {
  std::shared_ptr<void> held;
  c10::intrusive_ptr<TransportWork> work;
  at::Tensor tensor;
  at::Tensor staged;
  std::optional<DeviceOp> deviceOp;
};

// Fails `work` on the thread that ran its op, its Comm gone. A request the op gave up that
// the transport could not stop (`requestsLeft`: ProgressEngine::leftRequestsBehind) may still
// write into the op's tensors (UCX cannot stop a receive matched to an eager message whose
// last fragments are still arriving): they then stay pinned until the Work is destroyed,
// which that request's hold on it delays, as after abort(). Until 2026-11-27 a resize_() after
// the failure freed their memory under it.
void finishFailed(TransportWork& work, std::exception_ptr error, bool requestsLeft) {
  if (requestsLeft) {
    work.finishAborted(error);
  } else {
    work.finishError(error);
  }
}

// A task of `work`'s op, without its body: if the engine stops before running it, the Work
// fails naming why; until it has run, the Work (and so its tensors) stays alive.
Task taskFor(const c10::intrusive_ptr<TransportWork>& work, const char* op) {
  Task task;
  task.op = op;
  task.seq = work->context().seq;
  task.abandon = [work](const std::string& why) {
    work->finishError(toDistError(work->context(), std::make_exception_ptr(OpFailed(why))));
  };
  task.keepAlive = std::make_shared<c10::intrusive_ptr<TransportWork>>(work);
  return task;
}

// The kind of a collective, for its tags' fingerprint (tag::markedGroup): the variants of one
// collective that ranks may mix (a list or a flat all_gather, a coalesced or a single
// all_reduce, a direct or a staged reduce_scatter) are one kind.
int opKind(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::ALLREDUCE:
    case c10d::OpType::ALLREDUCE_COALESCED:
      return 1;
    case c10d::OpType::REDUCE:
      return 2;
    case c10d::OpType::BROADCAST:
      return 3;
    case c10d::OpType::ALLGATHER:
    case c10d::OpType::_ALLGATHER_BASE:
    case c10d::OpType::ALLGATHER_COALESCED:
      return 4;
    case c10d::OpType::GATHER:
      return 5;
    case c10d::OpType::SCATTER:
      return 6;
    case c10d::OpType::REDUCE_SCATTER:
    case c10d::OpType::_REDUCE_SCATTER_BASE:
      return 7;
    case c10d::OpType::ALLTOALL:
    case c10d::OpType::ALLTOALL_BASE:
      return 8;
    case c10d::OpType::BARRIER:
      return 9;
    default:
      return 0;
  }
}

// The group field of `type`'s tags for these inputs (tag::markedGroup).
uint32_t tagGroupOf(uint32_t groupHash, c10d::OpType type, const OpInputs& inputs) {
  const int64_t dtype =
      inputs.tensors.empty() ? -1 : static_cast<int64_t>(inputs.tensors[0].scalar_type());
  return tag::markedGroup(groupHash, {opKind(type), dtype, inputs.reduceOp, inputs.root});
}

}  // namespace

TransportBackend::TransportBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout, std::string groupId,
                                 std::vector<int64_t> globalRanks,
                                 const std::map<std::string, std::string>& options)
    : c10d::Backend(rank, size),
      store_(store),
      rawOptions_(options),
      options_(parseOptionsOrThrow(options)),
      backendName_(options_.transport),
      timeout_(timeout),
      groupId_(std::move(groupId)),
      groupHash_(tag::groupHash(groupId_.c_str())),
      globalRanks_(std::move(globalRanks)),
      engineConfig_(options_.engine()),
      tuning_(options_.tuning()),
      deviceTuning_(options_.tuning(/*deviceMemory=*/true)),
      holds_(options_.cudaWait == "stream" ? std::make_shared<DeviceHolds>() : nullptr),
      running_(std::make_shared<std::atomic<const TransportWork*>>(nullptr)),
      tagSeqMask_(tagSeqMask(backendName_)),
      faults_(faultSwitch()) {
  if (static_cast<uint64_t>(size) > tag::kMaxRanks) {
    throwInvalid("init", rank, "groups are limited to " + std::to_string(tag::kMaxRanks) + " ranks");
  }
  std::unique_ptr<Transport> transport;
  std::unique_ptr<StagingArea> staging;
  std::optional<AddressExchange::DeferredCleanup> cleanup;
  PhaseClock clock(profile_);
  try {
    AddressExchange exchange(*store_, groupId_, rank, size, profile_.store);
    clock.mark("join");
    testKillPoint("joined");  // before this rank's transport and record exist
    // A secret file this rank cannot use (or a build without OpenSSL) fails the creation on
    // every rank: the reason goes into this rank's record, where every other rank finds it as
    // a disagreeing setting, and is thrown here only after the exchange, instead of this rank
    // leaving before it and the others waiting for the Store's timeout.
    std::optional<udp::AuthKey> groupKey;
    std::optional<config::ConfigError> unusableSecret;
    try {
      groupKey = udpGroupKey(options_, groupId_, exchange);
    } catch (const config::ConfigError& e) {
      unusableSecret = e;
    }
    // A transport this rank cannot make (its UCP worker, its socket, a udp_config that its
    // interface refuses) fails the creation on every rank in the same way: the reason goes
    // into this rank's record in place of an address (kFailedSetting), every other rank fails
    // at once naming this rank and the reason, and this rank throws its own error after the
    // exchange. Before, it threw at once, and the others waited for its record until the
    // Store's timeout.
    const AnyHostHook hook = anyHostHook(backendName_);
    std::exception_ptr buildFailure;
    std::string buildFailureWhy;
    const auto build = [&](bool anyHost) {
      try {
        if (anyHost && hook == AnyHostHook::kFail) {
          throw TransportError("injected: no transport that reaches any host could be made "
                               "(UCXBACKEND_TEST_ANY_HOST=fail, a test-only hook)");
        }
        transport = makeTransport(options_, rank, size, exchange, timeout, groupKey, anyHost);
        if (faults_) {
          transport = std::make_unique<FaultInjectingTransport>(std::move(transport), faults_);
        }
      } catch (const std::exception& e) {
        transport.reset();
        buildFailure = std::current_exception();
        buildFailureWhy = e.what();
      }
    };
    // This rank's record for a round: its address, or the reason it has none.
    const auto publish = [&](Handshake& record) {
      if (transport) {
        record.address = transport->localAddress();
      } else {
        record.settings.push_back({kFailedSetting, failedValue(buildFailureWhy)});
      }
    };
    build(/*anyHost=*/false);
    clock.mark("transport");
    StagingOffer offer =
        transport ? offerStaging(options_, *transport, tuning_.chunkBytes) : StagingOffer{};
    clock.mark("shm_offer");
    // One Store round carries every rank's address, transport, must-agree settings and
    // shared-memory offer; all are checked before the transport sees a peer's address.
    Handshake mine{options_.transport,
                   withKeyCheck(agreedSettings(options_), options_, groupKey,
                                unusableSecret ? unusableSecret->what() : ""),
                   {}};
    mine.settings.push_back({kMembersSetting, membersValue(globalRanks_)});
    publish(mine);
    const auto records =
        exchange.exchange({encodeHandshake(mine), {offer.text.begin(), offer.text.end()}});
    clock.mark("exchange");
    if (unusableSecret) throw *unusableSecret;
    if (buildFailure) std::rethrow_exception(buildFailure);
    std::vector<std::vector<uint8_t>> handshakes;
    std::vector<std::string> offers;
    for (const auto& parts : records) {
      handshakes.push_back(parts[0]);
      offers.emplace_back(parts[1].begin(), parts[1].end());
    }
    auto addresses = checkHandshakes(rank, mine, handshakes);
    if (!transport->reachesAll(addresses) || hook != AnyHostHook::kNone) {
      // A ucx rank guessed that the group shares its host, and the addresses name another
      // host (every rank reads the same answer from them): every rank makes a transport that
      // reaches any host, also one whose first transport did (only a wrong guess pays for
      // that), and publishes its address in a second round. Only the addresses change; the
      // settings and shared-memory offers checked above stand.
      testKillPoint("between_rounds");
      transport.reset();
      build(/*anyHost=*/true);
      Handshake wide{mine.transport, mine.settings, {}};
      publish(wide);
      std::vector<std::vector<uint8_t>> wideHandshakes;
      for (auto& parts : exchange.exchange({encodeHandshake(wide)})) {
        wideHandshakes.push_back(std::move(parts[0]));
      }
      if (buildFailure) std::rethrow_exception(buildFailure);
      addresses = checkHandshakes(rank, wide, wideHandshakes);
      clock.mark("any_host");
    }
    profile_.transports = transport->lowerTransports();
    // Hands the transport every address; ucx connects a peer on first use (no all-to-all
    // connection, hence no barrier: see ucx_transport.h).
    for (int p = 0; p < size; ++p) {
      transport->connect(p, addresses[p]);
    }
    clock.mark("connect");
    // Whose threads a lost yield counts as ours: this host's ranks, each with its transport's
    // own (a send lane exists from connect on).
    noteRanksOnHost(exchange.ranksOnHost(), kThreadsPerRank + transport->threadsOfItsOwn());
    staging = setUpStaging(options_, std::move(offer), offers, rank, exchange);
    clock.mark("shm_agree");
    testKillPoint("before_complete");
    exchange.complete();  // the last rank here deletes the creation's Store keys
    cleanup = exchange.takeDeferredCleanup();  // or leaves them to the thread below
    clock.mark("cleanup");
    crowdAtStart(exchange.ranksOnHost());
  } catch (const config::ConfigError& e) {
    throwBadOption(backendName_, e.what());  // e.g. udp_config against the interface's MTU
  } catch (const TransportError& e) {
    throwSetupFailed(backendName_, groupId_, rank, e.what());
  } catch (const HandshakeMismatch& e) {
    throwSetupFailed(backendName_, groupId_, rank, e.what());
  } catch (const SetupError& e) {
    throwSetupFailed(backendName_, groupId_, rank, e.what());
  } catch (const c10::DistNetworkError& e) {
    // The Store's connection broke where no wait was there to name who the creation lost.
    throwSetupFailed(backendName_, groupId_, rank,
                     "the c10d Store stopped answering (a TCPStore dies with the process that "
                     "hosts it: rank 0's, for init_process_group's): " +
                         std::string(e.what_without_backtrace()));
  }
  sharedMemory_ = staging != nullptr;
  transportCarriesDevice_ = transport->carriesDeviceMemory();
  // A transport that stages device memory through the host (udp, the shm rings) has no device
  // buffer of a peer to map: its CUDA all_reduce never asks (the same transport on every rank,
  // so every rank decides alike).
  if (!transportCarriesDevice_) deviceTuning_.peerMap = algo::PeerMapMode::kOff;
  // A peer's failure notice fails every unsettled op of the group at once, as abort() does,
  // naming that peer and its first failure (docs/failure-model.md#what-a-failed-group-does).
  NoticeSetup notices{groupHash_, [works = works_](const std::string& reason) {
                        for (auto& work : works->takeAll()) {
                          work->finishAborted(toDistError(
                              work->context(), std::make_exception_ptr(PeerFailed(reason))));
                        }
                      }};
  // Where no thread can be had (the process is at its thread limit), the keys left to the
  // clean-up thread below are deleted here, on the critical path, as where rank 0 hosts the Store.
  const auto cleanUpNow = [&] {
    if (cleanup) AddressExchange::runCleanup(*store_, *cleanup);
  };
  try {
    testThreadStartPoint("progress");
    engine_ = ProgressEngine::start(std::move(transport), engineConfig_, std::move(staging),
                                    std::move(notices));
  } catch (const std::system_error& e) {
    cleanUpNow();
    throwSetupFailed(backendName_, groupId_, rank,
                     std::string("could not start the group's progress thread (") + e.what() +
                         "): is the process at its thread limit (ulimit -u, a cgroup's "
                         "pids.max)?");
  }
  probe_ = std::make_shared<const TransportWork::Probe>(
      [engine = std::weak_ptr<ProgressEngine>(engine_),
       running = running_](const TransportWork& work) -> std::string {
        auto e = engine.lock();
        if (!e) return "the process group was shut down";
        if (running->load() != &work) return {};
        return e->waitingFor();
      });
  clock.mark("engine");
  if (cleanup) {
    // Off the first op's critical path; joined before the group goes (shutdown). The keys are
    // copied into the thread, so that they are still here if it cannot be started.
    try {
      testThreadStartPoint("store_cleanup");
      storeCleanup_ = std::thread(
          [store = store_, deferred = *cleanup] { AddressExchange::runCleanup(*store, deferred); });
    } catch (const std::system_error&) {
      cleanUpNow();  // the group works without the thread: only its start is slower
    }
  }
}

TransportBackend::~TransportBackend() { shutdown(); }

TrafficSnapshot TransportBackend::traffic() const {
  return engine_ ? engine_->traffic() : TrafficSnapshot{};
}

std::vector<OpTraceSeries> TransportBackend::drainTraceSeries() {
  return engine_ ? engine_->drainTraceSeries() : std::vector<OpTraceSeries>{};
}

void TransportBackend::shutdown() {
  if (engine_) {
    engine_->stop();
  }
  if (holds_) holds_->clear();
  // shutdown() and the destructor may run on two threads at once; std::thread::join may not.
  std::lock_guard<std::mutex> lock(storeCleanupMu_);
  if (storeCleanup_.joinable()) storeCleanup_.join();
}

void TransportBackend::abort() {
  if (!engine_) return;
  const std::string why = backendName_ + " rank " + std::to_string(getRank()) +
                          ": the process group was aborted (abort() on this rank)";
  // Recorded first: ops issued from now on are refused (makeWork lists a Work before its
  // refuseIfFailed check, so each Work is either listed below or refused). Ignored if the
  // group failed before: the first failure wins.
  engine_->fail(why, FailureKind::kAborted);
  const auto unsettled = works_->takeAll();
  // Failed here, on the caller's thread, before the thread is asked to stop: a running op
  // then ends with this error, not with the thread's "shut down", and nothing waits for the
  // thread (which may be stuck). It may still touch the op's buffers until it notices.
  const std::string first = engine_->failure();
  const std::string reason =
      first == why ? "the process group was aborted while the op was pending (abort() on rank " +
                         std::to_string(getRank()) + ")"
                   : "the process group was aborted while the op was pending; it had failed "
                     "before: " + first;
  for (auto& work : unsettled) {
    // Settles it unless the thread did first; Future callbacks run here. Its tensors stay
    // pinned until the Work is destroyed: the thread may still write into them.
    work->finishAborted(toDistError(work->context(), std::make_exception_ptr(OpFailed(reason))));
  }
  engine_->abort(why);
}

c10::intrusive_ptr<c10d::Backend> TransportBackend::makeChild(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks, const char* kind,
    const c10::intrusive_ptr<Options>& opts) {
  const auto me = std::find(ranks.begin(), ranks.end(), getRank());
  if (me == ranks.end()) return {};
  std::string members;
  std::vector<int64_t> globalRanks;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= getSize() || (i > 0 && r <= ranks[i - 1])) {
      throwInvalid(kind, getRank(),
                   "ranks must be sorted distinct ranks of the group (0.." +
                       std::to_string(getSize() - 1) + "), got " + std::to_string(r) +
                       " at index " + std::to_string(i),
                   backendName_);
    }
    members += (i > 0 ? "," : "") + std::to_string(r);
    globalRanks.push_back(globalRanks_.at(static_cast<size_t>(r)));
  }
  // Counted per kind and member set: every member of this child has made exactly the same
  // earlier children of this set from this group (torch does not call split on a rank that
  // is in no child, so a count over all splits would differ between ranks).
  std::string id = groupId_ + ":" + kind + ":" + members + ":";
  {
    std::lock_guard<std::mutex> lock(splitMu_);
    id += std::to_string(childCounts_[id]++);
  }
  const auto timeout = opts ? opts->timeout : timeout_.load();
  return c10::make_intrusive<TransportBackend>(store, static_cast<int>(me - ranks.begin()),
                                               static_cast<int>(ranks.size()), timeout,
                                               std::move(id), std::move(globalRanks),
                                               rawOptions_);
}

c10::intrusive_ptr<c10d::Backend> TransportBackend::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  {
    std::lock_guard<std::mutex> lock(splitMu_);
    if (lastSplitStore_ && lastSplitStore_.get() == store.get() && lastSplitRanks_ == ranks) {
      return lastSplitChild_;
    }
  }
  // This group's Store, not torch's (a prefix of the child's name over a clone of the parent
  // ProcessGroup's Store): the child's id already names the parent, the ranks and the count.
  auto child = makeChild(store_, ranks, "split", opts);
  std::lock_guard<std::mutex> lock(splitMu_);
  lastSplitStore_ = store;
  lastSplitRanks_ = ranks;
  lastSplitChild_ = child;
  return child;
}

c10::intrusive_ptr<c10d::Backend> TransportBackend::shrink(
    const std::vector<int64_t>& ranksToExclude, int flags,
    const c10::intrusive_ptr<Options>& opts) {
  std::vector<int> survivors;
  for (int r = 0; r < getSize(); ++r) {
    if (std::find(ranksToExclude.begin(), ranksToExclude.end(), r) == ranksToExclude.end()) {
      survivors.push_back(r);
    }
  }
  for (const int64_t r : ranksToExclude) {
    if (r < 0 || r >= getSize() || r == getRank()) {
      throwInvalid("shrink", getRank(),
                   "ranks_to_exclude must be other ranks of the group (0.." +
                       std::to_string(getSize() - 1) + "), got " + std::to_string(r),
                   backendName_);
    }
  }
  if (flags & 1) abort();  // SHRINK_ABORT
  return makeChild(store_, survivors, "shrink", opts);
}

c10d::ErrorType TransportBackend::getError() {
  switch (engine_ ? engine_->failureKind() : FailureKind::kNone) {
    case FailureKind::kNone:
      return c10d::ErrorType::SUCCESS;
    case FailureKind::kTimeout:
      return c10d::ErrorType::TIMEOUT;
    case FailureKind::kPeer:
      return c10d::ErrorType::REMOTE_ERROR;
    case FailureKind::kAborted:
    case FailureKind::kLocal:
      break;
  }
  return c10d::ErrorType::COMM_ERROR;
}

void TransportBackend::injectTransportFault(const std::string& where) {
  if (!faults_) {
    throwInvalid("inject_transport_fault", getRank(),
                 "the group was created without UCXBACKEND_TEST_FAULT_INJECTION=1", backendName_);
  }
  if (where != "progress" && where != "arm") {
    throwInvalid("inject_transport_fault", getRank(),
                 "where must be 'progress' or 'arm', got '" + where + "'", backendName_);
  }
  faults_->arm(where == "progress" ? FaultSwitch::Where::kProgress : FaultSwitch::Where::kArm);
  // Wake the idle thread: after this no-op it goes back to progress() and arm().
  Task wake;
  wake.run = [] {};
  engine_->post(std::move(wake));
}

uint64_t TransportBackend::injectedTransportFolds() const {
  if (!faults_) {
    throwInvalid("transport_fault_counts", getRank(),
                 "the group was created without UCXBACKEND_TEST_FAULT_INJECTION=1", backendName_);
  }
  return faults_->folds();
}

bool TransportBackend::refuseIfFailed(ProgressEngine& engine, TransportWork& work) {
  if (!engine.failed()) return false;
  work.finishError(
      toDistError(work.context(), std::make_exception_ptr(GroupFailed(engine.failure()))));
  return true;
}

std::shared_ptr<StreamGate> TransportBackend::heldGate(
    const std::optional<c10::Device>& device) {
  return holds_ && device ? devices_.gate(*device) : nullptr;
}

DeviceNeeds TransportBackend::reducingNeeds(algo::Op op, size_t count,
                                                             size_t esz, bool allocates) const {
  return {algo::scratchBytes(deviceTuning_, op, count, esz, getSize(), /*deviceMemory=*/true),
          allocates || !transportCarriesDevice_};
}

bool TransportBackend::issueOrFail(const std::optional<c10::Device>& device, TransportWork& work,
                                   std::optional<DeviceOp>& deviceOp) {
  try {
    // Sends and receives use no scratch; the gate goes with them so that one failing the
    // group releases every held stream (device_op.hpp).
    deviceOp = issueOnDevice(device, devices_, 0, heldGate(device));
    return true;
  } catch (...) {
    // A CUDA error recording the ready event: this op fails, the group stays usable (nothing
    // was posted), and the Work ends like every other.
    work.finishError(toDistError(work.context(), std::current_exception()));
    return false;
  }
}

std::chrono::milliseconds TransportBackend::timeoutFor(std::chrono::milliseconds requested) const {
  return requested == c10d::kUnsetTimeout ? timeout_.load() : requested;
}

c10::intrusive_ptr<TransportWork> TransportBackend::makeWork(const char* op, c10d::OpType type,
                                                             std::optional<c10::Device> device,
                                                             std::vector<at::Tensor> outputs,
                                                             OpInputs inputs,
                                                             std::chrono::milliseconds timeout,
                                                             bool allocates) {
  const bool p2p = type == c10d::OpType::SEND || type == c10d::OpType::RECV ||
                   type == c10d::OpType::RECVANYSOURCE;
  OpContext ctx{op, getRank(), getSize(), p2p ? ++p2pSeq_ : ++collectiveSeq_,
                std::move(inputs.text), backendName_};
  std::shared_ptr<FlightEntry> flight;
  if (flight_) {
    FlightOp f;
    f.pgName = getGroupUid();
    f.pgDesc = getGroupDesc();
    (p2p ? f.p2pSeq : f.collectiveSeq) = ctx.seq;
    f.profilingName = backendName_ + ":" + op;
    f.inputs = inputs.tensors;
    f.outputs = outputs;
    f.timeout = timeout;
    flight = FlightRecorder::instance().record(flight_, std::move(f));
  }
  std::vector<c10::Device> devices;
  if (device) devices.push_back(*device);
  auto work = c10::make_intrusive<TransportWork>(std::move(ctx), type, std::move(outputs), timeout,
                                                 std::move(devices));
  work->pinStorages(inputs.tensors);  // and its outputs, until the Work settles
  work->setFlightEntry(std::move(flight));
  work->setSpin(engineConfig_.spin);
  // cuda_wait=stream (docs/cuda.md): wait() holds the caller's stream through the gate.
  // Collectives end in issue order, which the gate's one word per device relies on; sends
  // and receives do not (their wait() blocks the host).
  if (device && !p2p && options_.cudaWait == "stream") {
    work->setDeviceGate(*device, devices_.gate(*device));  // null: wait() waits on the host
  }
  // Numbered in the progress thread's order: a collective's caller holds issueMu_ until its
  // task is queued. A CUDA send or receive takes its number under issueMu_ too (enqueueP2P)
  // and is queued a little later, after ops with higher numbers maybe: a wait() then sees it
  // marked ahead of an op it runs behind, which only errs towards waiting on the host. CPU
  // ops of the group are numbered too: one whose Future is taken is marked like a CUDA op's
  // (getFuture), since a callback chained on it runs on the progress thread and may allocate
  // CUDA memory there.
  if (holds_) work->setHolds(holds_, holds_->nextTicket(), device && allocates);
  work->setProbe(probe_);
  {
    std::lock_guard<std::mutex> lock(coalesceMu_);
    if (coalescing_) coalesced_.push_back(work);
  }
  works_->add(work);
  return work;
}

void TransportBackend::WorkList::add(const c10::intrusive_ptr<TransportWork>& work) {
  std::lock_guard<std::mutex> lock(mu);
  if (works.size() >= pruneAt) {
    std::erase_if(works, [](const c10::weak_intrusive_ptr<TransportWork>& w) {
      auto live = w.lock();
      return !live || live->isCompleted();
    });
    pruneAt = std::max<size_t>(64, 2 * works.size());
  }
  works.emplace_back(work);
}

std::vector<c10::intrusive_ptr<TransportWork>> TransportBackend::WorkList::takeAll() {
  std::vector<c10::intrusive_ptr<TransportWork>> live;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& w : works) {
    if (auto work = w.lock()) live.push_back(std::move(work));
  }
  works.clear();
  return live;
}

c10::intrusive_ptr<c10d::Work> TransportBackend::enqueue(const char* op, c10d::OpType type,
                                                        std::optional<c10::Device> device,
                                                        std::vector<at::Tensor> outputs,
                                                        OpInputs inputs,
                                                        std::chrono::milliseconds timeout,
                                                        QueuedBody body, PostBody inlineBody,
                                                        const std::function<void()>& alsoIssue,
                                                        DeviceNeeds needs) {
  // From its sequence number to its place in the queue (or its lease), an op is issued
  // under issueMu_: ops that threads issue concurrently then run in the order of their
  // numbers on every rank. Peers match ops by number, so two ranks running a pair in
  // opposite orders would each wait in the op the other has queued behind.
  c10::intrusive_ptr<TransportWork> work;
  std::unique_ptr<ProgressEngine::Lease> lease;
  std::exception_ptr deviceError;
  const uint32_t tagGroup = tagGroupOf(groupHash_, type, inputs);
  // What earlier CUDA ops left for a caller's thread to let go (device_holds.hpp).
  if (device && holds_) holds_->prune();
  {
    std::lock_guard<std::mutex> issue(issueMu_);
    work = makeWork(op, type, device, std::move(outputs), std::move(inputs), timeout,
                    needs.allocates);
    if (alsoIssue) alsoIssue();
    if (!engine_->failed()) {
      // The caller's thread has no device stream to order the op after: the inline run is a
      // host path (takesHostPaths), asked here only.
      if (inlineBody && takesHostPaths(memoryOf(device))) {
        lease = engine_->lend(op, work->context().seq,
                              std::make_shared<c10::intrusive_ptr<TransportWork>>(work));
      }
      if (!lease) {
        // Ordered after what the caller queued on its current stream, with its scratch
        // allocated here, on the caller's thread (device_op.hpp).
        std::optional<DeviceOp> deviceOp;
        try {
          deviceOp = issueOnDevice(device, devices_, needs.scratchBytes, heldGate(device));
          std::unique_ptr<DeviceHolds::Mark> mark;
          if (device && holds_ && needs.allocates) {
            mark = std::make_unique<DeviceHolds::Mark>(holds_, work->ticket());
          }
          queueTask(work, op, tagGroup, std::move(deviceOp), timeout, body.take(),
                    std::move(mark));
        } catch (...) {
          deviceError = std::current_exception();
        }
      }
    }
  }
  // Settled outside issueMu_: Future callbacks may issue ops.
  if (refuseIfFailed(*work)) return work;
  if (deviceError) {
    // A CUDA error recording the ready event, or no device memory for the op's scratch. The
    // op took its number, so the peers run it and would wait for this rank's part until
    // their timeout, and a later op could not make up for it: the group fails, and its
    // notice tells the peers at once why (as a failure on the progress thread does). The
    // Work ends like every other but for the gate, which an op still running before it
    // holds (finishUnissued).
    const auto error = toDistError(work->context(), deviceError);
    engine_->fail(messageOf(error), failureKindOf(deviceError));
    work->finishUnissued(error);
    return work;
  }
  if (lease) runInline(work, op, tagGroup, timeout, inlineBody, std::move(lease));
  return work;
}

void TransportBackend::runQueued(ProgressEngine& engine,
                                 std::atomic<const TransportWork*>& running, uint32_t group,
                                 const c10::intrusive_ptr<TransportWork>& work, const Body& body,
                                 std::chrono::milliseconds timeout, const algo::Tuning& tuning,
                                 uint64_t seqMask, const std::optional<DeviceOp>& deviceOp,
                                 bool carries) {
  if (refuseIfFailed(engine, *work)) return;  // the group failed while this op was queued
  running.store(work.get());
  work->markStarted();
  // Staging copies must not be recorded by autograd (the caller's grad mode is not ours).
  at::NoGradGuard noGrad;
  std::optional<DeviceScope> scope;  // outlives finishOk: the Future records its event on it
  try {
    const auto deadline = Clock::now() + timeout;
    work->setOwnDeadline(deadline);
    scope.emplace(deviceOp, deadline);
    std::optional<DeviceMemory> memory;
    if (deviceOp) {
      memory.emplace(deviceOp->device, deviceOp->stream, carries, deadline, deviceOp->scratch);
    }
    Comm comm(engine.transport(), engine, group, work->context().seq & seqMask, deadline,
              tuning, memory ? &*memory : nullptr);
    // The op's device scratch may go with the group, which an abort() lets go before this
    // thread has let go of the transport: a request given up that still writes into the
    // scratch holds it (Comm::keep).
    if (deviceOp && deviceOp->scratch) comm.keep(deviceOp->scratch);
    work->checkTensorsFit();
    body(comm);
    scope->drain();
  } catch (...) {
    // Whatever failed, this rank's part of the op is incomplete, and a peer's message for it
    // may still arrive: the group refuses every later op (recorded before the Work fails, so
    // that the caller's next op already finds the group failed). Finish before clearing
    // `running`: a caller whose own wait() deadline falls while the op is failing must still
    // find what it waits for in the probe, not an idle engine.
    const auto error = toDistError(work->context(), std::current_exception());
    engine.fail(messageOf(error), failureKindOf(std::current_exception()));
    // No stream stays held by an op the failure refuses: what this op left behind may free
    // device memory on this thread later (device_holds.hpp).
    if (deviceOp && deviceOp->gate) deviceOp->gate->releaseAll();
    // Device work of the failed op may still write its tensors: let it end (within the
    // op's timeout again) before the caller is told, and may free or reuse them.
    if (scope) {
      try {
        scope->drainFor(timeout);
      } catch (...) {
      }
    }
    finishFailed(*work, error, engine.leftRequestsBehind());
    running.store(nullptr);
    return;
  }
  work->finishOk();
  running.store(nullptr);
}

void TransportBackend::queueTask(const c10::intrusive_ptr<TransportWork>& work, const char* op,
                                 uint32_t tagGroup, std::optional<DeviceOp> deviceOp,
                                 std::chrono::milliseconds timeout, Body body,
                                 std::unique_ptr<DeviceHolds::Mark> mark) {
  Task task = taskFor(work, op);
  const algo::Tuning& opTuning = deviceOp ? deviceTuning_ : tuning_;
  if (deviceOp && holds_) {
    // cuda_wait=stream: everything the task holds of the op (its Work, tensors, scratch) in
    // one object that holds_ keeps too, so that the last of it goes on a caller's thread
    // (device_holds.hpp); the mark, when it allocates, goes with it.
    struct Held {
      std::unique_ptr<DeviceHolds::Mark> mark;  // first: let go last
      c10::intrusive_ptr<TransportWork> work;
      Body body;
      std::optional<DeviceOp> deviceOp;
    };
    auto held = std::make_shared<Held>(
        Held{std::move(mark), work, std::move(body), std::move(deviceOp)});
    holds_->keep(held);
    task.abandon = [held](const std::string& why) {
      held->work->finishError(
          toDistError(held->work->context(), std::make_exception_ptr(OpFailed(why))));
    };
    task.keepAlive = held;
    task.run = [engine = engine_.get(), running = running_, group = tagGroup, held, timeout,
                tuning = deviceTuning_, seqMask = tagSeqMask_, carries = transportCarriesDevice_]() {
      runQueued(*engine, *running, group, held->work, held->body, timeout, tuning, seqMask,
                held->deviceOp, carries);
    };
    engine_->post(std::move(task));
    return;
  }
  // No `this`: the group can be destroyed while its running op unwinds (a callback on the
  // progress thread dropping the last reference); the engine outlives its own thread.
  task.run = [engine = engine_.get(), running = running_, group = tagGroup, work,
              body = std::move(body), timeout, tuning = opTuning, seqMask = tagSeqMask_,
              deviceOp = std::move(deviceOp), carries = transportCarriesDevice_]() {
    runQueued(*engine, *running, group, work, body, timeout, tuning, seqMask, deviceOp,
              carries);
  };
  engine_->post(std::move(task));
}

void TransportBackend::runInline(const c10::intrusive_ptr<TransportWork>& work, const char* op,
                                 uint32_t tagGroup,
                                 std::chrono::milliseconds timeout, PostBody post,
                                 std::unique_ptr<ProgressEngine::Lease> lease) {
  running_->store(work.get());
  work->markStarted();  // on this thread: it is the one running the op
  at::NoGradGuard noGrad;  // as on the progress thread: the caller's grad mode is not ours
  std::exception_ptr failure;
  {
    const auto deadline = Clock::now() + timeout;
    work->setOwnDeadline(deadline);
    // Declared before the Comm, so destroyed after it: the Comm gives up the requests still
    // posted when the op fails, and until then they may write into the op's notice buffers.
    Posted posted;
    auto comm = std::make_shared<Comm>(lease->transport(), *engine_, tagGroup,
                                       work->context().seq & tagSeqMask_, deadline, tuning_);
    try {
      posted = post(*comm);
      bool complete = false;
      while (lease->wait(posted.op->requests(), deadline, posted.callerWaits)) {
        comm->completed(posted.op->requests());
        complete = posted.op->advance(*comm);
        if (complete) break;
      }
      if (!complete) {
        // A peer is late: the progress thread waits for the rest, so that an async caller
        // is not held. The continuation owns the posted requests and the Comm (which gives
        // up whatever is still posted if the op fails).
        // One object holds both, the Comm last so that it goes first (as above).
        struct InFlight {
          Posted posted;
          std::shared_ptr<Comm> comm;
        };
        Task task = taskFor(work, op);
        task.run = [engine = engine_.get(), running = running_, work,
                    flight = std::make_shared<InFlight>(InFlight{std::move(posted), comm})]() {
          running->store(work.get());
          at::NoGradGuard noGrad;
          try {
            flight->posted.op->finish(*flight->comm);
            if (flight->posted.after) flight->posted.after();
          } catch (...) {
            const auto error = toDistError(work->context(), std::current_exception());
            engine->fail(messageOf(error), failureKindOf(std::current_exception()));
            finishFailed(*work, error, engine->leftRequestsBehind());
            running->store(nullptr);
            return;
          }
          work->finishOk();
          running->store(nullptr);
        };
        running_->store(nullptr);
        lease->handOver(std::move(task));
        return;
      }
      if (posted.after) posted.after();
    } catch (...) {
      failure = std::current_exception();
    }
  }  // the Comm gives up what is still posted while this thread owns the transport
  // As on the normal path, a failure fails the group before the Work, so that the caller's
  // next op already finds it failed.
  std::exception_ptr error;
  if (failure) {
    error = toDistError(work->context(), failure);
    engine_->fail(messageOf(error), failureKindOf(failure));
  }
  running_->store(nullptr);
  const bool requestsLeft = engine_->leftRequestsBehind();  // asked while this thread drives
  lease.reset();  // Future callbacks below may issue ops: those may go inline too
  if (error) {
    finishFailed(*work, error, requestsLeft);
  } else {
    work->finishOk();
  }
}

// --- point-to-point ---------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> TransportBackend::enqueueP2P(const char* op, c10d::OpType type,
                                                           std::optional<c10::Device> device,
                                                           at::Tensor tensor, int peer,
                                                           uint64_t tag, uint64_t mask) {
  c10::intrusive_ptr<TransportWork> work;
  // cuda_wait=stream: the op may call into torch's allocators on the progress thread (a
  // contiguous copy, udp's pinned staging, their frees), so it is marked until all it holds
  // there is gone (device_holds.hpp), numbered under issueMu_ in the collectives' order.
  std::shared_ptr<void> held;
  if (device && holds_) {
    holds_->prune();
    {
      std::lock_guard<std::mutex> issue(issueMu_);
      work = makeWork(op, type, device, {tensor}, tensor, timeout_.load());
    }
    held = std::make_shared<DeviceHolds::Mark>(holds_, work->ticket());
    holds_->keep(held);
  } else if (holds_) {
    // A CPU send or receive of a stream-mode group: numbered in the same order (makeWork).
    std::lock_guard<std::mutex> issue(issueMu_);
    work = makeWork(op, type, device, {tensor}, tensor, timeout_.load());
  } else {
    work = makeWork(op, type, device, {tensor}, tensor, timeout_.load());
  }
  if (refuseIfFailed(*work)) return work;
  std::optional<DeviceOp> deviceOp;
  if (!issueOrFail(device, *work, deviceOp)) return work;
  // udp stages a CUDA tensor through pinned host memory; ucx moves it as it is.
  const bool hostStaged = deviceOp && !transportCarriesDevice_;
  const MemoryType mem = hostStaged ? MemoryType::kHost : memoryOf(device);
  const bool isSend = type == c10d::OpType::SEND;
  // The posted request, seen only on the progress thread: a caller whose wait() times out
  // withdraws it, so that a retried recv is not robbed by the abandoned one. A withdrawn
  // request that then fails (cancelled) does not fail the group: nothing of it is left.
  auto posted = std::make_shared<std::weak_ptr<Request>>();
  auto withdrawn = std::make_shared<std::atomic<bool>>(false);
  std::weak_ptr<ProgressEngine> weakEngine = engine_;
  work->setOnWaitTimeout([weakEngine, posted, withdrawn, ctx = work->context()]() {
    withdrawn->store(true);
    if (auto engine = weakEngine.lock()) withdrawAndWait(engine, posted, ctx);
  });
  Task task;
  // The engine outlives its thread, on which this task and the request's callback run.
  task.run = [engine = engine_.get(), refs = P2PRefs{held, work, tensor, {}, deviceOp}, peer,
              tag, mask, isSend, posted, withdrawn, hostStaged, mem,
              timeout = timeout_.load()]() {
    const auto& work = refs.work;
    const auto& tensor = refs.tensor;
    const auto& deviceOp = refs.deviceOp;
    if (refuseIfFailed(*engine, *work)) return;
    at::NoGradGuard noGrad;
    try {
      DeviceScope scope(deviceOp, Clock::now() + timeout);
      work->checkTensorsFit();
      at::Tensor staged = tensor.is_contiguous() ? tensor : tensor.contiguous();
      if (hostStaged) {
        // Pinned, and copied without blocking: the host then waits for the copy only in
        // drain(), by the deadline. A blocking copy (Tensor::to) waited on the internal stream
        // with no bound, and into pageable memory (to() pins only non-blocking copies).
        const auto pinned = at::TensorOptions().dtype(tensor.scalar_type()).pinned_memory(true);
        at::Tensor host = at::empty(tensor.sizes(), pinned);
        if (isSend) host.copy_(staged, /*non_blocking=*/true);
        staged = host;
      }
      scope.drain();  // the bytes are final before the transport reads them
      const size_t bytes = staged.nbytes();
      Transport& t = engine->transport();
      RequestPtr req = isSend ? t.send(peer, tag, staged.data_ptr(), bytes, mem)
                              : t.recv(peer, tag, mask, staged.data_ptr(), bytes, mem);
      *posted = req;
      // What the request writes into (the user's tensor, or the contiguous or pinned copy)
      // stays with it, not only with its callback: where the group goes first, the transport
      // fails the request (running and dropping the callback) and then drives UCX for a
      // while, and UCX cannot stop a receive matched to an eager message still arriving.
      if (refs.held) {
        req->keepAlive(std::make_shared<P2PRefs>(P2PRefs{refs.held, {}, {}, staged, {}}));
      } else {
        req->keepAlive(std::make_shared<at::Tensor>(staged));
      }
      work->markStarted();
      // Runs on this thread during a later progress(); it owns `staged` until then.
      req->onComplete([engine, done = P2PRefs{refs.held, work, tensor, staged, deviceOp},
                       withdrawn, timeout](Request& r) {
        const auto& work = done.work;
        const auto& tensor = done.tensor;
        const auto& staged = done.staged;
        const auto& deviceOp = done.deviceOp;
        // A CUDA recv's copy back runs on the group's stream and is final before the Work
        // completes; the Future records its event there.
        std::optional<DeviceScope> scope;
        // A failed request (peer gone, transport error) fails the group, unless the caller
        // withdrew it or the group is shutting down; a size mismatch does not, a longer
        // message (truncated) as a shorter one (the message was taken whole, and nothing of
        // it is left behind).
        bool groupFailure = false;
        try {
          if (r.failed()) {
            if (engine->failed()) {
              throw GroupFailed(engine->failure());  // it failed with its group
            }
            if (r.truncated()) throw OpFailed(r.error());
            groupFailure = !withdrawn->load() && !engine->stopping();
            throw PeerFailed(r.error());
          }
          // Completing a CUDA op's Future records its event on the current stream: the
          // group's internal stream of the tensor's device, for sends as for receives.
          scope.emplace(deviceOp, Clock::now() + timeout);
          if (!r.isSend()) {
            if (r.receivedBytes() != r.postedBytes()) {
              throw OpFailed("expected " + std::to_string(r.postedBytes()) +
                             " bytes but received " + std::to_string(r.receivedBytes()) +
                             " from rank " + std::to_string(tag::source(r.senderTag())) +
                             ": the tensors differ in size");
            }
            work->setSourceRank(static_cast<int>(tag::source(r.senderTag())));
            if (!staged.is_same(tensor)) {
              at::NoGradGuard g;
              // Not blocking: drain() waits for it, by the deadline (a blocking copy from
              // udp's pinned staging waited on the internal stream with no bound).
              tensor.copy_(staged, /*non_blocking=*/deviceOp.has_value());
            }
            scope->drain();
          }
        } catch (...) {
          const auto error = toDistError(work->context(), std::current_exception());
          if (groupFailure) {
            engine->fail(messageOf(error), failureKindOf(std::current_exception()));
          }
          work->finishError(error);
          return;
        }
        work->finishOk();
      });
    } catch (...) {
      // Posting failed (the transport threw): the group is failed, and no stream stays held
      // by the ops it refuses (runQueued).
      const auto error = toDistError(work->context(), std::current_exception());
      engine->fail(messageOf(error), failureKindOf(std::current_exception()));
      if (deviceOp && deviceOp->gate) deviceOp->gate->releaseAll();
      work->finishError(error);
    }
  };
  task.abandon = [refs = P2PRefs{held, work, {}, {}, {}}](const std::string& why) {
    refs.work->finishError(
        toDistError(refs.work->context(), std::make_exception_ptr(OpFailed(why))));
  };
  engine_->post(std::move(task));
  return work;
}

namespace {

uint64_t checkedUserTag(const Checker& c, int tag) {
  if (tag < 0) {
    c.fail("tag " + std::to_string(tag) + " is negative");
  }
  return static_cast<uint64_t>(tag);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> TransportBackend::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                     int tag) {
  const auto c = checker("send");
  c.single(tensors);
  c.carried(tensors[0]);
  c.rank_(dstRank, "destination rank");
  const uint64_t t = tag::p2p(groupHash_, checkedUserTag(c, tag), static_cast<uint32_t>(getRank()));
  return enqueueP2P("send", c10d::OpType::SEND, c.device(), tensors[0], dstRank, t,
                    tag::kFullMask);
}

c10::intrusive_ptr<c10d::Work> TransportBackend::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                     int tag) {
  const auto c = checker("recv");
  c.single(tensors);
  c.carried(tensors[0]);
  c.rank_(srcRank, "source rank");
  const uint64_t t = tag::p2p(groupHash_, checkedUserTag(c, tag), static_cast<uint32_t>(srcRank));
  return enqueueP2P("recv", c10d::OpType::RECV, c.device(), tensors[0], srcRank, t,
                    tag::kFullMask);
}

c10::intrusive_ptr<c10d::Work> TransportBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  const auto c = checker("recvAnysource");
  c.single(tensors);
  c.carried(tensors[0]);
  const uint64_t t = tag::p2p(groupHash_, checkedUserTag(c, tag), 0);
  return enqueueP2P("recvAnysource", c10d::OpType::RECVANYSOURCE, c.device(), tensors[0],
                    kAnySource, t, tag::kAnySourceMask);
}

// --- barrier and coalescing --------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> TransportBackend::barrier(const c10d::BarrierOptions& opts) {
  // Ops run in issue order, so the barrier also waits for every collective issued before it.
  return enqueue("barrier", c10d::OpType::BARRIER, std::nullopt, {}, {}, timeoutFor(opts.timeout),
                 [](Comm& comm) { algo::barrier(comm); });
}

void TransportBackend::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalesceMu_);
  if (coalescing_) {
    throwInvalid("startCoalescing", getRank(), "a coalescing block is already open", backendName_);
  }
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> TransportBackend::endCoalescing() {
  std::vector<c10::intrusive_ptr<TransportWork>> members;
  {
    std::lock_guard<std::mutex> lock(coalesceMu_);
    if (!coalescing_) {
      throwInvalid("endCoalescing", getRank(), "no coalescing block is open", backendName_);
    }
    coalescing_ = false;
    members.swap(coalesced_);
  }
  std::vector<at::Tensor> outputs;
  for (auto& w : members) {
    for (auto& t : w->result()) outputs.push_back(t);
  }
  OpContext ctx{"coalesced", getRank(), getSize(), 0, std::to_string(members.size()) + " ops",
                backendName_};
  auto group = c10::make_intrusive<TransportWork>(ctx, c10d::OpType::COALESCED, outputs, timeout_.load());
  if (members.empty()) {
    group->finishOk();
    return group;
  }
  // The group completes when its last member does, with the first member error if any.
  struct State {
    std::mutex mu;
    size_t remaining;
    std::exception_ptr error;
  };
  auto state = std::make_shared<State>();
  state->remaining = members.size();
  for (auto& w : members) {
    w->getFuture()->addCallback([state, group](c10::ivalue::Future& f) {
      std::exception_ptr error;
      {
        std::lock_guard<std::mutex> lock(state->mu);
        if (f.hasError() && !state->error) state->error = f.exception_ptr();
        if (--state->remaining != 0) return;
        error = state->error;
      }
      if (error) {
        group->finishError(error);
      } else {
        group->finishOk();
      }
    });
  }
  return group;
}

}  // namespace ucxb
