#include "csrc/collectives/op_memory.h"

#include <cstring>
#include <stdexcept>

namespace ucxb {

// Only a memory the transport cannot carry stages through the host, and it overrides these.
uint8_t* OpMemory::hostBuffer(size_t, std::shared_ptr<void>&) {
  throw std::logic_error("OpMemory: this memory needs no host staging");
}
void OpMemory::toHost(void*, const void*, size_t) {
  throw std::logic_error("OpMemory: this memory needs no host staging");
}
void OpMemory::fromHost(void*, const void*, size_t) {
  throw std::logic_error("OpMemory: this memory needs no host staging");
}

void HostMemory::copy(void* dst, const void* src, size_t bytes) {
  // memmove: all_to_all copies a rank's own block, which may overlap its output.
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

void HostMemory::reduce(const Reduction& red, void* acc, const void* in, size_t count) {
  if (count > 0) red.fn(acc, in, count);
}

}  // namespace ucxb
