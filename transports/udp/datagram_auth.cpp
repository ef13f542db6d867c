#include "transports/udp/datagram_auth.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "transports/udp/have_openssl.h"

#if UCXB_HAVE_OPENSSL
#include <openssl/err.h>
#include <openssl/evp.h>
#endif

namespace ucxb::udp {
namespace {

constexpr size_t kNonceBytes = 12;

void putCounter(uint8_t* p, uint64_t v) {
  for (size_t i = 0; i < kAuthCounterBytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t getCounter(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = kAuthCounterBytes; i-- > 0;) v = v << 8 | p[i];
  return v;
}

std::array<uint8_t, 4> rankBytes(uint16_t sender, uint16_t receiver) {
  return {static_cast<uint8_t>(sender), static_cast<uint8_t>(sender >> 8),
          static_cast<uint8_t>(receiver), static_cast<uint8_t>(receiver >> 8)};
}

// (sender, receiver, counter): unique per key as long as the counter never repeats.
std::array<uint8_t, kNonceBytes> nonceOf(const std::array<uint8_t, 4>& ranks, const uint8_t* counter) {
  std::array<uint8_t, kNonceBytes> nonce{};
  std::copy(ranks.begin(), ranks.end(), nonce.begin());
  std::copy(counter, counter + kAuthCounterBytes, nonce.begin() + 4);
  return nonce;
}

}  // namespace

AuthUnavailable::AuthUnavailable()
    : config::ConfigError(
          "secret_file: authenticated udp needs OpenSSL's libcrypto, and this ucxbackend was "
          "built without it (<openssl/evp.h> was not found at build time). Install the "
          "OpenSSL development package (Debian/Ubuntu: apt-get install libssl-dev; "
          "Fedora/RHEL: dnf install openssl-devel) and rebuild ucxbackend (make build)") {}

#if UCXB_HAVE_OPENSSL

bool authAvailable() { return true; }

// One AES-256-GCM key, its schedule computed once; each datagram only sets the nonce.
class AesGcm {
 public:
  explicit AesGcm(const AuthKey& key) : ctx_(EVP_CIPHER_CTX_new()) {
    if (ctx_ == nullptr) fail("EVP_CIPHER_CTX_new");
    // The key is set for encryption; GCM's tag computation is the same either way, and a
    // receiver compares the tag itself (constant time) instead of switching the context's
    // direction per datagram.
    if (EVP_EncryptInit_ex(ctx_.get(), EVP_aes_256_gcm(), nullptr, key.data(), nullptr) != 1) {
      fail("EVP_EncryptInit_ex(aes-256-gcm)");
    }
  }

  // The tag of `bytes` (all associated data) under `nonce`.
  void tag(std::span<const uint8_t> bytes, const std::array<uint8_t, kNonceBytes>& nonce,
           uint8_t* out) {
    int written = 0;
    uint8_t none[16];
    if (EVP_EncryptInit_ex(ctx_.get(), nullptr, nullptr, nullptr, nonce.data()) != 1 ||
        EVP_EncryptUpdate(ctx_.get(), nullptr, &written, bytes.data(),
                          static_cast<int>(bytes.size())) != 1 ||
        EVP_EncryptFinal_ex(ctx_.get(), none, &written) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx_.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(kAuthTagBytes),
                            out) != 1) {
      fail("AES-256-GCM tag");
    }
  }

 private:
  [[noreturn]] static void fail(const char* what) {
    const unsigned long code = ERR_get_error();
    char reason[256] = "unknown error";
    if (code != 0) ERR_error_string_n(code, reason, sizeof reason);
    throw std::runtime_error(std::string("udp authentication: ") + what +
                             " failed in OpenSSL: " + reason);
  }
  struct Free {
    void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
  };
  std::unique_ptr<EVP_CIPHER_CTX, Free> ctx_;
};

#else

bool authAvailable() { return false; }

class AesGcm {
 public:
  explicit AesGcm(const AuthKey&) { throw AuthUnavailable(); }
  void tag(std::span<const uint8_t>, const std::array<uint8_t, kNonceBytes>&, uint8_t*) {}
};

#endif

DatagramSealer::DatagramSealer(const AuthKey& key, uint16_t sender, uint16_t receiver)
    : cipher_(std::make_unique<AesGcm>(key)), ranks_(rankBytes(sender, receiver)) {}

DatagramSealer::~DatagramSealer() = default;

size_t DatagramSealer::seal(std::span<uint8_t> buffer, size_t length) {
  if (length > buffer.size() || buffer.size() - length < kAuthTrailerBytes) {
    throw std::length_error("udp authentication: no room for the " +
                            std::to_string(kAuthTrailerBytes) + "-byte trailer after " +
                            std::to_string(length) + " bytes in a buffer of " +
                            std::to_string(buffer.size()));
  }
  // 2^64 datagrams would take centuries at line rate; refusing beats reusing a nonce.
  if (next_ == UINT64_MAX) throw std::overflow_error("udp authentication: counter exhausted");
  uint8_t* counter = buffer.data() + length;
  putCounter(counter, next_++);
  cipher_->tag(buffer.first(length + kAuthCounterBytes), nonceOf(ranks_, counter),
               counter + kAuthCounterBytes);
  return length + kAuthTrailerBytes;
}

DatagramOpener::DatagramOpener(const AuthKey& key, uint16_t sender, uint16_t receiver)
    : cipher_(std::make_unique<AesGcm>(key)), ranks_(rankBytes(sender, receiver)) {}

DatagramOpener::~DatagramOpener() = default;

OpenResult DatagramOpener::open(std::span<const uint8_t> datagram) {
  if (datagram.size() < kAuthTrailerBytes) {
    ++authFailed_;
    return OpenResult::kAuthFailed;
  }
  const size_t signedBytes = datagram.size() - kAuthTagBytes;
  const uint8_t* counterAt = datagram.data() + signedBytes - kAuthCounterBytes;
  const uint64_t counter = getCounter(counterAt);
  // The tag is checked whatever the window says, so that only a genuine datagram counts as
  // replayed (a forged one with an old counter is a forgery). A counter is recorded in the
  // window only once its datagram proved genuine.
  const bool fresh = window_.fresh(counter);
  uint8_t expected[kAuthTagBytes] = {};
  cipher_->tag(datagram.first(signedBytes), nonceOf(ranks_, counterAt), expected);
  // Constant time: how many leading tag bytes matched must not show in the timing.
  uint8_t diff = 0;
  for (size_t i = 0; i < kAuthTagBytes; ++i) diff |= expected[i] ^ datagram[signedBytes + i];
  if (diff != 0) {
    ++authFailed_;
    return OpenResult::kAuthFailed;
  }
  if (!fresh) {
    ++replayed_;
    return OpenResult::kReplayed;
  }
  window_.mark(counter);
  return OpenResult::kAccepted;
}

}  // namespace ucxb::udp
