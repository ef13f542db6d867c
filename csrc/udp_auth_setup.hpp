// The udp transport's authenticated mode at group creation: the `secret_file` knob read and
// checked, the group instance's key derived from it (transports/udp/auth_keys.h), and what
// the ranks compare so that a rank with another secret, or none, fails the creation on every
// rank instead of timing out on datagrams it cannot verify. Torch-free: AddressExchange only
// declares the Store.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "csrc/address_exchange.hpp"
#include "csrc/backend_options.h"
#include "transports/udp/datagram_auth.h"

namespace ucxb {

// The group instance's key, or nullopt when the group is not udp or secret_file is unset.
// Throws config::ConfigError for a bad secret file or a build without OpenSSL.
std::optional<udp::AuthKey> udpGroupKey(const BackendOptions& options, const std::string& groupId,
                                        AddressExchange& exchange);

// `settings` (agreedSettings()) with the secret_file entry's value, a path that may differ
// per rank, replaced by what must match: "off" or "on, key check <hex>" (a MAC of a fixed
// label, never the secret or a key), or, where `unusable` says why this rank's secret file
// cannot be used, "unusable on that rank: <why>" (which no other rank can match, so every
// rank fails naming it); in a group of another transport the entry is dropped.
std::vector<config::Setting> withKeyCheck(std::vector<config::Setting> settings,
                                          const BackendOptions& options,
                                          const std::optional<udp::AuthKey>& groupKey,
                                          const std::string& unusable = "");

}  // namespace ucxb
