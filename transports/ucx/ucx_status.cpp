#include "transports/ucx/ucx_status.h"

namespace ucxb::ucx {

std::string describe(ucs_status_t status, const std::string& what) {
  return what + ": " + ucs_status_string(status) + " (UCX status " + std::to_string(status) + ")";
}

}  // namespace ucxb::ucx
