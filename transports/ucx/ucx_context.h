// A UCP context shared by every group's worker that asks for the same devices. Creating a
// context reads the UCX_* environment and loads transport modules, which costs milliseconds;
// workers are cheap. The devices a group picked (UCXBACKEND_IFNAME) are set on its context's
// configuration, never in the process environment, so a later group can pick others.
#pragma once

#include <ucp/api/ucp.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
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
// (docs/performance.md#start-up). posix goes too: with both of UCX's shared-memory (mm)
// transports open, UCX puts a same-host peer on sysv (its lanes never used posix here), yet
// every worker set posix's interface up, writing its receive FIFO and first buffers through a
// /dev/shm file, about 0.8 ms of CPU per worker. sysv, cma, self and the CUDA transports stay:
// they carry every same-host byte UCX moves. RDMA transports stay too: UCX may pick them for
// large same-host transfers, and no RDMA host was measured.
inline constexpr const char* kOneHostTls = "^tcp,posix";
// UCX_TLS for a kOneHost context where UCX opened no sysv memory domain with kOneHostTls
// (a UCX or kernel without SysV shared memory): posix is then the same-host transport.
inline constexpr const char* kOneHostWithoutSysvTls = "^tcp";
// (lacksSysv, shared_memory_tls.h, tells from the transports the context opened.)

// UCX's loadable modules that serve only device memory, in UCX_MODULES' syntax (glob
// patterns, case-sensitive): the CUDA, ROCm and oneAPI Level Zero transports and memory hooks
// (libuct_cuda, libucm_cuda, ...). UCX loads every module it finds when the process first
// reads its configuration, and the wheel's CUDA modules cost every process, also on a host
// without a GPU driver (where each dlopen fails after searching for libcuda): 0.37 ms of CPU
// in ucp_config_read and ucp_init here (docs/performance.md#start-up).
inline constexpr const char* kDeviceModules = "cuda*,rocm*,ze*";
// Keeps UCX from loading kDeviceModules in this process (UCX_MODULES=^kDeviceModules), for
// a torch that cannot hold device tensors (ucxbackend/__init__.py decides). UCX's modules
// are process-wide and loaded once, at the first context (or `info`): called after that, or
// where the user set UCX_MODULES, it changes nothing. Returns whether it applied.
bool leaveDeviceModulesOut();
// UCX's components (memory domains) whose memory needs no registration with the device that
// moves it: the CPU copies them itself. Where every component this process's UCX loaded is
// one of these, UCP's registration cache only costs ucp_init its memory hooks (about 0.4 ms
// of CPU per process here, docs/performance.md#start-up), so the context is made with
// RCACHE_ENABLE=n unless the user set UCX_RCACHE_ENABLE. Any other component (ib, rdmacm,
// cuda_*, rocm_*, gdr_copy, knem, xpmem, ...) keeps UCX's default.
inline constexpr std::array<const char*, 5> kCopyOnlyComponents = {"self", "tcp", "sysv",
                                                                   "posix", "cma"};
// Whether this process's UCX loaded a component outside kCopyOnlyComponents (asked once;
// UCX's modules are loaded by then).
bool registersMemory();

// Whether `d` is applied here: this UCX is new enough and the user set none of its variables.
bool appliesNow(const UcxDefault& d);

class Context {
 public:
  // Returns the live context for `netDevices` (UCX_NET_DEVICES' syntax; "" keeps UCX's own
  // choice) and `reach`, creating it on first use (thread-safe).
  static std::shared_ptr<Context> shared(const std::string& netDevices,
                                         Reach reach = Reach::kAnyHost);

  Context(ucp_context_h handle, bool sharedMemory, bool oneHostOnly,
          std::vector<std::string> transports)
      : handle_(handle),
        sharedMemory_(sharedMemory),
        oneHostOnly_(oneHostOnly),
        transports_(std::move(transports)) {}
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
  // contextTransports() of this context, read when it was made.
  const std::vector<std::string>& transports() const { return transports_; }

 private:
  ucp_context_h handle_;
  bool sharedMemory_;
  bool oneHostOnly_;
  std::vector<std::string> transports_;
};

}  // namespace ucxb::ucx
