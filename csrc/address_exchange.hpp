// Rendezvous of worker addresses through the c10d Store.
//
// Keys: "ucxbackend/<group id>/<instance>/addr/<rank>" (an address record, csrc/handshake.h). The instance number counts how many
// times a group with this id was created on this store (every rank adds 1 to a shared counter
// per creation), so a group re-created with the same id never reads a stale address.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ucxb {

class AddressExchange {
 public:
  AddressExchange(c10d::Store& store, const std::string& groupId, int rank, int size);

  // A random 64-bit number drawn by rank 0 and shared through the Store: the same on every rank
  // of this group instance, different for the next instance (the UDP transport's session token).
  uint64_t sessionToken();

  // Publishes this rank's address record (csrc/handshake.h) and returns every rank's,
  // indexed by rank.
  std::vector<std::vector<uint8_t>> exchange(const std::vector<uint8_t>& mine) {
    return allGather("addr", mine);
  }

  // Publishes `mine` under `key` and returns every rank's value for it, indexed by rank.
  std::vector<std::vector<uint8_t>> allGather(const std::string& key,
                                              const std::vector<uint8_t>& mine);

  // Returns once every rank has connected to all the others. Without it a rank that has
  // nothing to receive (a broadcast root) could finish its first ops and destroy its worker
  // before a slower peer has even connected to it, and that peer's connect would fail.
  void allConnected();

 private:
  c10d::Store& store_;
  const int rank_;
  const int size_;
  std::string scope_;
  uint64_t token_ = 0;  // rank 0's, drawn and published at construction
};

}  // namespace ucxb
