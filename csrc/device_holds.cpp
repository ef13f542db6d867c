#include "csrc/device_holds.hpp"

#include <algorithm>
#include <utility>

namespace ucxb {

DeviceHolds::Mark::Mark(std::shared_ptr<DeviceHolds> holds, uint64_t ticket)
    : holds_(std::move(holds)), ticket_(ticket) {
  holds_->add(ticket_);
}

DeviceHolds::Mark::~Mark() { holds_->remove(ticket_); }

void DeviceHolds::add(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  marked_.insert(ticket);
}

void DeviceHolds::remove(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = marked_.find(ticket);
  if (it != marked_.end()) marked_.erase(it);
}

bool DeviceHolds::clearBefore(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  return marked_.empty() || *marked_.begin() >= ticket;
}

void DeviceHolds::keep(std::shared_ptr<void> refs) {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.push_back(std::move(refs));
}

void DeviceHolds::prune() {
  // Let go outside the lock: what goes may hold a Mark, whose destructor takes it.
  std::vector<std::shared_ptr<void>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (kept_.empty()) return;
    // use_count() 1: only this list holds it, and nothing can copy it from here but this
    // thread, so the count cannot rise again.
    const auto alone = [](const std::shared_ptr<void>& p) { return p.use_count() == 1; };
    const auto split = std::stable_partition(kept_.begin(), kept_.end(),
                                             [&](const auto& p) { return !alone(p); });
    gone.assign(std::make_move_iterator(split), std::make_move_iterator(kept_.end()));
    kept_.erase(split, kept_.end());
  }
}

void DeviceHolds::clear() {
  std::vector<std::shared_ptr<void>> gone;
  std::lock_guard<std::mutex> lock(mu_);
  gone.swap(kept_);
  // `gone` is let go after the lock (declared first, destroyed last): see prune().
}

}  // namespace ucxb
