// Cross-core copy probe: how fast can one process hand bytes to another through shared memory,
// second by second? Two processes (fork), four shared slots; the producer copies a piece of its
// 16 MiB buffer into a free slot and marks it full, the consumer copies it out into its own
// buffer and marks it free: the shape of the backend's staged shared-memory path without UCX,
// torch or Python. Each line is one second's throughput in GB/s, so a machine whose cores
// change speed or placement under a hypervisor shows up as a change between lines.
//
//   g++ -O2 -std=c++17 scripts/cross_core_copy.cpp -o /tmp/cross_core_copy
//   /tmp/cross_core_copy [seconds=10] [piece_bytes=1048576] [cached|streaming]
//
// `streaming` makes the producer write with non-temporal stores (x86-64 only): the bytes go
// to memory instead of staying dirty in the producer's cache for the consumer to pull across.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace {

constexpr size_t kSlots = 4;
constexpr size_t kBufferBytes = size_t{16} << 20;

struct Shared {
  std::atomic<uint64_t> full[kSlots];  // piece number + 1 while the slot holds it, else 0
  std::atomic<bool> stop;
};

void copyStreaming(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), v);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();  // the stores are visible before the slot is marked full
#else
  std::memcpy(dst, src, n);
#endif
}

// Waiting yields the core, as the backend's progress does while an op is pending.
template <typename Ready>
bool waitFor(const Shared& sh, Ready ready) {
  while (!ready()) {
    if (sh.stop.load(std::memory_order_relaxed)) return false;
    std::this_thread::yield();
  }
  return true;
}

int fail(const char* what) {
  std::perror(what);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int seconds = argc > 1 ? std::atoi(argv[1]) : 10;
  const size_t piece = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : size_t{1} << 20;
  const std::string mode = argc > 3 ? argv[3] : "cached";
  if (seconds < 1 || piece < 64 || piece > kBufferBytes || kBufferBytes % piece != 0 ||
      (mode != "cached" && mode != "streaming")) {
    std::fprintf(stderr,
                 "usage: %s [seconds>=1] [piece_bytes: 64..16777216, dividing 16 MiB] "
                 "[cached|streaming]\n",
                 argv[0]);
    return 2;
  }
  // Page-aligned shared mapping: the flags' page first, then the slots (64-byte aligned).
  const size_t header = 4096;
  void* map = mmap(nullptr, header + kSlots * piece, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return fail("mmap");
  auto* sh = new (map) Shared{};
  uint8_t* slots = static_cast<uint8_t*>(map) + header;

  const pid_t child = fork();
  if (child < 0) return fail("fork");
  const bool producer = child != 0;
  std::vector<uint8_t> buffer(kBufferBytes, producer ? 1 : 0);
  const size_t pieces = kBufferBytes / piece;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  double bytes = 0;
  int second = 1;
  for (uint64_t seq = 0;; ++seq) {
    std::atomic<uint64_t>& full = sh->full[seq % kSlots];
    uint8_t* slot = slots + (seq % kSlots) * piece;
    uint8_t* mine = buffer.data() + (seq % pieces) * piece;
    if (producer) {
      if (!waitFor(*sh, [&] { return full.load(std::memory_order_acquire) == 0; })) break;
      if (mode == "streaming") {
        copyStreaming(slot, mine, piece);
      } else {
        std::memcpy(slot, mine, piece);
      }
      full.store(seq + 1, std::memory_order_release);
      continue;
    }
    if (!waitFor(*sh, [&] { return full.load(std::memory_order_acquire) == seq + 1; })) break;
    std::memcpy(mine, slot, piece);
    full.store(0, std::memory_order_release);
    bytes += static_cast<double>(piece);
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (elapsed >= second) {
      std::printf("%d %.2f GB/s\n", second, bytes / 1e9);
      std::fflush(stdout);
      bytes = 0;
      if (++second > seconds) sh->stop.store(true);
    }
  }
  if (producer) {
    int status = 0;
    if (waitpid(child, &status, 0) < 0) return fail("waitpid");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  return 0;
}
