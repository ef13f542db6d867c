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
  // SecretBytes zeroes itself when freed, on every path out of here (exceptions included).
  const udp::SecretBytes secret = udp::readSecretFile(options.secretFile);
  return udp::deriveGroupKey(secret, exchange.creationSalt(), groupId, exchange.instance());
}

std::vector<config::Setting> withKeyCheck(std::vector<config::Setting> settings,
                                          const BackendOptions& options,
                                          const std::optional<udp::AuthKey>& groupKey,
                                          const std::string& unusable) {
  const auto it = std::find_if(settings.begin(), settings.end(),
                               [](const config::Setting& s) { return s.name == kSecretFile; });
  if (it == settings.end()) return settings;
  if (options.transport != "udp") {
    settings.erase(it);  // never read by another transport
  } else if (!unusable.empty()) {
    it->value = "unusable on that rank: " + unusable;
  } else {
    it->value = groupKey ? "on, key check " + udp::keyCheck(*groupKey) : std::string("off");
  }
  return settings;
}

}  // namespace ucxb
