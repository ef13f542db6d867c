#include "transports/ucx/endpoint_close.h"

#include <algorithm>

namespace ucxb::ucx {
namespace {

bool closed(void* request) { return ucp_request_check_status(request) != UCS_INPROGRESS; }

}  // namespace

void startClose(ucp_ep_h& ep, bool force, std::vector<void*>& closing) {
  if (ep == nullptr) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  const ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
  ep = nullptr;
  if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
}

void finishCloses(ucp_worker_h worker, std::vector<void*>& closing,
                  std::chrono::milliseconds limit) {
  progressUntil(
      worker, [&closing] { return std::all_of(closing.begin(), closing.end(), closed); }, limit);
  for (void* r : closing) ucp_request_free(r);
  closing.clear();
}

void forceClose(ucp_worker_h worker, ucp_ep_h& ep) {
  std::vector<void*> closing;
  startClose(ep, /*force=*/true, closing);
  finishCloses(worker, closing, std::chrono::milliseconds(1000));
}

}  // namespace ucxb::ucx
