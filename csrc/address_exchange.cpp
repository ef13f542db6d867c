#include "csrc/address_exchange.hpp"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>

#include "csrc/creation_watch.hpp"
#include "transports/entropy.h"

namespace ucxb {

namespace {

// The keys a creation writes under its instance, all single keys whatever the group's size
// (and the two of each question, "<question>_yes" and "<question>_answer", and those of each
// round of exchange()): complete() deletes them all, also those of instances that failed. A
// new key must be added here.
constexpr std::array<const char*, 1> kQuestions = {"shm"};
constexpr std::array<const char*, 4> kSingles = {"token", "done", "closed", "released"};
constexpr std::array<const char*, 3> kRoundKeys = {"records", "arrived", "all_in"};
// exchange() runs once, or twice where the first addresses could not reach every host.
constexpr int kMaxRounds = 2;
// The first byte of what is written into the keys that ranks wait for, followed by the reason,
// to wake them when the creation is given up (their real values are 0 and 1). The reason
// travels with the mark: the Store may be gone by the time a woken rank reads anything else
// (a TCPStore is rank 0's, and rank 0 may have given up and exited).
constexpr uint8_t kGivenUp = 'X';

bool givenUp(const std::vector<uint8_t>& value) { return !value.empty() && value[0] == kGivenUp; }

// The name of a key of exchange()'s `round` (0-based): "records", then "records_2".
std::string roundKey(const char* name, int round) {
  return round == 0 ? std::string(name) : std::string(name) + "_" + std::to_string(round + 1);
}

void checkQuestion(const std::string& question) {
  if (std::none_of(kQuestions.begin(), kQuestions.end(),
                   [&](const char* q) { return question == q; })) {
    throw std::logic_error("address exchange: question '" + question +
                           "' is not in kQuestions (csrc/address_exchange.cpp)");
  }
}

// In the first round's records key, an entry whose rank has this bit is that rank's card
// (csrc/creation_liveness.hpp), appended when it joins, before its record: a key every rank
// appends to anyway, which the last rank deletes anyway.
constexpr uint32_t kCardEntry = 0x80000000u;

// "done" holds the ranks that finished the creation as bits (rank r adds 1 << r) in a group of
// at most kDoneBits ranks: rank 0, the one rank that waits for the others to finish, can then
// tell a rank that finished and exited from one that died before, from the counter it has
// anyway. A larger group counts ones, and its rank 0 cannot tell: a rank of its host that dies
// just before finishing is found only at the Store's timeout.
constexpr int kDoneBits = 62;

int64_t doneWeight(int rank, int size) { return size <= kDoneBits ? int64_t{1} << rank : 1; }

int64_t allDone(int size) { return size <= kDoneBits ? (int64_t{1} << size) - 1 : size; }

// How many ranks a value of "done" says finished.
int64_t doneCount(int64_t done, int size) {
  return size <= kDoneBits ? std::popcount(static_cast<uint64_t>(done)) : done;
}

// A record's parts, each preceded by its length (u32, little-endian), after this magic: a
// value without it is not a record of this layout (see exchange()).
constexpr uint8_t kRecordMagic[4] = {'U', 'X', 'R', '1'};

void putU32(std::vector<uint8_t>& out, size_t n) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
}

uint32_t readU32(const std::vector<uint8_t>& in, size_t at) {
  uint32_t n = 0;
  for (int b = 0; b < 4; ++b) n |= uint32_t{in[at + b]} << (8 * b);
  return n;
}

std::vector<uint8_t> frame(const std::vector<std::vector<uint8_t>>& parts) {
  std::vector<uint8_t> out(std::begin(kRecordMagic), std::end(kRecordMagic));
  for (const auto& part : parts) {
    putU32(out, part.size());
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::vector<std::vector<uint8_t>> unframe(const std::vector<uint8_t>& value, size_t count) {
  std::vector<std::vector<uint8_t>> parts(count);
  const bool magic = value.size() >= sizeof(kRecordMagic) &&
                     std::equal(std::begin(kRecordMagic), std::end(kRecordMagic), value.begin());
  size_t at = sizeof(kRecordMagic);
  for (size_t i = 0; magic && i < count; ++i) {
    if (value.size() - at < 4) break;
    const uint32_t n = readU32(value, at);
    at += 4;
    if (value.size() - at < n) break;
    parts[i].assign(value.begin() + static_cast<std::ptrdiff_t>(at),
                    value.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
    if (i + 1 == count && at == value.size()) return parts;
  }
  // Not a record of this layout: whole, as the first part.
  std::vector<std::vector<uint8_t>> whole(count);
  whole[0] = value;
  return whole;
}

// The cards in the first round's records key by rank (kCardEntry); nullopt for a rank without
// one.
Cards parseCards(const std::vector<uint8_t>& blob, int size) {
  Cards cards(size);
  for (size_t at = 0; blob.size() - at >= 8;) {
    const uint32_t p = readU32(blob, at);
    const uint32_t n = readU32(blob, at + 4);
    at += 8;
    if (blob.size() - at < n) break;
    const uint32_t cardOf = p & ~kCardEntry;
    if ((p & kCardEntry) != 0 && cardOf < static_cast<uint32_t>(size)) {
      cards[cardOf] = RankCard::decode({blob.begin() + static_cast<std::ptrdiff_t>(at),
                                        blob.begin() + static_cast<std::ptrdiff_t>(at + n)});
    }
    at += n;
  }
  return cards;
}

// Whether `store` (under its prefixes) may be a TCPStore that rank 0's process hosts, so that
// rank 0's exit takes it away whatever TORCHELASTIC_USE_AGENT_STORE says: that variable says
// only that torch's rendezvous connects to the agent's TCPStore, at MASTER_ADDR:MASTER_PORT,
// instead of starting one in rank 0; a group over a TCPStore the program made itself (hosted
// by its rank 0, as frameworks that make groups of their own do) is not served by the agent.
// Other Stores (a FileStore outlives any rank) are left to the variable.
bool maybeRank0sTcpStore(c10d::Store& store) {
  c10d::Store* inner = &store;
  c10::intrusive_ptr<c10d::Store> held;  // keeps `inner` alive below the first prefix
  while (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(inner)) {
    held = prefixed->getUnderlyingStore();
    inner = held.get();
  }
  const auto* tcp = dynamic_cast<const c10d::TCPStore*>(inner);
  if (tcp == nullptr) return false;
  const char* host = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  return host == nullptr || port == nullptr || tcp->getHost() != host ||
         std::to_string(tcp->getPort()) != port;
}

std::string deathOf(int rank, const RankCard& card, const std::string& waiting) {
  return "rank " + std::to_string(rank) + " (" + card.where() +
         ") died during this creation of the group: " + waiting + " and found its process gone";
}

// The keys of the creation under `scope` that a rank may wait for, all rounds and questions.
std::vector<std::string> waitedKeys(const std::string& scope) {
  std::vector<std::string> keys = {scope + "released"};
  for (int round = 0; round < kMaxRounds; ++round) keys.push_back(scope + roundKey("all_in", round));
  for (const char* question : kQuestions) keys.push_back(scope + question + "_answer");
  return keys;
}

// Gives up the creation under `scope` on `store`: says `why` under "closed" (unless a rank said
// why first), where a rank about to join looks, and writes the mark and `why` into `keys`,
// which wakes every rank waiting for one of them, on every host. Counts its Store calls in
// `calls`.
void giveUp(c10d::Store& store, const std::string& scope, const std::vector<std::string>& keys,
            const std::string& why, uint64_t& calls) {
  const std::string closed = scope + "closed";
  ++calls;
  if (!store.check({closed})) {
    ++calls;
    store.set(closed, std::vector<uint8_t>(why.begin(), why.end()));
  }
  const std::string marked = static_cast<char>(kGivenUp) + why;
  const std::vector<uint8_t> mark(marked.begin(), marked.end());
  for (const auto& key : keys) {
    ++calls;
    store.set(key, mark);
  }
}

}  // namespace

AddressExchange::AddressExchange(c10d::Store& store, const std::string& groupId, int rank,
                                 int size, StoreTraffic& traffic)
    : store_(store),
      traffic_(traffic),
      rank_(rank),
      size_(size),
      base_("ucxbackend/" + groupId + "/") {
  if (rank_ == 0) {
    instance_ = add(base_ + "instances", 1);
  } else {
    // The newest instance that this rank has not joined yet and that nobody has given up on.
    // Rank 0 may not have opened it yet: wait for the next instance's first key (rank 0 writes
    // the token right after opening one), at most the Store's timeout, and look again.
    // "seen/<rank>" is a counter: adding 0 reads it (0 when this rank never joined).
    const std::string seenKey = base_ + "seen/" + std::to_string(rank_);
    const int64_t seen = add(seenKey, 0);
    for (;;) {
      const int64_t newest = add(base_ + "instances", 0);
      if (newest > seen && !check(base_ + std::to_string(newest) + "/closed")) {
        instance_ = newest;
        break;
      }
      std::string waitError;
      try {
        wait(base_ + std::to_string(newest + 1) + "/token");
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
    add(seenKey, instance_ - seen);
  }
  scope_ = base_ + std::to_string(instance_) + "/";
  // Rank 0 publishes the token whatever its own transport: a udp rank in a group whose rank 0
  // runs another backend must find one, get to the address records and fail there naming
  // both backends, not wait for the token until the Store times out.
  // With the token, the creation's salt for the udp transport's authenticated mode
  // (transports/udp/auth_keys.h): public, but new for every creation.
  if (rank_ == 0) {
    tokenRecord_.resize(sizeof(uint64_t) + kCreationSaltBytes);
    fillRandom(tokenRecord_.data(), tokenRecord_.size());
    set(scope_ + "token", tokenRecord_);
  }
  // Before this rank waits for anyone, so that a rank that dies from here on is found by the
  // ranks that wait for it on its host (watched).
  appendCard();
}

AddressExchange::~AddressExchange() {
  if (completed_ || closed_) return;
  try {
    // Every rank still waiting for what this rank owes fails now, not at the Store's timeout:
    // the keys of the rounds it did not publish a record in, of the questions it did not
    // answer, and "released". The others it leaves alone: what it published (its record may
    // say why it failed) is for the others to read.
    std::vector<std::string> owed = {scope_ + "released"};
    for (int round = rounds_; round < kMaxRounds; ++round) {
      owed.push_back(scope_ + roundKey("all_in", round));
    }
    for (const char* question : kQuestions) {
      if (std::find(said_.begin(), said_.end(), question) == said_.end()) {
        owed.push_back(scope_ + question + "_answer");
      }
    }
    giveUp(store_, scope_, owed,
           "rank " + std::to_string(rank_) + " failed (its own error says why)", traffic_.calls);
  } catch (...) {
    // The Store itself is gone: nobody can join this instance either.
  }
}

void AddressExchange::set(const std::string& k, const std::vector<uint8_t>& value) {
  ++traffic_.calls;
  traffic_.bytes += k.size() + value.size();
  store_.set(k, value);
}

std::vector<uint8_t> AddressExchange::get(const std::string& k) {
  ++traffic_.calls;
  auto value = store_.get(k);
  traffic_.bytes += k.size() + value.size();
  return value;
}

int64_t AddressExchange::add(const std::string& k, int64_t delta) {
  ++traffic_.calls;
  traffic_.bytes += k.size() + sizeof(delta);
  return store_.add(k, delta);
}

bool AddressExchange::check(const std::string& k) {
  ++traffic_.calls;
  traffic_.bytes += k.size();
  return store_.check({k});
}

void AddressExchange::wait(const std::string& k) {
  ++traffic_.calls;
  traffic_.bytes += k.size();
  store_.wait({k});
}

std::vector<std::vector<uint8_t>> AddressExchange::multiGet(const std::vector<std::string>& keys) {
  // A Store without the extended API (c10d's own fallback also reads key by key) costs a
  // call per key.
  std::vector<std::vector<uint8_t>> values;
  if (store_.hasExtendedApi()) {
    ++traffic_.calls;
    values = store_.multiGet(keys);
  } else {
    traffic_.calls += keys.size();
    for (const auto& k : keys) values.push_back(store_.get(k));
  }
  for (size_t i = 0; i < keys.size(); ++i) traffic_.bytes += keys[i].size() + values[i].size();
  return values;
}

void AddressExchange::append(const std::string& k, const std::vector<uint8_t>& value) {
  ++traffic_.calls;
  traffic_.bytes += k.size() + value.size();
  store_.append(k, value);
}

void AddressExchange::deleteKey(const std::string& k) {
  ++traffic_.calls;
  traffic_.bytes += k.size();
  store_.deleteKey(k);
}

const std::vector<uint8_t>& AddressExchange::tokenRecord() {
  if (tokenRecord_.empty()) tokenRecord_ = get(scope_ + "token");
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

std::vector<std::vector<std::vector<uint8_t>>> AddressExchange::exchange(
    const std::vector<std::vector<uint8_t>>& parts) {
  // Every rank appends "<rank:u32><length:u32><record>" to one key; the rank whose arrival
  // completes the count says so under "all_in", and every rank reads both in one multi-key
  // get (which waits for "all_in"): the records key then holds every rank's.
  if (rounds_ == kMaxRounds) {
    throw std::logic_error("address exchange: more than " + std::to_string(kMaxRounds) +
                           " rounds of records (csrc/address_exchange.cpp)");
  }
  const std::string recordsKey = scope_ + roundKey("records", rounds_);
  const std::string allInKey = scope_ + roundKey("all_in", rounds_);
  const std::string arrivedKey = scope_ + roundKey("arrived", rounds_);
  ++rounds_;
  std::vector<uint8_t> entry;
  const auto record = frame(parts);
  putU32(entry, static_cast<size_t>(rank_));
  putU32(entry, record.size());
  entry.insert(entry.end(), record.begin(), record.end());
  append(recordsKey, entry);
  const bool lastIn = add(arrivedKey, 1) == size_;
  if (lastIn) set(allInKey, {1});
  const std::string waitingFor =
      rounds_ == 1 ? "every rank's record" : "every rank's second record";
  std::vector<std::vector<uint8_t>> values;
  try {
    const auto read = [&] { values = multiGet({allInKey, recordsKey}); };
    if (lastIn) {
      read();
    } else {
      watched(waitingFor, allInKey, read);
    }
    if (givenUp(values[0])) throwGivenUp(waitingFor, values[0]);
  } catch (const c10::Error& e) {  // the Store's timeout, whichever Store it is
    throw SetupError(notJoined(recordsKey, e.what_without_backtrace()));
  }
  const std::vector<uint8_t>& blob = values[1];
  std::vector<std::vector<std::vector<uint8_t>>> all(size_);
  std::vector<bool> found(size_, false);
  size_t at = 0;
  while (blob.size() - at >= 8) {
    const uint32_t p = readU32(blob, at);
    const uint32_t n = readU32(blob, at + 4);
    at += 8;
    if ((p & kCardEntry) != 0 && blob.size() - at >= n) {  // a card (parseCards)
      at += n;
      continue;
    }
    if (p < static_cast<uint32_t>(size_) && found[p]) {
      // Two processes joined this creation as the same rank: the ranks were told to create
      // different groups under one id (see checkMembers in csrc/handshake.cpp).
      throw SetupError("rank " + std::to_string(p) + " published two records in this creation " +
                       "of the group (Store key " + recordsKey + "): two processes joined " +
                       "as rank " + std::to_string(p) + " (new_group called with different " +
                       "rank lists on different ranks, or two jobs sharing a Store and group " +
                       "name?)");
    }
    if (p >= static_cast<uint32_t>(size_) || blob.size() - at < n) break;
    found[p] = true;
    all[p] = unframe({blob.begin() + static_cast<std::ptrdiff_t>(at),
                      blob.begin() + static_cast<std::ptrdiff_t>(at + n)},
                     parts.size());
    at += n;
  }
  const auto missing = std::find(found.begin(), found.end(), false);
  if (at != blob.size() || missing != found.end()) {
    throw SetupError("the Store key " + recordsKey + " holds " + std::to_string(blob.size()) +
                     " bytes that are not the records of ranks 0.." + std::to_string(size_ - 1) +
                     (missing != found.end()
                          ? " (none from rank " + std::to_string(missing - found.begin()) + ")"
                          : "") +
                     ": another program writing the same Store keys, or ranks of different "
                     "ucxbackend releases?");
  }
  all[rank_] = parts;
  // The cards come in the first round's key; where hosts look alike none has a host.
  if (rounds_ == 1) {
    const Cards cards = parseCards(blob, size_);
    rank0HostsStore_ = std::any_of(cards.begin(), cards.end(), [](const auto& c) {
      return !c || !c->storeOutlivesRank0;
    });
    if (const std::string host = RankCard::mine().host; !host.empty()) {
      ranksOnHost_ = static_cast<int>(std::count_if(
          cards.begin(), cards.end(), [&](const auto& c) { return c && c->host == host; }));
    }
  }
  return all;
}

std::string AddressExchange::notJoined(const std::string& recordsKey,
                                       const std::string& storeSaid) {
  // Which ranks' records are missing: those ranks failed before the exchange (a bad option,
  // an error of their own) or died. The Store may itself be gone: then say only that.
  std::vector<bool> found(size_, false);
  try {
    const auto blob = check(recordsKey) ? get(recordsKey) : std::vector<uint8_t>{};
    for (size_t at = 0; blob.size() - at >= 8;) {
      const uint32_t p = readU32(blob, at);
      const uint32_t n = readU32(blob, at + 4);
      at += 8;
      if (blob.size() - at < n) break;
      if ((p & kCardEntry) == 0) {  // not a card (parseCards)
        if (p >= static_cast<uint32_t>(size_)) break;
        found[p] = true;
      }
      at += n;
    }
  } catch (const std::exception&) {
    found.assign(size_, true);  // unknown: name none
  }
  std::string missing;
  for (int p = 0; p < size_; ++p) {
    if (!found[p]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
  }
  return (missing.empty() ? std::string("a rank")
                          : (missing.find(',') == std::string::npos ? "rank " : "ranks ") +
                                missing) +
         " never joined this creation of the group within the Store's " +
         std::to_string(store_.getTimeout().count()) + " ms timeout (rank " +
         std::to_string(rank_) + " waited for every rank's record; a rank that failed before " +
         "the exchange says why itself; the Store said: " + storeSaid + ")";
}

bool AddressExchange::everyoneSays(const std::string& question, bool mine,
                                   const std::function<void()>& lastYes) {
  checkQuestion(question);
  const std::string answer = scope_ + question + "_answer";
  bool answered = true;
  if (!mine) {
    set(answer, {0});
  } else if (add(scope_ + question + "_yes", 1) == size_) {
    lastYes();
    set(answer, {1});
  } else {
    answered = false;
  }
  said_.push_back(question);
  const std::string waitingFor = "every rank's answer to '" + question + "'";
  std::vector<uint8_t> said;
  try {
    const auto read = [&] { said = get(answer); };
    if (answered) {
      read();
    } else {
      watched(waitingFor, answer, read);
    }
    if (givenUp(said)) throwGivenUp(waitingFor, said);
  } catch (const c10::Error& e) {  // the Store's timeout: a rank left between the two rounds
    // Only a rank that said yes waits (a no is its own answer).
    throw SetupError("not every rank answered '" + question + "' in this creation of the " +
                     "group within the Store's " + std::to_string(store_.getTimeout().count()) +
                     " ms timeout (" + counterForError(scope_ + question + "_yes") + " of " + std::to_string(size_) + " said yes, rank " + std::to_string(rank_) +
                     " among them: a rank failed or died after the exchange of records; the " +
                     "Store said: " + e.what_without_backtrace() + ")");
  }
  return !said.empty() && said[0] == 1;
}

std::string AddressExchange::counterForError(const std::string& key) {
  try {
    return std::to_string(add(key, 0));
  } catch (const std::exception&) {  // the Store itself may be gone by now
    return "?";
  }
}

void AddressExchange::complete() {
  completed_ = true;
  const std::string released = scope_ + "released";
  // Only rank 0 waits from here on, for the others: a rank that finished (its bit in "done")
  // may then exit (or die) without failing the creation.
  if (add(scope_ + "done", doneWeight(rank_, size_)) != allDone(size_)) {
    // Rank 0 returns only once every rank is done with the Store: in a short job (create,
    // exit) rank 0 often hosts the TCPStore, and its exit would otherwise cut off a slower
    // rank still cleaning up or reading its records. One wait for rank 0 alone, no barrier.
    // Under torchrun the agent hosts the Store, and rank 0 need not wait: the wait held every
    // rank's first op behind the slowest rank's clean-up (docs/performance.md, start-up).
    if (rank_ != 0 || !rank0HostsStore_) return;
    try {
      std::vector<uint8_t> said;
      watched("every rank to finish", released, [&] { said = get(released); });
      if (givenUp(said)) throwGivenUp("every rank to finish", said);
    } catch (const c10::Error& e) {  // the Store's timeout: a rank died before complete()
      throw SetupError("not every rank finished this creation of the group within the Store's " +
                       std::to_string(store_.getTimeout().count()) + " ms timeout (" +
                       doneForError() +
                       " of " + std::to_string(size_) + " did: a rank failed or died after the " +
                       "exchange of records; the Store said: " + e.what_without_backtrace() + ")");
    }
    deleteKey(released);
    return;
  }
  // Every rank has read all it will: delete this instance's keys, and those of the instances
  // that failed since the last completed one (no rank is in them any more: every rank is here).
  const int64_t cleaned = add(base_ + "cleaned", 0);
  DeferredCleanup cleanup{{}, base_ + "cleaned", std::max<int64_t>(0, instance_ - cleaned)};
  for (int64_t inst = cleaned + 1; inst <= instance_; ++inst) {
    const std::string prefix = base_ + std::to_string(inst) + "/";
    for (const char* single : kSingles) cleanup.keys.push_back(prefix + single);
    // This creation's rounds are known; a failed one may have reached any of them.
    for (int round = 0; round < (inst == instance_ ? rounds_ : kMaxRounds); ++round) {
      for (const char* name : kRoundKeys) cleanup.keys.push_back(prefix + roundKey(name, round));
    }
    for (const char* question : kQuestions) {
      cleanup.keys.push_back(prefix + question + "_yes");
      cleanup.keys.push_back(prefix + question + "_answer");
    }
  }
  if (!rank0HostsStore_) {
    // Nobody waits for them: they leave the creation's critical path (this rank is the
    // slowest to finish it, and every rank's first op waits for the slowest).
    deferred_ = std::move(cleanup);
    return;
  }
  for (const auto& key : cleanup.keys) deleteKey(key);
  if (cleanup.cleanedBy > 0) add(cleanup.cleanedKey, cleanup.cleanedBy);
  if (rank_ != 0) set(released, {1});  // rank 0 waits for it and deletes it
}

void AddressExchange::runCleanup(c10d::Store& store, const DeferredCleanup& cleanup) noexcept {
  try {
    for (const auto& key : cleanup.keys) store.deleteKey(key);
    if (cleanup.cleanedBy > 0) store.add(cleanup.cleanedKey, cleanup.cleanedBy);
  } catch (const std::exception&) {
    // The Store is gone (see the declaration).
  }
}

void AddressExchange::appendCard() {
  std::vector<uint8_t> entry;
  RankCard card = RankCard::mine();
  if (card.storeOutlivesRank0 && maybeRank0sTcpStore(store_)) card.storeOutlivesRank0 = false;
  const auto bytes = card.encode();
  putU32(entry, kCardEntry | static_cast<uint32_t>(rank_));
  putU32(entry, bytes.size());
  entry.insert(entry.end(), bytes.begin(), bytes.end());
  append(scope_ + roundKey("records", 0), entry);
}

std::string AddressExchange::doneForError() {
  try {
    return std::to_string(doneCount(add(scope_ + "done", 0), size_));
  } catch (const std::exception&) {  // the Store itself may be gone by now
    return "?";
  }
}

// The watch's connection to the Store (CreationWatch), opened at its first use: a creation
// whose waits all end before the watch's first look opens none.
struct AddressExchange::WatchStore {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Store> clone;
  c10d::Store& get() {
    if (!clone) clone = store->clone();
    return *clone;
  }
};

CreationWatch& AddressExchange::watch() {
  // A watch left behind in a Store call (spent) took its connection along: a new one.
  if (watch_ && !watch_->spent()) return *watch_;
  // The watch's thread may outlive this object (CreationWatch::endWait): it holds what it uses.
  watchStore_ = std::make_shared<WatchStore>(
      WatchStore{c10::intrusive_ptr<c10d::Store>::reclaim_copy(&store_), {}});
  watch_ = std::make_unique<CreationWatch>(
      rank_, [link = watchStore_, recordsKey = scope_ + roundKey("records", 0),
              size = size_](uint64_t& calls) -> Cards {
        c10d::Store& store = link->get();
        // No records: the last rank has finished and deleted the creation's keys (a get would
        // wait for them).
        ++calls;
        if (!store.check({recordsKey})) return Cards(size);
        ++calls;
        return parseCards(store.get(recordsKey), size);
      });
  return *watch_;
}

void AddressExchange::watched(const std::string& waitingFor, const std::string& waitedKey,
                              const std::function<void()>& call) {
  const std::string waiting = "rank " + std::to_string(rank_) + " waited for " + waitingFor;
  const bool finishing = waitedKey == scope_ + "released";  // rank 0, waiting for every rank
  CreationWatch& watch = this->watch();
  watch.beginWait([link = watchStore_, scope = scope_, size = size_, waitedKey, finishing,
                   waiting](int dead, Cards& cards, uint64_t& calls) -> std::string {
    c10d::Store& store = link->get();
    // The key waited for holds its value (or another rank's mark): the wait ends without
    // the dead rank, which may have finished the creation and exited. The creation is
    // closed: a rank gave it up, saying why, and may have exited since (a rank that timed
    // out waiting for one that never joined, say): this wait goes on to its own end.
    ++calls;
    bool settled = store.check({waitedKey});
    if (!settled) {
      ++calls;
      settled = store.check({scope + "closed"});
    }
    if (!settled && finishing) {
      ++calls;
      const int64_t done = store.add(scope + "done", 0);
      settled = size > kDoneBits || ((done >> dead) & 1) != 0;
    }
    if (settled) {
      cards[dead]->settled = true;
      return {};
    }
    const std::string why = deathOf(dead, *cards[dead], waiting);
    giveUp(store, scope, waitedKeys(scope), why, calls);
    return why;
  });
  try {
    call();
  } catch (const c10::Error& e) {  // the Store's timeout, or the Store gone
    if (const std::string found = watch.endWait(traffic_.watchCalls); !found.empty()) {
      closed_ = true;  // the watch gave the creation up: the destructor need not
      throw SetupError(found);
    }
    // The Store may have gone with a dead rank (a TCPStore is rank 0's), or the watch could
    // not reach it: the cards, where the watch read them, still name the ranks gone. All of
    // them: which went first (one killed, one that gave up on it and exited, say) cannot be
    // told from here.
    const Cards& cards = watch.cards();
    // A rank without a card never joined (or the watch never read them): the caller names the
    // ranks that never came, and a rank that timed out waiting for them and exited is no news.
    const auto noCard = [](const std::optional<RankCard>& card) { return !card; };
    if (cards.empty() || std::any_of(cards.begin(), cards.end(), noCard)) throw;
    std::string why;
    for (const int dead : deadRanks(cards, rank_)) {
      why += (why.empty() ? "" : "; ") + deathOf(dead, *cards[dead], waiting);
    }
    if (why.empty()) throw;
    throw SetupError(why + " (and the Store failed: " + e.what_without_backtrace() + ")");
  } catch (...) {
    watch.endWait(traffic_.watchCalls);
    throw;
  }
  if (const std::string found = watch.endWait(traffic_.watchCalls); !found.empty()) {
    closed_ = true;
    throw SetupError(found);
  }
}

void AddressExchange::throwGivenUp(const std::string& waitingFor,
                                   const std::vector<uint8_t>& mark) {
  closed_ = true;
  throw SetupError("this creation of the group was given up while rank " +
                   std::to_string(rank_) + " waited for " + waitingFor + ": " +
                   std::string(mark.begin() + 1, mark.end()));
}

}  // namespace ucxb
