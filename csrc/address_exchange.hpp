// Rendezvous of worker addresses through the c10d Store.
//
// Keys: "ucxbackend/<group id>/<instance>/addr/<rank>". The instance number counts how many
// times a group with this id was created on this store (every rank adds 1 to a shared counter
// per creation), so a group re-created with the same id never reads a stale address.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ucxb {

std::vector<std::vector<uint8_t>> exchangeAddresses(c10d::Store& store, const std::string& groupId,
                                                    int rank, int size,
                                                    const std::vector<uint8_t>& mine);

}  // namespace ucxb
