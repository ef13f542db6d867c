// Whether a UCX_TLS value leaves UCX's shared-memory transports in, and whether a context
// opened sysv. Apart from ucx_context.cpp (which asks them once per context) so that a unit
// test can run them without UCX.
#pragma once

#include <string>
#include <vector>

namespace ucxb::ucx {

// False for a list that names none of UCX's shared-memory (mm) transports ("tcp", "cma,tcp")
// or an exclusion that names one ("^sm", "^posix"): the user asked for same-host bytes to
// travel another way, so the backend does not stage them through shared memory of its own
// either. True for "" (UCX's default), "all", and lists such as "sm,tcp" or "^ib".
bool tlsIncludesSharedMemory(const std::string& tls);

// Whether a one-host context (Reach::kOneHost, ucx_context.h) that opened `transports` (UCX's
// names, Context::transports()) must be made again with posix: it has no sysv, the one
// shared-memory transport kOneHostTls leaves in. An empty list (UCX's account of them could
// not be read) keeps the context.
bool lacksSysv(const std::vector<std::string>& transports);

}  // namespace ucxb::ucx
