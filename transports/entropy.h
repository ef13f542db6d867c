// Random bytes for names, cookies and salts made at a group's creation. Torch-free, UCX-free.
//
// Why not std::random_device: libstdc++ constructs one by asking the CPU (cpuid) whether it
// has rdrand/rdseed, and under a hypervisor each cpuid traps to it: 15-20 us of CPU per
// construction on this project's KVM guest, against under 1 us for getrandom(2), and a ucx
// group's creation made four (docs/performance.md, "The creation's entropy and /proc reads").
#pragma once

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>

namespace ucxb {

// Fills `out` with `bytes` random bytes from the kernel (getrandom, which blocks only before
// the kernel's pool is first seeded, at boot), or from std::random_device where the kernel
// has no getrandom (before Linux 3.17) or it fails.
inline void fillRandom(void* out, size_t bytes) {
  auto* p = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::getrandom(p + done, bytes - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  if (done == bytes) return;
  std::random_device entropy;
  for (; done < bytes;) {
    const uint32_t word = entropy();
    const size_t n = std::min(sizeof word, bytes - done);
    std::memcpy(p + done, &word, n);
    done += n;
  }
}

inline uint64_t randomWord() {
  uint64_t word = 0;
  fillRandom(&word, sizeof word);
  return word;
}

}  // namespace ucxb
