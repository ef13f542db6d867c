#include "csrc/creation_watch.hpp"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <utility>

namespace ucxb {

namespace {

// How often the watch looks at the other ranks' processes: how late a dead rank on this host is
// found. A look reads /proc only; no Store call.
constexpr std::chrono::milliseconds kLivenessSlice{1000};
// How long stop() waits for a thread inside `confirm` before it leaves it behind: `confirm`
// makes a handful of Store calls on a connection of its own, milliseconds on a live Store.
constexpr std::chrono::milliseconds kStopGrace{1000};

}  // namespace

std::vector<int> deadRanks(const Cards& cards, int self, int64_t instance) {
  std::vector<int> dead;
  for (int p = 0; p < static_cast<int>(cards.size()); ++p) {
    const auto& card = cards[p];
    if (p == self || !card || card->finished == instance) continue;
    if (card->provablyDead()) dead.push_back(p);
  }
  return dead;
}

struct CreationWatch::State {
  State(Cards c, int s, int64_t i, Confirm f)
      : cards(std::move(c)), self(s), instance(i), confirm(std::move(f)) {}
  std::mutex mutex;
  std::condition_variable changed;  // stopped or done
  bool stopped = false;
  bool done = false;
  std::string found;
  Cards cards;
  uint64_t calls = 0;
  const int self;
  const int64_t instance;
  const Confirm confirm;
};

CreationWatch::CreationWatch(Cards cards, int self, int64_t instance, Confirm confirm)
    : state_(std::make_shared<State>(std::move(cards), self, instance, std::move(confirm))) {
  // The thread owns a share of the state: it may outlive this object (stop()).
  thread_ = std::thread([s = state_] {
    std::unique_lock<std::mutex> lock(s->mutex);
    while (!s->changed.wait_for(lock, kLivenessSlice, [&] { return s->stopped; })) {
      Cards cards = s->cards;
      lock.unlock();
      const std::vector<int> dead = deadRanks(cards, s->self, s->instance);
      std::string why;
      uint64_t calls = 0;
      if (!dead.empty()) {
        try {
          why = s->confirm(dead.front(), cards, calls);
        } catch (const std::exception&) {
          // The Store failing: the waiting thread's own call says so, or this looks again.
        }
      }
      lock.lock();
      s->calls += calls;
      s->cards = std::move(cards);
      if (!why.empty()) {
        s->found = std::move(why);
        break;
      }
    }
    s->done = true;
    s->changed.notify_all();
  });
}

CreationWatch::~CreationWatch() {
  uint64_t ignored = 0;
  stop(ignored);
}

std::string CreationWatch::stop(uint64_t& calls) {
  if (!thread_.joinable()) {
    const std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->found;
  }
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->stopped = true;
  state_->changed.notify_all();
  const bool done = state_->changed.wait_for(lock, kStopGrace, [&] { return state_->done; });
  std::string found = state_->found;
  if (done) {
    calls += state_->calls;
    state_->calls = 0;
  }
  lock.unlock();
  if (done) {
    thread_.join();
  } else {
    thread_.detach();
  }
  return found;
}

Cards CreationWatch::cards() const {
  const std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->cards;
}

}  // namespace ucxb
