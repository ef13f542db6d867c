// Builds the transport a process group runs on, from the group's options: "ucx" (UCX tag
// messaging) or "udp" (datagrams plus our own reliability layer). The one place that knows
// every transport; the rest of csrc/ sees only the Transport interface.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "csrc/address_exchange.hpp"
#include "csrc/backend_options.h"
#include "transports/transport.h"
#include "transports/udp/datagram_auth.h"

namespace ucxb {

// What carries this rank's messages in a ucx group whose ranks all share its host: "shm" (the
// backend's rings, transports/shm/) or "ucx", and why, from the group's one_host_transport,
// its cuda option, UCX_TLS and whether the kernel lets the shm transport watch its peers.
// makeTransport() follows it; `info` prints it.
struct OneHostChoice {
  std::string transport;
  std::string why;
};
OneHostChoice oneHostTransport(const BackendOptions& options);

// options.transport picks it; udp takes udp_config, udp_faults and udp_host. A bad udp_config
// (against this interface's MTU) is a config::ConfigError. `opTimeout` is the group's op
// timeout: udp never fails a merely silent peer before it (EndpointOptions::opTimeoutUs).
// `groupKey`: udp's authenticated mode (csrc/udp_auth_setup.hpp), nullopt for none.
// `anyHost`: false for the first try, with which a ucx transport guesses that the group shares
// this host unless the launcher says it spans hosts (csrc/launcher_hosts.hpp); true after the
// addresses showed that guess wrong (Transport::reachesAll).
std::unique_ptr<Transport> makeTransport(const BackendOptions& options, int rank, int size,
                                         AddressExchange& exchange,
                                         std::chrono::milliseconds opTimeout,
                                         const std::optional<udp::AuthKey>& groupKey,
                                         bool anyHost);

}  // namespace ucxb
