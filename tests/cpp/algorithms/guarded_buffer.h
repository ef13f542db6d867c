// A byte buffer between two guard zones, so a test sees an algorithm that writes outside the
// memory it was given (a wrong chunk offset, a piece too long), and a way to ask afterwards
// whether memory that must not be written still holds what it held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace ucxb::algotest {

class GuardedBuffer {
 public:
  static constexpr size_t kGuardBytes = 64;
  static constexpr uint8_t kGuard = 0xA5;

  // `fill` bytes, or `bytes` guard-valued bytes when `fill` is empty.
  GuardedBuffer(size_t bytes, const std::string& fill = {})
      : storage_(bytes + 2 * kGuardBytes, kGuard), bytes_(bytes) {
    for (size_t i = 0; i < fill.size() && i < bytes; ++i) data()[i] = static_cast<uint8_t>(fill[i]);
  }

  uint8_t* data() { return storage_.data() + kGuardBytes; }
  const uint8_t* data() const { return storage_.data() + kGuardBytes; }
  size_t size() const { return bytes_; }
  std::string contents() const { return {reinterpret_cast<const char*>(data()), bytes_}; }
  bool guardsIntact() const {
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (storage_[i] != kGuard || storage_[kGuardBytes + bytes_ + i] != kGuard) return false;
    }
    return true;
  }

 private:
  std::vector<uint8_t> storage_;
  size_t bytes_;
};

// "" when `buffer` holds `want` and its guards are intact, else what differs (first byte).
// `canonical`, when given, rewrites both sides first (e.g. withPositiveZeros).
inline std::string compare(const GuardedBuffer& buffer, std::string want, const std::string& what,
                           const std::function<std::string(std::string)>& canonical = {}) {
  if (!buffer.guardsIntact()) return what + ": written outside its bounds; ";
  std::string got = buffer.contents();
  if (canonical) {
    got = canonical(std::move(got));
    want = canonical(std::move(want));
  }
  if (got == want) return "";
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  char bytes[32];
  std::snprintf(bytes, sizeof(bytes), " (0x%02x, want 0x%02x)", static_cast<uint8_t>(got[i]),
                static_cast<uint8_t>(want[i]));
  return what + ": byte " + std::to_string(i) + " of " + std::to_string(want.size()) +
         " differs" + bytes + "; ";
}

}  // namespace ucxb::algotest
