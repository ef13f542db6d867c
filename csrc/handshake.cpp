#include "csrc/handshake.h"

#include <algorithm>
#include <cstdio>
#include <cstddef>
#include <limits>
#include <optional>

namespace ucxb {
namespace {

std::string rankName(int p) { return "rank " + std::to_string(p); }

class Writer {
 public:
  void raw(const uint8_t* p, size_t n) { out_.insert(out_.end(), p, p + n); }
  void u8(uint64_t v) { le(v, 1); }
  void u16(uint64_t v) { le(v, 2); }
  void u32(uint64_t v) { le(v, 4); }

  // `s` with its length in `width` bytes before it.
  template <typename Bytes>
  void sized(const Bytes& s, size_t width, const std::string& what) {
    const uint64_t max = (uint64_t{1} << (8 * width)) - 1;
    if (s.size() > max) {
      throw HandshakeMismatch("this rank's " + what + " (" + std::to_string(s.size()) +
                              " bytes) is too long for the address record (at most " +
                              std::to_string(max) + ")");
    }
    le(s.size(), width);
    raw(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }

  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  void le(uint64_t v, size_t width) {
    for (size_t i = 0; i < width; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> out_;
};

// Reads a record; every read past the end reports the record as truncated.
class Reader {
 public:
  Reader(const std::vector<uint8_t>& in, int peer) : in_(in), peer_(peer) {}

  uint64_t uint(size_t width) {
    need(width);
    uint64_t v = 0;
    for (size_t i = 0; i < width; ++i) v |= uint64_t{in_[at_ + i]} << (8 * i);
    at_ += width;
    return v;
  }
  std::string text(size_t width) {
    const auto n = static_cast<size_t>(uint(width));
    need(n);
    std::string s(in_.begin() + static_cast<std::ptrdiff_t>(at_),
                  in_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += n;
    return s;
  }
  std::vector<uint8_t> bytes(size_t width) {
    const auto n = static_cast<size_t>(uint(width));
    need(n);
    std::vector<uint8_t> b(in_.begin() + static_cast<std::ptrdiff_t>(at_),
                           in_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += n;
    return b;
  }
  void end() const {
    if (at_ != in_.size()) malformed("has " + std::to_string(in_.size() - at_) +
                                     " bytes after its end");
  }

 private:
  void need(size_t n) const {
    if (in_.size() - at_ < n) malformed("is truncated");
  }
  [[noreturn]] void malformed(const std::string& how) const {
    throw HandshakeMismatch(rankName(peer_) + "'s address record (" +
                            std::to_string(in_.size()) + " bytes) " + how);
  }

  const std::vector<uint8_t>& in_;
  const int peer_;
  size_t at_ = 0;
};

// The record of `peer`, after its magic and version have been checked.
Handshake decode(const std::vector<uint8_t>& record, int peer) {
  const bool magic = record.size() >= sizeof(kHandshakeMagic) &&
                     std::equal(std::begin(kHandshakeMagic), std::end(kHandshakeMagic),
                                record.begin());
  if (!magic) {
    throw HandshakeMismatch(rankName(peer) + " published " + std::to_string(record.size()) +
                            " bytes that are not a ucxbackend address record (a ucxbackend "
                            "release from before the record, or another program writing "
                            "the same Store keys?)");
  }
  Reader r(record, peer);
  r.uint(sizeof(kHandshakeMagic));
  const auto version = r.uint(1);
  if (version != kHandshakeVersion) {
    throw HandshakeMismatch(rankName(peer) + " published an address record of version " +
                            std::to_string(version) + " but this rank reads version " +
                            std::to_string(kHandshakeVersion) +
                            ": every rank must run the same ucxbackend release");
  }
  Handshake h;
  h.transport = r.text(1);
  const auto count = r.uint(2);
  for (uint64_t i = 0; i < count; ++i) {
    config::Setting s;
    s.name = r.text(2);
    s.value = r.text(2);
    h.settings.push_back(std::move(s));
  }
  h.address = r.bytes(4);
  r.end();
  return h;
}

std::optional<std::string> valueOf(const std::vector<config::Setting>& settings,
                                   const std::string& name) {
  for (const auto& s : settings) {
    if (s.name == name) return s.value;
  }
  return std::nullopt;
}

std::string shown(const std::optional<std::string>& value) {
  return value ? "'" + *value + "'" : "unset";
}

// Every setting whose value differs between `mine` and `theirs` (a setting either lacks
// counts as unset), in `mine`'s order then `theirs`'.
std::vector<std::string> differences(int rank, const std::vector<config::Setting>& mine,
                                     int peer, const std::vector<config::Setting>& theirs) {
  std::vector<std::string> names;
  // The members are checkMembers' own, a failure checkHandshakes' first check.
  const auto own = [](const config::Setting& s) {
    return s.name == kMembersSetting || s.name == kFailedSetting;
  };
  for (const auto& s : mine) {
    if (!own(s)) names.push_back(s.name);
  }
  for (const auto& s : theirs) {
    if (!valueOf(mine, s.name) && !own(s)) names.push_back(s.name);
  }
  std::vector<std::string> out;
  for (const auto& name : names) {
    const auto a = valueOf(mine, name);
    const auto b = valueOf(theirs, name);
    if (a == b) continue;
    out.push_back(name + " is " + shown(a) + " on " + rankName(rank) + " (this rank) but " +
                  shown(b) + " on " + rankName(peer));
  }
  return out;
}

// Two ranks created as members of different groups under one group id and Store: torch's
// new_group called with different rank lists on different ranks (its group names count
// calls, so both groups get the same name), or two jobs sharing a Store and group name.
void checkMembers(int rank, const Handshake& mine, int peer, const Handshake& theirs) {
  const auto a = valueOf(mine.settings, kMembersSetting);
  const auto b = valueOf(theirs.settings, kMembersSetting);
  if (a == b) return;
  throw HandshakeMismatch(rankName(peer) + " joined this group as a member of global ranks " +
                          shown(b) + " but " + rankName(rank) + " (this rank) of " + shown(a) +
                          ": every rank must create the group with the same ranks (new_group "
                          "called with different rank lists on different ranks?)");
}

}  // namespace

std::string membersValue(const std::vector<int64_t>& globalRanks) {
  std::string list;
  for (size_t i = 0; i < globalRanks.size(); ++i) {
    list += (i == 0 ? "" : ",") + std::to_string(globalRanks[i]);
  }
  if (list.size() <= 200) return "[" + list + "]";
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the whole list
  for (const char c : list) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::to_string(globalRanks.size()) + " ranks " + std::to_string(globalRanks.front()) +
         ".." + std::to_string(globalRanks.back()) + ", hash " + hex;
}

std::string failedValue(const std::string& reason) {
  constexpr size_t kMax = 4000;  // well inside a value's 65535 bytes; a reason is a line or two
  return reason.size() <= kMax ? reason : reason.substr(0, kMax) + "...";
}

std::vector<uint8_t> encodeHandshake(const Handshake& record) {
  Writer w;
  w.raw(kHandshakeMagic, sizeof(kHandshakeMagic));
  w.u8(kHandshakeVersion);
  w.sized(record.transport, 1, "transport name");
  if (record.settings.size() > std::numeric_limits<uint16_t>::max()) {
    throw HandshakeMismatch("this rank has too many settings for the address record");
  }
  w.u16(record.settings.size());
  for (const auto& s : record.settings) {
    w.sized(s.name, 2, "setting name " + s.name.substr(0, 40));
    w.sized(s.value, 2, "value of " + s.name);
  }
  w.sized(record.address, 4, "transport address");
  return w.take();
}

std::vector<std::vector<uint8_t>> checkHandshakes(int rank, const Handshake& mine,
                                                  const std::vector<std::vector<uint8_t>>& records) {
  std::vector<Handshake> all(records.size());
  for (size_t p = 0; p < records.size(); ++p) {
    const int peer = static_cast<int>(p);
    if (peer == rank) continue;
    all[p] = decode(records[p], peer);
    if (const auto why = valueOf(all[p].settings, kFailedSetting)) {
      throw HandshakeMismatch(rankName(peer) + " could not make its " + all[p].transport +
                              " transport for this group, so no rank can create it: " + *why);
    }
    if (all[p].transport != mine.transport) {
      throw HandshakeMismatch(rankName(peer) + " published a " + all[p].transport +
                              " address but this group is " + mine.transport +
                              ": every rank of a group must use the same backend");
    }
  }
  for (size_t p = 0; p < records.size(); ++p) {
    const int peer = static_cast<int>(p);
    if (peer != rank) checkMembers(rank, mine, peer, all[p]);
  }
  for (size_t p = 0; p < records.size(); ++p) {
    const int peer = static_cast<int>(p);
    if (peer == rank) continue;
    const auto diff = differences(rank, mine.settings, peer, all[p].settings);
    if (diff.empty()) continue;
    std::string what = "the ranks disagree on settings that must be the same on every rank: ";
    for (size_t i = 0; i < diff.size(); ++i) what += (i == 0 ? "" : "; ") + diff[i];
    throw HandshakeMismatch(what + " (set them alike on every rank, in the environment or in "
                                   "pg_options)");
  }
  std::vector<std::vector<uint8_t>> addresses(records.size());
  for (size_t p = 0; p < records.size(); ++p) {
    addresses[p] = static_cast<int>(p) == rank ? mine.address : std::move(all[p].address);
  }
  return addresses;
}

}  // namespace ucxb
