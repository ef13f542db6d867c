// What every rank of a group publishes when the group is created, in the one Store round that
// exchanges addresses: a record that names its transport, carries the settings every rank
// must share (FieldInfo::mustAgree in the schema) and then the transport's address. Every rank
// checks every rank's record before its transport sees an address, so a rank of another
// backend, of another ucxbackend release or with a disagreeing setting fails the group on
// every rank with an error naming both sides. Before, a udp address handed to UCX made UCX
// assert and abort the process, and disagreeing settings surfaced only in the first op, as
// a size mismatch or a hang. Torch-free.
//
// Layout (integers little-endian):
//   magic[4] version:u8
//   transport: len:u8 bytes
//   settings:  count:u16, each name (len:u16 bytes) and value (len:u16 bytes)
//   address:   len:u32 bytes
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "transports/config/schema.h"

namespace ucxb {

// The record's first bytes. Anything else under the key (a ucxbackend from before the record,
// which published bare transport addresses, or another program writing the same Store keys)
// is named as such instead of being read as an address.
inline constexpr uint8_t kHandshakeMagic[4] = {'U', 'C', 'X', 'B'};

// The layout after the magic. Raise it whenever the layout or the meaning of a field changes:
// ranks of different releases then fail naming both versions instead of misreading each
// other's records. 1: the first record. 2: a ucx address starts with its host's identity
// (the send lane's choice), and udp speaks wire version 3 (CREDIT and its catch-up flag);
// a rank of version 1 would hand the packed address to UCX as a worker address, and udp ops
// would time out with each end dropping the other's datagrams. 3: a ucx address carries,
// after its host, whether its worker reaches other hosts at all (a worker made for one host
// leaves TCP out); a rank of version 2 would read that byte as the start of UCX's address.
// 4: a collective's tags carry a fingerprint of its kind, dtype, reduce op and root
// (tag::markedGroup); a rank of version 3 would post tags that match none of this rank's,
// and every collective would time out; and the record carries the group's members
// (kMembersSetting).
inline constexpr uint8_t kHandshakeVersion = 4;

struct Handshake {
  std::string transport;                  // "ucx" or "udp": the backend's name
  std::vector<config::Setting> settings;  // what must be the same on every rank, canonical
  std::vector<uint8_t> address;           // the transport's localAddress()
};

// The name of the setting that carries the group's members (membersValue), checked apart
// from the knobs: ranks that disagree on it were told to create different groups.
inline constexpr const char* kMembersSetting = "members";

// The name of the setting that a rank whose transport could not be made (its UCP worker, its
// socket) publishes in place of an address, its value the reason (failedValue): every other
// rank then fails at once naming that rank and the reason, instead of waiting for a record
// that never comes until the Store's timeout. Checked before anything else of the record.
inline constexpr const char* kFailedSetting = "failed";

// `reason` as the failed setting's value: cut to fit a record's value (at most 65535 bytes).
std::string failedValue(const std::string& reason);

// The group's global ranks as the members setting's value: the list itself when it is short,
// else its length, ends and a hash (a record's value holds at most 65535 bytes).
std::string membersValue(const std::vector<int64_t>& globalRanks);

// A record that is not what this rank can connect to: another backend, another release, a
// disagreeing setting or bytes that are not a record. what() names the peer and both sides.
class HandshakeMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::vector<uint8_t> encodeHandshake(const Handshake& record);

// `records[p]` is what rank p published (this rank's own included). Returns the transport
// address of every rank, by rank, once every record has this rank's magic, version and
// transport and the same settings; else throws HandshakeMismatch. Every rank reads the same
// records, so where one rank throws, every rank does. Transport and format problems (a rank
// that published kFailedSetting among them) are reported before settings, the lowest rank
// first; for settings, the lowest rank that differs from this one, with every setting that
// differs.
std::vector<std::vector<uint8_t>> checkHandshakes(int rank, const Handshake& mine,
                                                  const std::vector<std::vector<uint8_t>>& records);

}  // namespace ucxb
