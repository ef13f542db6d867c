#include "transports/shm/byte_ring.h"

#include <algorithm>
#include <cstring>

namespace ucxb::shm {

namespace {

// Copies between the ring and a flat buffer in at most two pieces (the second after the wrap).
void copyOut(const uint8_t* ring, size_t capacity, uint64_t pos, uint8_t* out, size_t length) {
  const size_t at = pos & (capacity - 1);
  const size_t first = std::min(length, capacity - at);
  std::memcpy(out, ring + at, first);
  if (length > first) std::memcpy(out + first, ring, length - first);
}

void copyIn(uint8_t* ring, size_t capacity, uint64_t pos, const uint8_t* in, size_t length) {
  const size_t at = pos & (capacity - 1);
  const size_t first = std::min(length, capacity - at);
  std::memcpy(ring + at, in, first);
  if (length > first) std::memcpy(ring, in + first, length - first);
}

}  // namespace

size_t ByteRing::writable() const {
  const uint64_t tail = control_->tail.load(std::memory_order_relaxed);  // ours alone
  const uint64_t head = control_->head.load(std::memory_order_seq_cst);
  return capacity_ - static_cast<size_t>(tail - head);
}

size_t ByteRing::write(const void* data, size_t length) {
  const size_t n = std::min(length, writable());
  if (n == 0) return 0;
  const uint64_t tail = control_->tail.load(std::memory_order_relaxed);
  copyIn(bytes_, capacity_, tail, static_cast<const uint8_t*>(data), n);
  control_->tail.store(tail + n, std::memory_order_seq_cst);
  return n;
}

size_t ByteRing::readable() const {
  return static_cast<size_t>(control_->tail.load(std::memory_order_seq_cst) - readPos_);
}

void ByteRing::peek(void* out, size_t length) const {
  copyOut(bytes_, capacity_, readPos_, static_cast<uint8_t*>(out), length);
}

void ByteRing::take(void* out, size_t length) {
  if (out != nullptr) copyOut(bytes_, capacity_, readPos_, static_cast<uint8_t*>(out), length);
  readPos_ += length;
}

bool ByteRing::release() {
  if (readPos_ == released_) return false;
  control_->head.store(readPos_, std::memory_order_seq_cst);
  released_ = readPos_;
  return true;
}

}  // namespace ucxb::shm
