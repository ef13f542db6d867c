#include "csrc/transport_factory.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstdint>

#include "csrc/launcher_hosts.hpp"
#include "transports/shm/shared_segment.h"
#include "transports/shm/shm_transport.h"
#include "transports/udp/udp_transport.h"
#include "transports/ucx/ucx_transport.h"

namespace ucxb {

namespace {

// one_host_transport: "auto" takes UCX where UCX has something this transport lacks (CUDA
// IPC for a rank that carries CUDA tensors) or where the user chose UCX's transports
// (UCX_TLS); the backend's own shared-memory rings otherwise.
bool wantsSharedMemoryTransport(const BackendOptions& options) {
  if (options.oneHostTransport == "shm") return true;
  if (options.oneHostTransport != "auto") return false;
  return options.cuda == 0 && std::getenv("UCX_TLS") == nullptr;
}

}  // namespace

std::unique_ptr<Transport> makeTransport(const BackendOptions& options, int rank, int size,
                                         AddressExchange& exchange,
                                         std::chrono::milliseconds opTimeout,
                                         const std::optional<udp::AuthKey>& groupKey,
                                         bool anyHost) {
  if (options.transport == "ucx") {
    // Without a boot id two hosts can carry one identity (shm::hostIdentityIsUnique), and a
    // group that wrongly agreed it shares a host would have no TCP between its hosts.
    const bool guessOneHost =
        !anyHost && !launcherSpansHosts(size) && shm::hostIdentityIsUnique();
    // A host without pidfds (Linux before 5.3) keeps UCX, which watches its peers itself.
    // One that cannot be made here (/dev/shm full or missing) leaves UCX to try.
    if (guessOneHost && wantsSharedMemoryTransport(options) && shm::ShmTransport::available()) {
      try {
        return std::make_unique<shm::ShmTransport>(rank, size);
      } catch (const TransportError&) {
      }
    }
    return std::make_unique<ucx::UcxTransport>(
        rank, size, options.ucxNetDevices, ucx::parseSendLaneMode(options.sendLane),
        guessOneHost ? ucx::Reach::kOneHost : ucx::Reach::kAnyHost);
  }
  udp::UdpTransportOptions udpOptions;
  udpOptions.config = udp::parseUdpConfig(options.udpConfig);
  // One section per path ("...;..."): the first is every path's unless a later one says
  // otherwise (EndpointOptions::pathFaults).
  auto faultPaths = udp::parseFaultPaths(options.udpFaults);
  udpOptions.faults = faultPaths.front();
  if (faultPaths.size() > 1) udpOptions.pathFaults = std::move(faultPaths);
  udpOptions.bindHost = options.udpHost;
  udpOptions.sessionToken = exchange.sessionToken();
  udpOptions.groupKey = groupKey;
  udpOptions.opTimeoutUs =
      static_cast<udp::DurationUs>(std::max<int64_t>(0, opTimeout.count())) * 1000;
  return std::make_unique<udp::UdpTransport>(rank, size, std::move(udpOptions));
}

}  // namespace ucxb
