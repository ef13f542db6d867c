#include "csrc/udp_auth_setup.hpp"

#include "transports/udp/auth_keys.h"
#include "transports/udp/secret_file.h"

namespace ucxb {

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
  if (options.transport != "udp") return settings;
  settings.push_back({"secret_file", groupKey ? "on, key check " + udp::keyCheck(*groupKey)
                                              : std::string("off")});
  return settings;
}

}  // namespace ucxb
