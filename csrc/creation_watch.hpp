// While a rank of a group's creation waits on the Store, a thread that looks every
// kLivenessSlice at the processes of the other ranks on this host, from their cards
// (csrc/creation_liveness.hpp) as read when the wait began. Looking needs no Store call: the
// waiting thread holds the Store's connection (a TCPStore client serves one call at a time), and
// a second connection per wait would cost every rank a connect (and a name lookup) at start-up.
// Only when a rank's process is gone does the thread call `confirm`, which may open a connection
// of its own (a clone of the Store), read the cards again (the rank may have finished the
// creation and exited) and give the creation up, waking the waiting thread. Torch-free.
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

// The ranks of `cards` other than `self` that have not finished `instance` and whose process is
// provably gone (RankCard::provablyDead), in rank order.
std::vector<int> deadRanks(const Cards& cards, int self, int64_t instance);

class CreationWatch {
 public:
  // Called on the watch's thread with the rank found dead: returns why the creation cannot
  // complete (having given it up), or "" when the rank turned out to have finished it, after
  // updating `cards` with what it read. May throw (the Store failing): the watch looks again a
  // slice later. Adds the Store calls it made to `calls`. Must not refer to anything that the
  // watch's owner destroys: a watch whose thread is stuck in it is left behind (stop()).
  using Confirm = std::function<std::string(int dead, Cards& cards, uint64_t& calls)>;

  CreationWatch(Cards cards, int self, int64_t instance, Confirm confirm);
  ~CreationWatch();
  CreationWatch(const CreationWatch&) = delete;
  CreationWatch& operator=(const CreationWatch&) = delete;

  // Ends the watch and returns what it found ("" for nothing). A thread still inside `confirm`
  // after kStopGrace (its Store call stuck, e.g. connecting to a TCPStore whose host died) is
  // detached instead of joined: the waiting rank fails now, not at the Store's timeout. Adds the
  // watch's Store calls to `calls` (not those of a detached thread).
  std::string stop(uint64_t& calls);
  // The cards as the watch last knew them (after stop(): those `confirm` read, if it ran).
  Cards cards() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace ucxb
