// While a rank of a group's creation waits on the Store, a thread that does nothing for
// kWatchAfter (longer than a normal creation's waits: those end with no Store call and no look
// at all), then reads the other ranks' cards (csrc/creation_liveness.hpp) and looks every
// kLivenessSlice at the processes of those on this host. Reading goes through a connection of
// the thread's own (a clone of the Store, opened only then): the waiting thread holds the
// Store's (a TCPStore client serves one call at a time). Only when a rank's process is gone
// does the thread call `confirm`, which asks the Store whether the wait ends without that rank
// (it finished the creation and exited) or gives the creation up, waking the waiting thread.
// Torch-free.
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
  // Called on the watch's thread with a rank found dead: returns why the creation cannot
  // complete (having given it up), or "" after settling the rank in `cards` (the wait ends
  // without it). May throw, as ReadCards. Both add the Store calls they made to `calls`, and
  // must not refer to anything that the watch's owner destroys: a watch whose thread is stuck
  // in one is left behind (stop()).
  using Confirm = std::function<std::string(int dead, Cards& cards, uint64_t& calls)>;

  CreationWatch(int self, ReadCards read, Confirm confirm);
  ~CreationWatch();
  CreationWatch(const CreationWatch&) = delete;
  CreationWatch& operator=(const CreationWatch&) = delete;

  // Ends the watch and returns what it found ("" for nothing). A thread still inside a Store
  // call after kStopGrace (stuck, e.g. connecting to a TCPStore whose host died) is detached
  // instead of joined: the waiting rank fails now, not at the Store's timeout. Adds the
  // watch's Store calls to `calls` (not those of a detached thread).
  std::string stop(uint64_t& calls);
  // The cards as the watch last knew them: none where the wait ended before kWatchAfter.
  Cards cards() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace ucxb
