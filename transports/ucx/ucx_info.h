// What the UCX library in this process is and what it can reach: for `ucxbackend info`.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <utility>
#include <vector>

namespace ucxb::ucx {

std::string libraryVersion();
// Path of the libucp shared object actually loaded (resolved with dladdr).
std::string libraryPath();
// (transport, device) pairs of every memory domain UCX can open, e.g. ("tcp", "lo").
std::vector<std::pair<std::string, std::string>> transports();
// The transport names of `context`'s resources, each once, in UCX's order (e.g. "self",
// "tcp", "sysv"): what its workers may use. Read from ucp_context_print_info, UCX's only
// public account of them; empty if that cannot be read.
std::vector<std::string> contextTransports(ucp_context_h context);

}  // namespace ucxb::ucx
