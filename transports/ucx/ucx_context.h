// A UCP context shared by every group's worker that asks for the same devices. Creating a
// context reads the UCX_* environment and loads transport modules, which costs milliseconds;
// workers are cheap. The devices a group picked (UCXBACKEND_IFNAME) are set on its context's
// configuration, never in the process environment, so a later group can pick others.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
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
// Whether `d` is applied here: this UCX is new enough and the user set none of its variables.
bool appliesNow(const UcxDefault& d);

class Context {
 public:
  // Returns the live context for `netDevices` (UCX_NET_DEVICES' syntax; "" keeps UCX's own
  // choice), creating it on first use (thread-safe).
  static std::shared_ptr<Context> shared(const std::string& netDevices);

  Context(ucp_context_h handle, bool sharedMemory) : handle_(handle), sharedMemory_(sharedMemory) {}
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context_h handle() const { return handle_; }
  // Whether the UCX_TLS this context was created with leaves UCX's shared-memory transports
  // in (shared_memory_tls.h): read with the rest of UCX's configuration, so the answer is
  // the one UCX itself acts on.
  bool sharedMemory() const { return sharedMemory_; }

 private:
  ucp_context_h handle_;
  bool sharedMemory_;
};

}  // namespace ucxb::ucx
