// Reading the user's secret for the udp transport's authenticated mode (the `secret_file`
// knob): a file of at least kMinSecretBytes bytes (any bytes; `head -c 64 /dev/urandom` makes
// one), owned by this user or root, that only its owner may read or write, as ssh demands of
// a private key. Whatever is wrong with it (missing, not a regular file, unreadable, too
// short, too long, open to the group or to others, owned by another user) is a ConfigError
// naming the knob, the path and the fix. Torch-free.
#pragma once

#include <string.h>  // explicit_bzero

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

namespace ucxb::udp {

constexpr size_t kMinSecretBytes = 32;           // 256 bits: the strength of the keys
constexpr size_t kMaxSecretBytes = size_t{1} << 16;  // a secret, not a data file

// Zeroes memory before giving it back, so that no copy of a secret outlives its holder: not
// the buffers a vector leaves behind as it grows, not one dropped by an exception.
template <typename T>
struct WipingAllocator {
  using value_type = T;
  WipingAllocator() = default;
  template <typename U>
  WipingAllocator(const WipingAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T))); }
  void deallocate(T* p, size_t n) {
    ::explicit_bzero(p, n * sizeof(T));  // not optimised away as a dead store
    ::operator delete(p, n * sizeof(T));
  }
  template <typename U>
  bool operator==(const WipingAllocator<U>&) const { return true; }
};

using SecretBytes = std::vector<uint8_t, WipingAllocator<uint8_t>>;

SecretBytes readSecretFile(const std::string& path);

}  // namespace ucxb::udp
