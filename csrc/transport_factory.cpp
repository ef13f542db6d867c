#include "csrc/transport_factory.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstdint>

#include "csrc/device_presence.hpp"
#include "csrc/launcher_hosts.hpp"
#include "transports/shm/shared_segment.h"
#include "transports/shm/shm_transport.h"
#include "transports/udp/udp_transport.h"
#include "transports/ucx/ucx_transport.h"

namespace ucxb {

OneHostChoice oneHostTransport(const BackendOptions& options) {
  const std::string& asked = options.oneHostTransport;
  if (asked == "ucx") return {"ucx", "one_host_transport=ucx"};
  // Without pidfds (Linux before 5.3) a dead peer would hang its receivers over shm; UCX
  // watches its peers itself.
  if (!shm::ShmTransport::available()) return {"ucx", "this kernel has no pidfd_open"};
  if (asked == "shm") return {"shm", "one_host_transport=shm"};
  // auto: UCX where it has what the rings lack (CUDA IPC, for a rank that carries CUDA
  // tensors and has a GPU to make them on) or where the user chose UCX's transports. A host
  // without a GPU keeps the rings: no CUDA tensor can reach the group there.
  if (options.cuda != 0 && cudaDeviceVisible()) {
    return {"ucx", "one_host_transport=auto, cuda=1 and a GPU is visible (UCX's cuda_ipc)"};
  }
  if (std::getenv("UCX_TLS") != nullptr) {
    return {"ucx", "one_host_transport=auto and UCX_TLS is set"};
  }
  return {"shm", "one_host_transport=auto"};
}

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
    // An inbox that cannot be made here (/dev/shm full or missing) leaves UCX to try.
    if (guessOneHost && oneHostTransport(options).transport == "shm") {
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
