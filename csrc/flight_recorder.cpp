#include "csrc/flight_recorder.hpp"

#include <c10/util/thread_name.h>
#include <torch/csrc/distributed/c10d/Utils.hpp>

#include <sstream>

namespace ucxb {

namespace {

int64_t nowNs() {
  // The wall clock, as torch's entries (c10::getTime) carry it.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void describeTensors(c10::ArrayRef<at::Tensor> ts, std::vector<std::vector<int64_t>>& sizes,
                     std::vector<std::string>& dtypes) {
  for (const auto& t : ts) {
    if (!t.defined()) continue;
    sizes.emplace_back(t.sizes().begin(), t.sizes().end());
    dtypes.emplace_back(c10::toString(t.scalar_type()));
  }
}

// Raises `slot` to `value` (sequence numbers may be marked out of order across threads).
void raise(std::atomic<int64_t>& slot, int64_t value) {
  int64_t seen = slot.load();
  while (seen < value && !slot.compare_exchange_weak(seen, value)) {
  }
}

}  // namespace

FlightEntry::FlightEntry(uint64_t recordId, std::shared_ptr<FlightGroup> group, FlightOp op)
    : group_(std::move(group)) {
  fixed_.recordId = recordId;
  fixed_.pgId = group_->id;
  fixed_.pgName = std::move(op.pgName);
  fixed_.pgDesc = std::move(op.pgDesc);
  fixed_.threadName = c10::getThreadName();
  std::ostringstream tid;
  tid << std::this_thread::get_id();
  fixed_.threadId = tid.str();
  fixed_.collectiveSeq = op.collectiveSeq;
  fixed_.p2pSeq = op.p2pSeq;
  fixed_.opId = ++group_->ops;
  fixed_.profilingName = std::move(op.profilingName);
  fixed_.createdNs = nowNs();
  fixed_.timeoutMs = op.timeout.count();
  fixed_.p2p = op.collectiveSeq == 0;
  describeTensors(op.inputs, fixed_.inputSizes, fixed_.inputDtypes);
  describeTensors(op.outputs, fixed_.outputSizes, fixed_.outputDtypes);
  if (!fixed_.p2p) raise(group_->lastEnqueued, static_cast<int64_t>(fixed_.collectiveSeq));
}

void FlightEntry::started() {
  int64_t unset = 0;
  if (startedNs_.compare_exchange_strong(unset, nowNs()) && !fixed_.p2p) {
    raise(group_->lastStarted, static_cast<int64_t>(fixed_.collectiveSeq));
  }
}

void FlightEntry::completed() {
  started();  // an op can end before its start was marked (a receive matched at once)
  int64_t unset = 0;
  if (completedNs_.compare_exchange_strong(unset, nowNs()) && !fixed_.p2p) {
    raise(group_->lastCompleted, static_cast<int64_t>(fixed_.collectiveSeq));
  }
  retired_.store(true);
}

void FlightEntry::retired() { retired_.store(true); }

FlightRecord FlightEntry::snapshot() const {
  FlightRecord r = fixed_;
  r.pgRanks = group_->ranks;
  r.lastEnqueued = group_->lastEnqueued.load();
  r.lastStarted = group_->lastStarted.load();
  r.lastCompleted = group_->lastCompleted.load();
  r.startedNs = startedNs_.load();
  r.completedNs = completedNs_.load();
  r.retired = retired_.load();
  return r;
}

FlightRecorder& FlightRecorder::instance() {
  // Leaked: entries may still be marked by Works that outlive static destruction.
  static FlightRecorder* recorder = new FlightRecorder(static_cast<size_t>(std::max(
      0, c10d::getCvarInt({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 0))));
  return *recorder;
}

std::shared_ptr<FlightGroup> FlightRecorder::addGroup(std::vector<int64_t> ranks) {
  if (!enabled()) return nullptr;
  auto group = std::make_shared<FlightGroup>();
  group->id = nextGroup_++;
  group->ranks = std::move(ranks);
  return group;
}

std::shared_ptr<FlightEntry> FlightRecorder::record(const std::shared_ptr<FlightGroup>& group,
                                                    FlightOp op) {
  if (!group) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto entry = std::make_shared<FlightEntry>(nextRecord_++, group, std::move(op));
  if (ring_.size() < capacity_) {
    ring_.push_back(entry);
  } else {
    ring_[next_] = entry;
    next_ = (next_ + 1) % capacity_;
  }
  return entry;
}

std::vector<FlightRecord> FlightRecorder::dump() const {
  std::vector<std::shared_ptr<FlightEntry>> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries.reserve(ring_.size());
    for (size_t i = 0; i < ring_.size(); ++i) {
      entries.push_back(ring_[(next_ + i) % ring_.size()]);
    }
  }
  std::vector<FlightRecord> out;
  out.reserve(entries.size());
  for (const auto& e : entries) out.push_back(e->snapshot());
  return out;
}

}  // namespace ucxb
