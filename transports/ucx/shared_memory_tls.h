// Whether a UCX_TLS value leaves UCX's shared-memory transports in. Apart from ucx_context.cpp
// (which asks it once per context) so that a unit test can run it without UCX.
#pragma once

#include <string>

namespace ucxb::ucx {

// False for a list that names none of UCX's shared-memory (mm) transports ("tcp", "cma,tcp")
// or an exclusion that names one ("^sm", "^posix"): the user asked for same-host bytes to
// travel another way, so the backend does not stage them through shared memory of its own
// either. True for "" (UCX's default), "all", and lists such as "sm,tcp" or "^ib".
bool tlsIncludesSharedMemory(const std::string& tls);

}  // namespace ucxb::ucx
