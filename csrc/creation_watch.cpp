#include "csrc/creation_watch.hpp"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <utility>

namespace ucxb {

namespace {

using SteadyClock = std::chrono::steady_clock;

// How long a wait goes unwatched: longer than the waits of a normal creation (measured in
// docs/failure-model.md), so that those cost no Store call and no look; short enough that a
// dead rank is found within about kWatchAfter + kLivenessSlice of the wait's start, or
// kLivenessSlice of its death.
constexpr std::chrono::milliseconds kWatchAfter{200};
// How often the watch looks at the other ranks' processes after that. A look reads /proc
// only; no Store call once every rank's card is known.
constexpr std::chrono::milliseconds kLivenessSlice{500};
// How long endWait() waits for a thread inside a Store call before it leaves it behind: the
// watch makes a handful of Store calls on a connection of its own, milliseconds on a live Store.
constexpr std::chrono::milliseconds kStopGrace{1000};

bool someMissing(const Cards& cards) {
  for (const auto& card : cards) {
    if (!card) return true;
  }
  return false;
}

}  // namespace

std::vector<int> deadRanks(const Cards& cards, int self) {
  std::vector<int> dead;
  for (int p = 0; p < static_cast<int>(cards.size()); ++p) {
    const auto& card = cards[p];
    if (p == self || !card || card->settled) continue;
    if (card->provablyDead()) dead.push_back(p);
  }
  return dead;
}

struct CreationWatch::State {
  State(int s, ReadCards r) : self(s), read(std::move(r)) {}
  std::mutex mutex;
  std::condition_variable changed;  // a wait began or ended, a look ended, or stopped
  bool stopped = false;
  bool done = false;        // the thread has returned
  bool watching = false;    // a wait is on, between beginWait() and endWait()
  bool looking = false;     // a look is under way, outside the mutex
  SteadyClock::time_point nextLook;
  Confirm confirm;          // the current wait's
  std::string found;        // what the current wait's looks found
  Cards cards;              // empty until the first look of the creation
  bool looked = false;      // a look of the current wait has ended
  uint64_t calls = 0;       // the current wait's, not yet counted by endWait()
  const int self;
  const ReadCards read;
};

namespace {

// One look (a read of the cards while one is missing, then at the processes): returns why the
// creation cannot complete, or "". Adds its Store calls to `calls`.
std::string look(int self, const CreationWatch::ReadCards& read,
                 const CreationWatch::Confirm& confirm, Cards& cards, uint64_t& calls) {
  try {
    if (cards.empty() || someMissing(cards)) {
      // A rank without a card has not joined yet: read again; keep what is known.
      Cards fresh = read(calls);
      for (size_t p = 0; p < fresh.size(); ++p) {
        if (p < cards.size() && cards[p]) fresh[p] = cards[p];
      }
      cards = std::move(fresh);
    }
    for (const int dead : deadRanks(cards, self)) {
      std::string why = confirm(dead, cards, calls);
      if (!why.empty()) return why;
    }
  } catch (const std::exception&) {
    // The Store failing: the waiting thread's own call says so, or this looks again.
  }
  return {};
}

}  // namespace

CreationWatch::CreationWatch(int self, ReadCards read)
    : state_(std::make_shared<State>(self, std::move(read))) {}

void CreationWatch::run(const std::shared_ptr<State>& s) {
  std::unique_lock<std::mutex> lock(s->mutex);
  while (!s->stopped) {
    // Between waits, and after a finding (the wait is about to end): idle.
    if (!s->watching || !s->found.empty()) {
      s->changed.wait(lock);
      continue;
    }
    if (SteadyClock::now() < s->nextLook) {
      s->changed.wait_until(lock, s->nextLook);
      continue;
    }
    s->looking = true;
    Cards cards = s->cards;
    const Confirm confirm = s->confirm;
    lock.unlock();
    uint64_t calls = 0;
    std::string why = look(s->self, s->read, confirm, cards, calls);
    lock.lock();
    s->looking = false;
    s->looked = true;
    s->calls += calls;
    s->cards = std::move(cards);
    s->found = std::move(why);
    s->nextLook = SteadyClock::now() + kLivenessSlice;
    s->changed.notify_all();
  }
  s->done = true;
  s->changed.notify_all();
}

void CreationWatch::beginWait(Confirm confirm) {
  if (spent_) return;
  const std::lock_guard<std::mutex> lock(state_->mutex);
  state_->watching = true;
  state_->confirm = std::move(confirm);
  state_->nextLook = SteadyClock::now() + kWatchAfter;
  state_->found.clear();
  state_->looked = false;
  // Settled holds for one wait: the next may wait for a key that rank never wrote.
  for (auto& card : state_->cards) {
    if (card) card->settled = false;
  }
  // The thread owns a share of the state: it may outlive this object (endWait()).
  if (!thread_.joinable()) thread_ = std::thread(run, state_);
  state_->changed.notify_all();
}

std::string CreationWatch::endWait(uint64_t& calls) {
  if (!thread_.joinable()) return {};
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->watching = false;
  state_->changed.notify_all();
  const bool idle =
      state_->changed.wait_for(lock, kStopGrace, [&] { return !state_->looking; });
  std::string found = std::move(state_->found);
  state_->found.clear();
  lastCards_ = state_->looked ? state_->cards : Cards{};
  if (idle) {
    calls += state_->calls;
    state_->calls = 0;
    return found;
  }
  state_->stopped = true;
  lock.unlock();
  thread_.detach();
  spent_ = true;
  return found;
}

CreationWatch::~CreationWatch() {
  if (!thread_.joinable()) return;
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->stopped = true;
  state_->changed.notify_all();
  // Only a wait left open (its owner thrown out of it) can have a look under way.
  const bool done = state_->changed.wait_for(lock, kStopGrace, [&] { return state_->done; });
  lock.unlock();
  if (done) {
    thread_.join();
  } else {
    thread_.detach();
  }
}

}  // namespace ucxb
