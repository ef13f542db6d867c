#include "csrc/creation_watch.hpp"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <utility>

namespace ucxb {

namespace {

// How long a wait goes unwatched: longer than the waits of a normal creation (measured in
// docs/failure-model.md), so that those cost no Store call and no look; short enough that a
// dead rank is found within about kWatchAfter + kLivenessSlice of the wait's start, or
// kLivenessSlice of its death.
constexpr std::chrono::milliseconds kWatchAfter{200};
// How often the watch looks at the other ranks' processes after that. A look reads /proc
// only; no Store call once every rank's card is known.
constexpr std::chrono::milliseconds kLivenessSlice{500};
// How long stop() waits for a thread inside a Store call before it leaves it behind: the
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
  State(int s, ReadCards r, Confirm f) : self(s), read(std::move(r)), confirm(std::move(f)) {}
  std::mutex mutex;
  std::condition_variable changed;  // stopped or done
  bool stopped = false;
  bool done = false;
  std::string found;
  Cards cards;  // empty until the first look
  uint64_t calls = 0;
  const int self;
  const ReadCards read;
  const Confirm confirm;
};

CreationWatch::CreationWatch(int self, ReadCards read, Confirm confirm)
    : state_(std::make_shared<State>(self, std::move(read), std::move(confirm))) {
  // The thread owns a share of the state: it may outlive this object (stop()).
  thread_ = std::thread([s = state_] {
    std::unique_lock<std::mutex> lock(s->mutex);
    auto wait = kWatchAfter;
    while (!s->changed.wait_for(lock, wait, [&] { return s->stopped; })) {
      wait = kLivenessSlice;
      Cards cards = s->cards;
      lock.unlock();
      std::string why;
      uint64_t calls = 0;
      try {
        if (cards.empty() || someMissing(cards)) {
          // A rank without a card has not joined yet: read again; keep what is settled.
          Cards fresh = s->read(calls);
          for (size_t p = 0; p < fresh.size(); ++p) {
            if (p < cards.size() && cards[p]) fresh[p] = cards[p];
          }
          cards = std::move(fresh);
        }
        for (const int dead : deadRanks(cards, s->self)) {
          why = s->confirm(dead, cards, calls);
          if (!why.empty()) break;
        }
      } catch (const std::exception&) {
        // The Store failing: the waiting thread's own call says so, or this looks again.
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
