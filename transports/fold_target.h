// What one receive that folds its message into a destination (Transport::recvFolded) needs
// while the pieces arrive: where to fold, how, and the bytes of the elements two pieces share.
// A transport cuts a message at byte offsets of its own choosing (UCX over TCP: its segment
// less a header), may hand the pieces over in any order, and from any address: the reduction
// kernels are handed only elements aligned to their size (a typed load of a misaligned one is
// undefined, and faults on strict-alignment CPUs). Torch-free, UCX-free.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>

#include "transports/transport.h"

namespace ucxb {

class FoldTarget {
 public:
  static constexpr size_t kMaxElementSize = 16;  // complex128

  // Throws TransportError unless `elementSize` (1..16) divides `bytes`.
  FoldTarget(void* dst, size_t bytes, size_t elementSize, Transport::Fold fold);
  size_t bytes() const { return bytes_; }
  // Folds the piece of the message that starts at byte `offset`; false (nothing folded) if it
  // does not fit in the posted size.
  bool unpack(size_t offset, const void* src, size_t length);

 private:
  struct Partial {
    alignas(kMaxElementSize) std::array<uint8_t, kMaxElementSize> bytes{};
    size_t filled = 0;
  };
  // Adds `length` bytes at byte `at` of element `element`; folds the element once whole.
  void stage(size_t element, size_t at, const uint8_t* src, size_t length);
  // Folds `elements` whole elements at `src` into `dst`, through an aligned copy where `src`
  // is not aligned to the element.
  void foldWhole(uint8_t* dst, const uint8_t* src, size_t elements);

  uint8_t* dst_;
  size_t bytes_;
  size_t elementSize_;
  size_t alignment_;  // what the kernel's loads need: the largest power of 2 dividing it
  Transport::Fold fold_;
  std::map<size_t, Partial> partial_;  // by element index: elements split between pieces
};

}  // namespace ucxb
