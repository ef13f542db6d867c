#include "csrc/transport_factory.hpp"

#include <c10/util/Exception.h>

#include "transports/udp/key_values.h"
#include "transports/udp/udp_transport.h"
#include "transports/ucx/ucx_transport.h"

namespace ucxb {
namespace {

std::string option(const std::map<std::string, std::string>& options, const std::string& key,
                   const std::string& fallback) {
  const auto it = options.find(key);
  return it == options.end() ? fallback : it->second;
}

}  // namespace

std::string transportName(const std::map<std::string, std::string>& options) {
  const std::string name = option(options, "transport", "ucx");
  if (name != "ucx" && name != "udp") {
    throw c10::ValueError({__func__, __FILE__, __LINE__},
                          "ucxbackend: transport must be 'ucx' or 'udp', got '" + name + "'");
  }
  return name;
}

std::unique_ptr<Transport> makeTransport(const std::map<std::string, std::string>& options,
                                         int rank, int size, AddressExchange& exchange) {
  if (transportName(options) == "ucx") return std::make_unique<ucx::UcxTransport>(rank, size);
  udp::UdpTransportOptions udpOptions;
  try {
    udpOptions.config = udp::parseUdpConfig(option(options, "udp_config", ""));
    udpOptions.faults = udp::parseFaultConfig(option(options, "udp_faults", ""));
  } catch (const udp::ConfigError& e) {
    throw c10::ValueError({__func__, __FILE__, __LINE__}, e.what());
  }
  udpOptions.bindHost = option(options, "udp_host", "127.0.0.1");
  udpOptions.sessionToken = exchange.sessionToken();
  return std::make_unique<udp::UdpTransport>(rank, size, std::move(udpOptions));
}

}  // namespace ucxb
