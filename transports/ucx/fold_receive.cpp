#include "transports/ucx/fold_receive.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include "transports/ucx/ucx_status.h"

namespace ucxb::ucx {

FoldTarget::FoldTarget(void* dst, size_t bytes, size_t elementSize, Transport::Fold fold)
    : dst_(static_cast<uint8_t*>(dst)),
      bytes_(bytes),
      elementSize_(elementSize),
      fold_(std::move(fold)) {
  if (elementSize == 0 || elementSize > kMaxElementSize || bytes % elementSize != 0) {
    throw TransportError("folding receive: element size " + std::to_string(elementSize) +
                         " does not divide " + std::to_string(bytes) + " bytes or exceeds " +
                         std::to_string(kMaxElementSize));
  }
}

bool FoldTarget::unpack(size_t offset, const void* src, size_t length) {
  if (offset > bytes_ || length > bytes_ - offset) return false;
  const auto* in = static_cast<const uint8_t*>(src);
  const size_t esz = elementSize_;
  // The tail of an element the previous piece began.
  if (const size_t head = offset % esz; head != 0 && length > 0) {
    const size_t take = std::min(esz - head, length);
    stage(offset / esz, head, in, take);
    offset += take;
    in += take;
    length -= take;
  }
  // Whole elements straight from UCX's buffer.
  if (const size_t whole = length / esz; whole > 0) {
    fold_(dst_ + offset, in, whole);
    offset += whole * esz;
    in += whole * esz;
    length -= whole * esz;
  }
  // The head of an element the next piece ends.
  if (length > 0) stage(offset / esz, 0, in, length);
  return true;
}

void FoldTarget::stage(size_t element, size_t at, const uint8_t* src, size_t length) {
  Partial& p = partial_[element];
  std::memcpy(p.bytes.data() + at, src, length);
  p.filled += length;
  if (p.filled == elementSize_) {
    fold_(dst_ + element * elementSize_, p.bytes.data(), 1);
    partial_.erase(element);
  }
}

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
