#include "transports/ucx/fold_receive.h"

#include <exception>

#include "transports/ucx/ucx_status.h"

namespace ucxb::ucx {

namespace {

// Receives only: a folding datatype is never sent.
void* startPack(void* /*context*/, const void* /*buffer*/, size_t /*count*/) { return nullptr; }
size_t pack(void* /*state*/, size_t /*offset*/, void* /*dest*/, size_t /*max*/) { return 0; }

void* startUnpack(void* /*context*/, void* buffer, size_t /*count*/) { return buffer; }

size_t packedSize(void* state) {
  return state == nullptr ? 0 : static_cast<FoldTarget*>(state)->bytes();
}

ucs_status_t unpack(void* state, size_t offset, const void* src, size_t length) {
  try {  // no exception may cross UCX's C frames (a staged element's map node can throw)
    return static_cast<FoldTarget*>(state)->unpack(offset, src, length)
               ? UCS_OK
               : UCS_ERR_MESSAGE_TRUNCATED;
  } catch (const std::exception&) {
    return UCS_ERR_NO_MEMORY;
  }
}

void finish(void* /*state*/) {}  // the FoldTarget belongs to the request (keepAlive)

}  // namespace

ucp_datatype_t foldDatatype() {
  static const ucp_generic_dt_ops_t ops = {
      .start_pack = startPack,
      .start_unpack = startUnpack,
      .packed_size = packedSize,
      .pack = pack,
      .unpack = unpack,
      .finish = finish,
  };
  static const ucp_datatype_t datatype = [] {
    ucp_datatype_t dt = 0;
    check(ucp_dt_create_generic(&ops, nullptr, &dt), "ucp_dt_create_generic (folding receive)");
    return dt;
  }();
  return datatype;
}

}  // namespace ucxb::ucx
