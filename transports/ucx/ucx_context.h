// A UCP context shared by every group's worker that asks for the same devices. Creating a
// context reads the UCX_* environment and loads transport modules, which costs milliseconds;
// workers are cheap. The devices a group picked (UCXBACKEND_IFNAME) are set on its context's
// configuration, never in the process environment, so a later group can pick others.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ucxb::ucx {

// A UCX setting the backend chooses for its context where the user has not: the variables
// are set together, and setting any of them in the environment keeps UCX's own defaults for
// all of them. `info` shows the table (module.cpp) and works out the same rule in Python.
struct UcxDefault {
  std::vector<std::string> variables;  // UCX_* names
  std::string value;
  // Oldest UCX (major, minor) that takes the setting through ucp_config_modify: older ones
  // accept transport-prefixed names such as TCP_TX_SEG_SIZE but never apply them (and warn
  // at every worker creation). A setting that fails on a new enough UCX is an error.
  unsigned minMajor = 0;
  unsigned minMinor = 0;
};

const std::vector<UcxDefault>& ucxDefaults();

// Which peers a context's workers must reach. kOneHost: the group's ranks are guessed to share
// this host (the guess is checked in the address exchange, and a group that spans hosts makes
// a kAnyHost worker then), so the context leaves out kOneHostTls, the transports only a peer
// on another host uses, unless the user set UCX_TLS. kAnyHost: UCX's choice, or the user's.
enum class Reach { kAnyHost, kOneHost };

// UCX_TLS for a kOneHost context. TCP is the transport that costs start-up here: at every
// query of a tcp interface (one per active-message id at worker creation, again at each
// endpoint's lane selection) UCX re-reads sysfs, opens a socket for SIOCGIF* ioctls and
// parses /proc/net/route; leaving it out cut an 8-rank start's CPU by about a fifth
// (docs/performance.md#start-up). Shared memory (posix, sysv, cma), self and the CUDA
// transports stay: they carry every same-host byte UCX moves. RDMA transports stay too: UCX
// may pick them for large same-host transfers, and no RDMA host was measured.
inline constexpr const char* kOneHostTls = "^tcp";
// Whether `d` is applied here: this UCX is new enough and the user set none of its variables.
bool appliesNow(const UcxDefault& d);

class Context {
 public:
  // Returns the live context for `netDevices` (UCX_NET_DEVICES' syntax; "" keeps UCX's own
  // choice) and `reach`, creating it on first use (thread-safe).
  static std::shared_ptr<Context> shared(const std::string& netDevices,
                                         Reach reach = Reach::kAnyHost);

  Context(ucp_context_h handle, bool sharedMemory, bool oneHostOnly)
      : handle_(handle), sharedMemory_(sharedMemory), oneHostOnly_(oneHostOnly) {}
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context_h handle() const { return handle_; }
  // Whether the UCX_TLS this context was created with leaves UCX's shared-memory transports
  // in (shared_memory_tls.h): read with the rest of UCX's configuration, so the answer is
  // the one UCX itself acts on.
  bool sharedMemory() const { return sharedMemory_; }
  // Whether this context left out kOneHostTls (a kOneHost context the user's UCX_TLS did not
  // override): its workers reach no peer on another host.
  bool oneHostOnly() const { return oneHostOnly_; }
  // contextTransports() of this context, read once (thread-safe).
  const std::vector<std::string>& transports() const;

 private:
  ucp_context_h handle_;
  bool sharedMemory_;
  bool oneHostOnly_;
  mutable std::once_flag transportsRead_;
  mutable std::vector<std::string> transports_;
};

}  // namespace ucxb::ucx
