#include "csrc/udp_auth_setup.hpp"

#include <algorithm>

#include "transports/udp/auth_keys.h"
#include "transports/udp/secret_file.h"

namespace ucxb {
namespace {

constexpr const char* kSecretFile = "secret_file";  // the knob (csrc/backend_options.cpp)

}  // namespace

std::optional<udp::AuthKey> udpGroupKey(const BackendOptions& options, const std::string& groupId,
                                        AddressExchange& exchange) {
  if (options.transport != "udp" || options.secretFile.empty()) return std::nullopt;
  if (!udp::authAvailable()) throw udp::AuthUnavailable();
  std::vector<uint8_t> secret = udp::readSecretFile(options.secretFile);
  const udp::AuthKey key =
      udp::deriveGroupKey(secret, exchange.creationSalt(), groupId, exchange.instance());
  // No copy of the secret outlives the derivation (volatile: the stores must not be dropped
  // as dead because the vector is freed next).
  volatile uint8_t* wipe = secret.data();
  for (size_t i = 0; i < secret.size(); ++i) wipe[i] = 0;
  return key;
}

std::vector<config::Setting> withKeyCheck(std::vector<config::Setting> settings,
                                          const BackendOptions& options,
                                          const std::optional<udp::AuthKey>& groupKey) {
  const auto it = std::find_if(settings.begin(), settings.end(),
                               [](const config::Setting& s) { return s.name == kSecretFile; });
  if (it == settings.end()) return settings;
  if (options.transport != "udp") {
    settings.erase(it);  // never read by another transport
  } else {
    it->value = groupKey ? "on, key check " + udp::keyCheck(*groupKey) : std::string("off");
  }
  return settings;
}

}  // namespace ucxb
