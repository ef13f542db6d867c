// The keys of the udp transport's authenticated mode, derived with HKDF-SHA256 (RFC 5869,
// OpenSSL's EVP_PKEY HKDF) from the user's secret (secret_file.h):
//
//   group key      = HKDF(secret, salt = the creation's random salt,
//                         info = label | group id | instance)
//   direction key  = HKDF(group key, info = label | sender rank | receiver rank)
//   key check      = HKDF(group key, info = label), 8 bytes, shown as hex
//
// The salt is drawn by rank 0 for every creation of a group and shared through the Store with
// the session token, so a group re-created under the same name and instance on a new Store
// gets new keys too: datagrams of another group, of an earlier instance of this one, or of an
// earlier job never verify. One key per direction keeps each key's nonces (datagram_auth.h)
// in one sender's hands. The key check goes into the group-creation record (csrc/handshake.h)
// so that ranks with different secrets, or one without, fail at creation on every rank; it is
// a MAC of a fixed label under a key derived from the secret (HKDF-Expand is HMAC), never the
// secret or a key itself. Torch-free.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "transports/udp/datagram_auth.h"

namespace ucxb::udp {

// The key of one group instance. Throws AuthUnavailable in a build without OpenSSL.
AuthKey deriveGroupKey(std::span<const uint8_t> secret, std::span<const uint8_t> salt,
                       const std::string& groupId, int64_t instance);

// The key of datagrams from `sender` to `receiver` in the group of `groupKey`.
AuthKey deriveDirectionKey(const AuthKey& groupKey, int sender, int receiver);

// What the ranks compare at creation: 16 hex digits.
std::string keyCheck(const AuthKey& groupKey);

}  // namespace ucxb::udp
