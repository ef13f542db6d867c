// A receive that folds the message into its destination as UCX hands over each piece, through a
// UCP generic datatype whose unpack reduces instead of copying (Transport::recvFolded).
//
// Over TCP UCX receives every byte into its own buffers and copies it out to the receive's
// buffer; a receive into a bounce buffer followed by a reduction then writes each byte once
// more and reads it back. Folding in unpack reads it once, from UCX's buffer while it is still
// in cache. Torch-free.
#pragma once

#include <ucp/api/ucp.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>

#include "transports/transport.h"

namespace ucxb::ucx {

// What one folding receive needs while UCX delivers it: where to fold, how, and the bytes of
// the elements that two pieces share (UCX cuts a message at byte offsets of its own choosing,
// e.g. its TCP segment less a header).
class FoldTarget {
 public:
  static constexpr size_t kMaxElementSize = 16;  // complex128

  FoldTarget(void* dst, size_t bytes, size_t elementSize, Transport::Fold fold);
  size_t bytes() const { return bytes_; }
  // Folds the piece of the message that starts at byte `offset`; false if it does not fit in
  // the posted size.
  bool unpack(size_t offset, const void* src, size_t length);

 private:
  struct Partial {
    std::array<uint8_t, kMaxElementSize> bytes{};
    size_t filled = 0;
  };
  // Adds `length` bytes at byte `at` of element `element`; folds the element once whole.
  void stage(size_t element, size_t at, const uint8_t* src, size_t length);

  uint8_t* dst_;
  size_t bytes_;
  size_t elementSize_;
  Transport::Fold fold_;
  std::map<size_t, Partial> partial_;  // by element index: elements split between pieces
};

// The generic datatype of folding receives: ucp_tag_recv_nbx gets a FoldTarget* as its buffer
// and a count of 1. Made once per process (generic datatypes belong to no context).
ucp_datatype_t foldDatatype();

}  // namespace ucxb::ucx
