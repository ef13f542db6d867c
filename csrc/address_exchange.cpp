#include "csrc/address_exchange.hpp"

namespace ucxb {

AddressExchange::AddressExchange(c10d::Store& store, const std::string& groupId, int rank,
                                 int size)
    : store_(store), rank_(rank), size_(size) {
  const std::string base = "ucxbackend/" + groupId + "/";
  const int64_t ticket = store_.add(base + "instances", 1);
  scope_ = base + std::to_string((ticket - 1) / size) + "/";
}

std::vector<std::vector<uint8_t>> AddressExchange::exchange(const std::vector<uint8_t>& mine) {
  store_.set(scope_ + "addr/" + std::to_string(rank_), mine);
  std::vector<std::vector<uint8_t>> all(size_);
  for (int p = 0; p < size_; ++p) {
    all[p] = p == rank_ ? mine : store_.get(scope_ + "addr/" + std::to_string(p));
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
