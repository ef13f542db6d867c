// The one place that turns a ucs_status_t into an error message or a TransportError.
#pragma once

#include <ucs/type/status.h>

#include <string>

#include "transports/transport.h"

namespace ucxb::ucx {

std::string describe(ucs_status_t status, const std::string& what);

// Throws TransportError("<what>: <UCX message> (<status>)") unless status is UCS_OK.
inline void check(ucs_status_t status, const std::string& what, int peer = -1) {
  if (status != UCS_OK) {
    throw TransportError(describe(status, what), peer);
  }
}

}  // namespace ucxb::ucx
