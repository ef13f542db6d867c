// Rendezvous of worker addresses through the c10d Store.
//
// Keys: "ucxbackend/<group id>/<instance>/addr/<rank>" (an address record, csrc/handshake.h),
// and the other rounds of a group's creation under the same prefix. The instance numbers the
// creations of a group id on one Store, so that a group re-created with the same id never
// reads a stale key. Rank 0 alone counts them ("instances"); every other rank joins the
// newest instance it has not joined before ("seen/<rank>") that no rank has given up on
// ("<instance>/closed"). So a creation that failed half-way on some rank (before or after it
// reached the Store) costs that creation only: the next one finds every rank in step. A
// creation that completes deletes its keys; one that fails marks its instance closed.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ucxb {

// Creation could not get every rank into the same instance in time.
class SetupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class AddressExchange {
 public:
  // Joins this creation's instance (rank 0 opens it; the others wait for it, at most the
  // Store's timeout, then throw SetupError).
  AddressExchange(c10d::Store& store, const std::string& groupId, int rank, int size);
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

  // Publishes this rank's address record (csrc/handshake.h) and returns every rank's,
  // indexed by rank.
  std::vector<std::vector<uint8_t>> exchange(const std::vector<uint8_t>& mine) {
    return allGather("addr", mine);
  }

  // Publishes `mine` under `key` and returns every rank's value for it, indexed by rank.
  std::vector<std::vector<uint8_t>> allGather(const std::string& key,
                                              const std::vector<uint8_t>& mine);

  // Adds `delta` to the instance's counter `key`/`index` and returns the new value.
  int64_t add(const std::string& key, int index, int64_t delta);

  // Returns once every rank has connected to all the others. Without it a rank that has
  // nothing to receive (a broadcast root) could finish its first ops and destroy its worker
  // before a slower peer has even connected to it, and that peer's connect would fail.
  void allConnected();

  // This rank has read every key of the creation it will ever read. The last rank to say so
  // deletes them all: a created group leaves only "instances" and "seen/<rank>" behind.
  void complete();

  int64_t instance() const { return instance_; }

 private:
  std::string key(const std::string& family, int index) const;

  c10d::Store& store_;
  const int rank_;
  const int size_;
  std::string base_;   // "ucxbackend/<group id>/"
  std::string scope_;  // base_ + "<instance>/"
  int64_t instance_ = 0;
  // The token and the salt as rank 0 published them (rank 0: drawn at construction; the
  // others: read once from the Store).
  const std::vector<uint8_t>& tokenRecord();
  std::vector<uint8_t> tokenRecord_;
  std::vector<std::string> families_;  // the per-rank key families this creation used
  bool completed_ = false;
};

}  // namespace ucxb
