// Authentication of single datagrams (the udp transport's authenticated mode, enabled by the
// `secret_file` knob): every datagram leaves with a trailer that proves it was sent by the
// holder of the direction's key, for this group instance, once. Sans-IO and torch-free: the
// Endpoint seals what its connections send and opens what arrives before a connection sees it,
// so the simulator and the fuzzer run with it as the socket loop does.
//
// The trailer, after the datagram's own bytes (header, payload and CRC unchanged):
//   u64 counter   little-endian, 0, 1, 2, ... per direction key: never repeats under one key
//   16 bytes      AES-256-GCM tag over every byte before it (header, payload and counter)
//
// AES-256-GCM is used as a MAC (GMAC: all of the datagram is associated data, nothing is
// encrypted): the payload travels in clear, as without authentication. Encrypting would cost
// a second pass over every payload byte on both sides and, on the receiving side, a copy out
// of the socket's buffer before the bytes could be trusted; what the mode is for is that no
// one without the secret can inject, alter or replay traffic (docs/failure-model.md#security).
// The 96-bit nonce is (sender rank u16, receiver rank u16, counter u64): the counter alone
// makes it unique under a key (each key belongs to one direction of one group instance,
// auth_keys.h), the ranks make a key used in the wrong direction fail.
//
// A datagram that does not verify (forged, altered, truncated, under another group's or
// instance's key, without a trailer) counts as auth_failed; one that verifies but whose
// counter was accepted before or is older than the replay window counts as replayed.
//
// Needs OpenSSL's libcrypto (EVP). In a build without it (have_openssl.h) the
// classes throw AuthUnavailable when constructed: the mode is refused with a way to fix it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "transports/config/key_values.h"
#include "transports/udp/replay_window.h"

namespace ucxb::udp {

constexpr size_t kAuthKeyBytes = 32;
constexpr size_t kAuthCounterBytes = 8;
constexpr size_t kAuthTagBytes = 16;
constexpr size_t kAuthTrailerBytes = kAuthCounterBytes + kAuthTagBytes;

using AuthKey = std::array<uint8_t, kAuthKeyBytes>;

// Whether this build can authenticate (it was compiled and linked with OpenSSL's libcrypto).
bool authAvailable();

// The authenticated mode was asked for in a build without OpenSSL. A ConfigError: the group's
// configuration cannot be honoured here; the message says how to fix it.
class AuthUnavailable : public config::ConfigError {
 public:
  AuthUnavailable();
};

class AesGcm;  // the EVP context of one key (datagram_auth.cpp)

enum class OpenResult : uint8_t { kAccepted, kAuthFailed, kReplayed };

// The sending side of one direction (this rank -> peer).
class DatagramSealer {
 public:
  DatagramSealer(const AuthKey& key, uint16_t sender, uint16_t receiver);
  ~DatagramSealer();
  DatagramSealer(const DatagramSealer&) = delete;
  DatagramSealer& operator=(const DatagramSealer&) = delete;

  // Appends the trailer after the first `length` bytes of `buffer` and returns the sealed
  // length (length + kAuthTrailerBytes). Throws std::length_error if `buffer` has no room.
  size_t seal(std::span<uint8_t> buffer, size_t length);
  uint64_t sealed() const { return next_; }  // datagrams sealed so far = next counter

 private:
  std::unique_ptr<AesGcm> cipher_;
  std::array<uint8_t, 4> ranks_;
  uint64_t next_ = 0;
};

// The receiving side of one direction (peer -> this rank).
class DatagramOpener {
 public:
  DatagramOpener(const AuthKey& key, uint16_t sender, uint16_t receiver);
  ~DatagramOpener();
  DatagramOpener(const DatagramOpener&) = delete;
  DatagramOpener& operator=(const DatagramOpener&) = delete;

  // Verifies `datagram` (trailer included). On kAccepted the datagram's own bytes are its
  // first datagram.size() - kAuthTrailerBytes; on anything else it must be dropped.
  OpenResult open(std::span<const uint8_t> datagram);

  uint64_t authFailed() const { return authFailed_; }
  uint64_t replayed() const { return replayed_; }

 private:
  std::unique_ptr<AesGcm> cipher_;
  std::array<uint8_t, 4> ranks_;
  ReplayWindow window_;
  uint64_t authFailed_ = 0;
  uint64_t replayed_ = 0;
};

}  // namespace ucxb::udp
