#include "transports/fold_target.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace ucxb {

FoldTarget::FoldTarget(void* dst, size_t bytes, size_t elementSize, Transport::Fold fold)
    : dst_(static_cast<uint8_t*>(dst)),
      bytes_(bytes),
      elementSize_(elementSize),
      alignment_(elementSize & (~elementSize + 1)),
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
  // Whole elements from UCX's buffer.
  if (const size_t whole = length / esz; whole > 0) {
    foldWhole(dst_ + offset, in, whole);
    offset += whole * esz;
    in += whole * esz;
    length -= whole * esz;
  }
  // The head of an element the next piece ends.
  if (length > 0) stage(offset / esz, 0, in, length);
  return true;
}

void FoldTarget::foldWhole(uint8_t* dst, const uint8_t* src, size_t elements) {
  if (reinterpret_cast<uintptr_t>(src) % alignment_ == 0) {
    fold_(dst, src, elements);
    return;
  }
  // A page at a time: the copy is still in L1 when the kernel reads it.
  alignas(64) std::array<uint8_t, 4096> aligned;
  const size_t perCopy = aligned.size() / elementSize_;
  while (elements > 0) {
    const size_t n = std::min(perCopy, elements);
    std::memcpy(aligned.data(), src, n * elementSize_);
    fold_(dst, aligned.data(), n);
    dst += n * elementSize_;
    src += n * elementSize_;
    elements -= n;
  }
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

}  // namespace ucxb
