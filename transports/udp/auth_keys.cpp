#include "transports/udp/auth_keys.h"

#include <memory>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "transports/udp/have_openssl.h"

#if UCXB_HAVE_OPENSSL
#include <openssl/evp.h>
#include <openssl/kdf.h>
#endif

namespace ucxb::udp {
namespace {

// Every derivation's info starts with its own label: no two derivations share an input.
constexpr std::string_view kGroupLabel = "ucxbackend udp v1 group key";
constexpr std::string_view kDirectionLabel = "ucxbackend udp v1 datagram key";
constexpr std::string_view kCheckLabel = "ucxbackend udp v1 key check";
constexpr size_t kCheckBytes = 8;

// Fixed-width fields, so that no two (label, group id, instance) spell the same info.
void appendUint(std::vector<uint8_t>& out, uint64_t v, size_t width) {
  for (size_t i = 0; i < width; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> infoOf(std::string_view label) {
  std::vector<uint8_t> info(label.begin(), label.end());
  info.push_back(0);
  return info;
}

#if UCXB_HAVE_OPENSSL

void hkdf(std::span<const uint8_t> secret, std::span<const uint8_t> salt,
          const std::vector<uint8_t>& info, uint8_t* out, size_t outBytes) {
  struct Free {
    void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
  };
  std::unique_ptr<EVP_PKEY_CTX, Free> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  size_t length = outBytes;
  // An empty salt is HKDF's default (a block of zeros); OpenSSL wants no call for it.
  const bool ok =
      ctx != nullptr && EVP_PKEY_derive_init(ctx.get()) > 0 &&
      EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) > 0 &&
      (salt.empty() ||
       EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), salt.data(), static_cast<int>(salt.size())) > 0) &&
      EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), secret.data(), static_cast<int>(secret.size())) > 0 &&
      EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), info.data(), static_cast<int>(info.size())) > 0 &&
      EVP_PKEY_derive(ctx.get(), out, &length) > 0 && length == outBytes;
  if (!ok) throw std::runtime_error("udp authentication: HKDF-SHA256 failed in OpenSSL");
}

#else

void hkdf(std::span<const uint8_t>, std::span<const uint8_t>, const std::vector<uint8_t>&,
          uint8_t*, size_t) {
  throw AuthUnavailable();
}

#endif

}  // namespace

AuthKey deriveGroupKey(std::span<const uint8_t> secret, std::span<const uint8_t> salt,
                       const std::string& groupId, int64_t instance) {
  std::vector<uint8_t> info = infoOf(kGroupLabel);
  appendUint(info, groupId.size(), 4);
  info.insert(info.end(), groupId.begin(), groupId.end());
  appendUint(info, static_cast<uint64_t>(instance), 8);
  AuthKey key{};
  hkdf(secret, salt, info, key.data(), key.size());
  return key;
}

AuthKey deriveDirectionKey(const AuthKey& groupKey, int sender, int receiver) {
  std::vector<uint8_t> info = infoOf(kDirectionLabel);
  appendUint(info, static_cast<uint64_t>(sender), 4);
  appendUint(info, static_cast<uint64_t>(receiver), 4);
  AuthKey key{};
  hkdf(groupKey, {}, info, key.data(), key.size());
  return key;
}

std::string keyCheck(const AuthKey& groupKey) {
  uint8_t check[kCheckBytes];
  hkdf(groupKey, {}, infoOf(kCheckLabel), check, sizeof check);
  static const char* const kHex = "0123456789abcdef";
  std::string out;
  for (uint8_t b : check) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

}  // namespace ucxb::udp
