#include "csrc/address_exchange.hpp"

#include <cstring>
#include <random>

namespace ucxb {

AddressExchange::AddressExchange(c10d::Store& store, const std::string& groupId, int rank,
                                 int size)
    : store_(store), rank_(rank), size_(size) {
  const std::string base = "ucxbackend/" + groupId + "/";
  const int64_t ticket = store_.add(base + "instances", 1);
  scope_ = base + std::to_string((ticket - 1) / size) + "/";
  // Rank 0 publishes the token whatever its own transport: a udp rank in a group whose rank 0
  // runs another backend must find one, get to the address records and fail there naming
  // both backends, not wait for the token until the Store times out.
  if (rank_ == 0) {
    std::random_device entropy;
    token_ = (uint64_t{entropy()} << 32) ^ entropy();
    std::vector<uint8_t> bytes(sizeof(token_));
    std::memcpy(bytes.data(), &token_, sizeof(token_));
    store_.set(scope_ + "token", bytes);
  }
}

uint64_t AddressExchange::sessionToken() {
  if (rank_ == 0) return token_;
  const std::vector<uint8_t> bytes = store_.get(scope_ + "token");
  uint64_t token = 0;
  std::memcpy(&token, bytes.data(), std::min(bytes.size(), sizeof(token)));
  return token;
}

std::vector<std::vector<uint8_t>> AddressExchange::allGather(const std::string& key,
                                                             const std::vector<uint8_t>& mine) {
  store_.set(scope_ + key + "/" + std::to_string(rank_), mine);
  std::vector<std::vector<uint8_t>> all(size_);
  for (int p = 0; p < size_; ++p) {
    all[p] = p == rank_ ? mine : store_.get(scope_ + key + "/" + std::to_string(p));
  }
  return all;
}

void AddressExchange::allConnected() {
  store_.set(scope_ + "connected/" + std::to_string(rank_), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int p = 0; p < size_; ++p) keys.push_back(scope_ + "connected/" + std::to_string(p));
  store_.wait(keys);
}

}  // namespace ucxb
