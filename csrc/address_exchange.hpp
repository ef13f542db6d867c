// Rendezvous of worker addresses through the c10d Store.
//
// Keys: "ucxbackend/<group id>/<instance>/records", to which every rank appends its record
// (its address record, csrc/handshake.h, and its shared-memory offer,
// csrc/staging_setup.hpp), and the few other single keys of the creation under the same
// prefix. A creation costs each rank a fixed number of Store calls whatever the group's size
// (about ten; the last rank, which deletes the keys, about ten more): one append of its
// record, one counter, one multi-key read of everyone's (c10d's multiGet: one request to a
// TCPStore), a counter instead of an all-to-all round for shared memory, and no barrier (peers
// connect on first use, so nobody needs to know that the others have connected).
//
// The instance numbers the creations of a group id on one Store, so that a group re-created
// with the same id never reads a stale key. Rank 0 alone counts them ("instances"); every
// other rank joins the newest instance it has not joined before ("seen/<rank>") that no rank
// has given up on ("<instance>/closed"). So a creation that failed half-way on some rank
// (before or after it reached the Store) costs that creation only: the next one finds every
// rank in step. A creation that completes deletes its keys; one that fails marks its
// instance closed, saying why.
//
// Once in the instance, each rank appends its card (csrc/creation_liveness.hpp) to the first
// round's records key before it waits for anyone: one Store call, and no key of its own. A
// wait that lasts longer than a normal creation's (csrc/creation_watch.hpp) is watched by a
// thread of the waiting rank, which reads the cards then, on a connection of its own, and
// looks every half second at the processes of the ranks on its host: a rank that died before
// finishing the creation fails it within about a second. The finder gives the creation up (it
// says why under "closed" and writes a mark into every key a rank may wait for, which wakes
// them on every host), and so does a rank that fails for a reason of its own, instead of every
// waiter waiting for the Store's timeout. "done" holds the finished ranks as bits, so that rank
// 0 can tell a rank that finished and exited from one that died.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "csrc/startup_profile.hpp"

// Declared, not included: only address_exchange.cpp calls the Store, and its header
// (torch/custom_class.h, ~5 s of a compile) would otherwise reach staging_setup.cpp,
// transport_factory.cpp and udp_auth_setup.cpp, which use nothing else of torch.
namespace c10d {
class Store;
}  // namespace c10d

namespace ucxb {

class CreationWatch;

// Creation could not get every rank into the same instance in time.
class SetupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class AddressExchange {
 public:
  // Joins this creation's instance (rank 0 opens it; the others wait for it, at most the
  // Store's timeout, then throw SetupError). Every Store call it makes is counted in
  // `traffic`, which must outlive it.
  AddressExchange(c10d::Store& store, const std::string& groupId, int rank, int size,
                  StoreTraffic& traffic);
  // A creation that did not reach complete(): marks the instance closed, so that no rank
  // joins it later. Never throws.
  ~AddressExchange();
  AddressExchange(const AddressExchange&) = delete;
  AddressExchange& operator=(const AddressExchange&) = delete;

  // A random 64-bit number drawn by rank 0 and shared through the Store: the same on every rank
  // of this group instance, different for the next instance (the UDP transport's session token).
  uint64_t sessionToken();
  // kCreationSaltBytes random bytes drawn by rank 0 with the token: what makes the udp
  // transport's authentication keys new for every creation (transports/udp/auth_keys.h).
  std::vector<uint8_t> creationSalt();
  static constexpr size_t kCreationSaltBytes = 32;

  // Publishes this rank's record, made of `parts`, and returns every rank's parts, indexed by
  // rank (an append, a counter and one multi-key read, which waits for every rank's record at
  // most the Store's timeout). A record whose parts cannot be told apart comes back whole as
  // its first part, the others empty, for the address record's own check to name it; a
  // records key that is not every rank's records throws SetupError, and so does the Store's
  // timeout, naming the ranks whose records never came. A second call is a second round,
  // under keys of its own (at most two: a ucx group whose first addresses did not reach
  // every host exchanges new ones).
  std::vector<std::vector<std::vector<uint8_t>>> exchange(
      const std::vector<std::vector<uint8_t>>& parts);

  // Whether every rank says yes to `question` (a name of kQuestions), through one counter and
  // one answer key instead of an all-to-all round: the rank whose yes completes the count runs
  // `lastYes` and then publishes the answer; a rank that says no publishes "no" at once.
  // Waits for the answer, at most the Store's timeout (then SetupError, saying how many said
  // yes).
  bool everyoneSays(const std::string& question, bool mine,
                    const std::function<void()>& lastYes);

  // This rank has read every key of the creation it will ever read. The last rank to say so
  // deletes them all: a created group leaves only "instances" and "seen/<rank>" behind.
  // Rank 0 returns only after that (SetupError after the Store's timeout if a rank never
  // gets here), so that no rank still uses the Store when rank 0, often its host, moves on;
  // where every rank's launcher hosts the Store instead (the cards of the first exchange(),
  // RankCard::storeOutlivesRank0), rank 0 returns at once, as the others do.
  void complete();

  // The last rank's deletions, where rank 0 does not wait for them (every rank's launcher
  // hosts the Store): complete() leaves them to the caller, who runs them (runCleanup) off
  // the creation's critical path, before the group is destroyed. The keys of this instance
  // and of the instances that failed since the last completed one, and what "cleaned" then
  // counts up by.
  struct DeferredCleanup {
    std::vector<std::string> keys;
    std::string cleanedKey;
    int64_t cleanedBy = 0;
  };
  std::optional<DeferredCleanup> takeDeferredCleanup() { return std::exchange(deferred_, {}); }
  // Deletes the keys and counts "cleaned" up. A Store that fails meanwhile (its host exited)
  // took the keys with it, and the group exists: nothing to fail, nobody to tell, so this
  // throws nothing.
  static void runCleanup(c10d::Store& store, const DeferredCleanup& cleanup) noexcept;

  int64_t instance() const { return instance_; }
  // How many ranks of the group run on this host, this one included, from the cards of the
  // first exchange() (each rank's host identity); 1 before it, or where hosts cannot be told
  // apart (shm::hostIdentityIsUnique).
  int ranksOnHost() const { return ranksOnHost_; }

 private:
  // The Store calls, each counted in traffic_.
  void set(const std::string& key, const std::vector<uint8_t>& value);
  std::vector<uint8_t> get(const std::string& key);
  int64_t add(const std::string& key, int64_t delta);
  bool check(const std::string& key);
  void wait(const std::string& key);
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys);
  void append(const std::string& key, const std::vector<uint8_t>& value);
  void deleteKey(const std::string& key);
  // A counter's value for an error message, "?" when the Store cannot be read either.
  std::string counterForError(const std::string& key);
  // exchange()'s error when the Store timed out waiting for every rank's record under
  // `recordsKey`.
  std::string notJoined(const std::string& recordsKey, const std::string& storeSaid);
  // Appends this rank's card to the first round's records key.
  void appendCard();
  // How many ranks "done" says finished, for an error message; "?" when the Store cannot be
  // read either.
  std::string doneForError();
  // Runs `call`, a Store call that waits for other ranks (at most the Store's timeout), while
  // the creation's CreationWatch (csrc/creation_watch.hpp) looks at the processes of the ranks
  // on this host:
  // SetupError naming a rank found dead, which the watch has given the creation up for. A
  // Store error of `call` (c10::Error) is thrown on as it is, unless the cards name a rank dead
  // meanwhile. `waitedKey` is the key `call` waits for; `waitingFor` is for messages.
  void watched(const std::string& waitingFor, const std::string& waitedKey,
               const std::function<void()>& call);
  // A waited-for key held `mark`, that of a creation given up (by a rank that found another
  // dead, or failed itself): throws SetupError with the reason it carries.
  [[noreturn]] void throwGivenUp(const std::string& waitingFor, const std::vector<uint8_t>& mark);

  c10d::Store& store_;
  StoreTraffic& traffic_;
  const int rank_;
  const int size_;
  std::string base_;   // "ucxbackend/<group id>/"
  std::string scope_;  // base_ + "<instance>/"
  int64_t instance_ = 0;
  // The token and the salt as rank 0 published them (rank 0: drawn at construction; the
  // others: read once from the Store).
  const std::vector<uint8_t>& tokenRecord();
  std::vector<uint8_t> tokenRecord_;
  bool completed_ = false;
  bool closed_ = false;  // this rank closed the instance, or found it closed
  int rounds_ = 0;  // exchange() calls so far
  int ranksOnHost_ = 1;
  // Whether rank 0's exit may take the Store away (complete()): true unless every rank's
  // card, read in the first exchange(), says its launcher hosts it. Every rank reads the
  // same cards, so rank 0 and the last rank to complete agree on it.
  bool rank0HostsStore_ = true;
  std::optional<DeferredCleanup> deferred_;
  std::vector<std::string> said_;  // the questions this rank answered (everyoneSays)
  // The watch of every wait of this creation and its connection to the Store, made at the first
  // wait (watched), and made again where a watch was left behind in a Store call.
  struct WatchStore;
  CreationWatch& watch();
  std::shared_ptr<WatchStore> watchStore_;
  std::unique_ptr<CreationWatch> watch_;
};

}  // namespace ucxb
