#include "csrc/transport_factory.hpp"

#include "transports/udp/udp_transport.h"
#include "transports/ucx/ucx_transport.h"

namespace ucxb {

std::unique_ptr<Transport> makeTransport(const BackendOptions& options, int rank, int size,
                                         AddressExchange& exchange) {
  if (options.transport == "ucx") {
    return std::make_unique<ucx::UcxTransport>(rank, size, options.ucxNetDevices);
  }
  udp::UdpTransportOptions udpOptions;
  udpOptions.config = udp::parseUdpConfig(options.udpConfig);
  udpOptions.faults = udp::parseFaultConfig(options.udpFaults);
  udpOptions.bindHost = options.udpHost;
  udpOptions.sessionToken = exchange.sessionToken();
  return std::make_unique<udp::UdpTransport>(rank, size, std::move(udpOptions));
}

}  // namespace ucxb
