// While a rank of a group's creation waits on the Store, a thread that does nothing for the
// first kWatchAfter of each wait (longer than a normal creation's waits: those end with no Store
// call and no look at all), then reads the other ranks' cards (csrc/creation_liveness.hpp) and
// looks every kLivenessSlice at the processes of those on this host. One thread serves every
// wait of a creation: it starts at the first wait, idles between waits, keeps the cards it read
// for the later ones, and ends with the watch. Reading goes through a connection of the
// thread's own (a clone of the Store, opened only at the first read): the waiting thread holds
// the Store's (a TCPStore client serves one call at a time). Only when a rank's process is gone
// does the thread call the wait's `confirm`, which asks the Store whether the wait ends without
// that rank (it finished the creation and exited) or gives the creation up, waking the waiting
// thread. Torch-free.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "csrc/creation_liveness.hpp"

namespace ucxb {

using Cards = std::vector<std::optional<RankCard>>;

// The ranks of `cards` other than `self`, not settled, whose process is provably gone
// (RankCard::provablyDead), in rank order.
std::vector<int> deadRanks(const Cards& cards, int self);

class CreationWatch {
 public:
  // Called on the watch's thread: every rank's card as the Store has them now (nullopt for a
  // rank without one yet). Called at the first look, and again at each look while a card is
  // missing. May throw (the Store failing): the watch looks again a slice later.
  using ReadCards = std::function<Cards(uint64_t& calls)>;
  // Called on the watch's thread with a rank found dead during a wait: returns why the
  // creation cannot complete (having given it up), or "" after settling the rank in `cards`
  // (this wait ends without it; the next wait looks at it again). May throw, as ReadCards.
  // Both add the Store calls they made to `calls`, and must not refer to anything that the
  // watch's owner destroys: a thread stuck in one is left behind (endWait()).
  using Confirm = std::function<std::string(int dead, Cards& cards, uint64_t& calls)>;

  CreationWatch(int self, ReadCards read);
  // Ends the thread (and a wait still watched, its Store calls uncounted).
  ~CreationWatch();
  CreationWatch(const CreationWatch&) = delete;
  CreationWatch& operator=(const CreationWatch&) = delete;

  // Watches the wait that starts now, with `confirm`, until endWait(); one wait at a time.
  // Starts the thread at the first. A spent watch watches nothing.
  void beginWait(Confirm confirm);
  // Ends the wait and returns what the watch found during it ("" for nothing). A look still
  // inside a Store call after kStopGrace (stuck, e.g. connecting to a TCPStore whose host
  // died) is left behind with its thread instead of waited for: the waiting rank fails now,
  // not at the Store's timeout, and the watch is spent. Adds the wait's Store calls to `calls`
  // (not those of a thread left behind).
  std::string endWait(uint64_t& calls);
  // The cards as the watch knew them at the end of the last wait: none where that wait ended
  // before kWatchAfter.
  const Cards& cards() const { return lastCards_; }
  // The thread was left behind in a Store call, with the connection it was using.
  bool spent() const { return spent_; }

 private:
  struct State;
  static void run(const std::shared_ptr<State>& s);
  std::shared_ptr<State> state_;
  std::thread thread_;
  Cards lastCards_;
  bool spent_ = false;
};

}  // namespace ucxb
