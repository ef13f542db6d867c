#include "csrc/address_exchange.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>

namespace ucxb {

namespace {

// Every per-rank key family a creation may write under its instance
// ("<instance>/<family>/<rank>"): complete() deletes them all, also those of instances that
// failed. A new round must be added here (allGather and add refuse any other family).
constexpr std::array<const char*, 5> kFamilies = {"addr", "connected", "shm_offer", "shm_mapped",
                                                  "shm_opened"};
// And the instance's single keys.
constexpr std::array<const char*, 3> kSingles = {"token", "done", "closed"};

void checkFamily(const std::string& family) {
  if (std::none_of(kFamilies.begin(), kFamilies.end(),
                   [&](const char* f) { return family == f; })) {
    throw std::logic_error("address exchange: key family '" + family +
                           "' is not in kFamilies (csrc/address_exchange.cpp)");
  }
}

std::vector<uint8_t> numberBytes(int64_t n) {
  const std::string s = std::to_string(n);
  return {s.begin(), s.end()};
}

int64_t numberOf(const std::vector<uint8_t>& bytes) {
  return std::strtoll(std::string(bytes.begin(), bytes.end()).c_str(), nullptr, 10);
}

}  // namespace

AddressExchange::AddressExchange(c10d::Store& store, const std::string& groupId, int rank,
                                 int size)
    : store_(store), rank_(rank), size_(size), base_("ucxbackend/" + groupId + "/") {
  if (rank_ == 0) {
    instance_ = store_.add(base_ + "instances", 1);
  } else {
    // The newest instance that this rank has not joined yet and that nobody has given up on.
    // Rank 0 may not have opened it yet: wait for the next instance's first key (rank 0 writes
    // the token right after opening one), at most the Store's timeout, and look again.
    const std::string seenKey = base_ + "seen/" + std::to_string(rank_);
    const int64_t seen = store_.check({seenKey}) ? numberOf(store_.get(seenKey)) : 0;
    for (;;) {
      const int64_t newest = store_.add(base_ + "instances", 0);
      if (newest > seen && !store_.check({base_ + std::to_string(newest) + "/closed"})) {
        instance_ = newest;
        break;
      }
      std::string waitError;
      try {
        store_.wait({base_ + std::to_string(newest + 1) + "/token"});
        continue;
      } catch (const c10::Error& e) {  // the Store's timeout, whichever Store it is
        waitError = e.what_without_backtrace();
      } catch (const std::runtime_error& e) {
        waitError = e.what();
      }
      throw SetupError("rank 0 did not start this creation of the group within the Store's " +
                       std::to_string(store_.getTimeout().count()) + " ms timeout (rank " +
                       std::to_string(rank_) + " joined instance " + std::to_string(seen) +
                       " before; the newest is " + std::to_string(newest) +
                       (newest > seen ? ", and it failed" : "") + "; the Store said: " +
                       waitError + ")");
    }
    store_.set(seenKey, numberBytes(instance_));
  }
  scope_ = base_ + std::to_string(instance_) + "/";
  // Rank 0 publishes the token whatever its own transport: a udp rank in a group whose rank 0
  // runs another backend must find one, get to the address records and fail there naming
  // both backends, not wait for the token until the Store times out.
  // With the token, the creation's salt for the udp transport's authenticated mode
  // (transports/udp/auth_keys.h): public, but new for every creation.
  if (rank_ == 0) {
    std::random_device entropy;
    tokenRecord_.resize(sizeof(uint64_t) + kCreationSaltBytes);
    for (size_t i = 0; i < tokenRecord_.size(); i += sizeof(uint32_t)) {
      const uint32_t word = entropy();
      std::memcpy(tokenRecord_.data() + i, &word, sizeof word);
    }
    store_.set(scope_ + "token", tokenRecord_);
  }
}

AddressExchange::~AddressExchange() {
  if (completed_) return;
  try {
    store_.set(scope_ + "closed", std::vector<uint8_t>{1});
  } catch (...) {
    // The Store itself is gone: nobody can join this instance either.
  }
}

std::string AddressExchange::key(const std::string& family, int index) const {
  return scope_ + family + "/" + std::to_string(index);
}

const std::vector<uint8_t>& AddressExchange::tokenRecord() {
  if (tokenRecord_.empty()) tokenRecord_ = store_.get(scope_ + "token");
  return tokenRecord_;
}

uint64_t AddressExchange::sessionToken() {
  const std::vector<uint8_t>& bytes = tokenRecord();
  uint64_t token = 0;
  std::memcpy(&token, bytes.data(), std::min(bytes.size(), sizeof(token)));
  return token;
}

std::vector<uint8_t> AddressExchange::creationSalt() {
  const std::vector<uint8_t>& bytes = tokenRecord();
  if (bytes.size() != sizeof(uint64_t) + kCreationSaltBytes) {
    throw SetupError("rank 0 published a session token of " + std::to_string(bytes.size()) +
                     " bytes, without the salt that authenticated udp needs (is rank 0 running "
                     "an older ucxbackend?)");
  }
  return {bytes.begin() + sizeof(uint64_t), bytes.end()};
}

std::vector<std::vector<uint8_t>> AddressExchange::allGather(const std::string& family,
                                                             const std::vector<uint8_t>& mine) {
  checkFamily(family);
  store_.set(key(family, rank_), mine);
  std::vector<std::vector<uint8_t>> all(size_);
  for (int p = 0; p < size_; ++p) {
    all[p] = p == rank_ ? mine : store_.get(key(family, p));
  }
  return all;
}

int64_t AddressExchange::add(const std::string& family, int index, int64_t delta) {
  checkFamily(family);
  return store_.add(key(family, index), delta);
}

void AddressExchange::allConnected() {
  store_.set(key("connected", rank_), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int p = 0; p < size_; ++p) keys.push_back(key("connected", p));
  store_.wait(keys);
}

void AddressExchange::complete() {
  completed_ = true;
  if (store_.add(scope_ + "done", 1) < size_) return;
  // Every rank has read all it will: delete this instance's keys, and those of the instances
  // that failed since the last completed one (no rank is in them any more: every rank is here).
  const int64_t cleaned = store_.add(base_ + "cleaned", 0);
  for (int64_t inst = cleaned + 1; inst <= instance_; ++inst) {
    const std::string prefix = base_ + std::to_string(inst) + "/";
    for (const char* single : kSingles) store_.deleteKey(prefix + single);
    for (const char* family : kFamilies) {
      for (int p = 0; p < size_; ++p) store_.deleteKey(prefix + family + "/" + std::to_string(p));
    }
  }
  if (instance_ > cleaned) store_.add(base_ + "cleaned", instance_ - cleaned);
}

}  // namespace ucxb
