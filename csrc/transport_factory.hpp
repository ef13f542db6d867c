// Builds the transport a process group runs on, from the group's options: "ucx" (UCX tag
// messaging) or "udp" (datagrams plus our own reliability layer). The one place that knows
// every transport; the rest of csrc/ sees only the Transport interface.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "csrc/address_exchange.hpp"
#include "transports/transport.h"

namespace ucxb {

// options["transport"]: "ucx" (default) or "udp". For udp: "udp_config" (key=value list, see
// transports/udp/udp_config.h), "udp_faults" (see faults.h) and "udp_host" (the numeric
// address to bind). Bad values raise c10::ValueError naming the option.
std::unique_ptr<Transport> makeTransport(const std::map<std::string, std::string>& options,
                                         int rank, int size, AddressExchange& exchange);

// The backend name for options["transport"] (what getBackendName() reports).
std::string transportName(const std::map<std::string, std::string>& options);

}  // namespace ucxb
