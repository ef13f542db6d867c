// A POSIX shared-memory object mapped into this process, and the test of whether two processes
// can share one at all. Torch-free and UCX-free.
//
// The creator names the object and peers open it by that name. The creator removes the name
// (unlink) as soon as every peer holds a mapping, so that a process that dies later leaves
// nothing behind in /dev/shm; the memory itself goes when the last mapping does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ucxb::shm {

class SharedSegment {
 public:
  SharedSegment() = default;
  // Creates `name` ("/..." as shm_open wants) with `bytes` of zeroed memory, reserved up
  // front. Throws TransportError naming the call and errno.
  static SharedSegment create(const std::string& name, size_t bytes);
  // Maps an existing object; throws TransportError if it is missing or smaller than `bytes`.
  static SharedSegment open(const std::string& name, size_t bytes);

  ~SharedSegment();
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // Removes the name (creator only; idempotent). Mappings stay valid.
  void unlink();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool valid() const { return data_ != nullptr; }

 private:
  SharedSegment(std::string name, uint8_t* data, size_t size, bool owner)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner) {}
  void release() noexcept;

  std::string name_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;  // created it and has not unlinked the name yet
};

// Equal for two processes only when they run under the same kernel boot, in the same mount
// namespace (so they see the same /dev/shm) and in the same network namespace (so ranks a
// user placed on separate "hosts" with network namespaces or containers stay apart, and
// their traffic keeps crossing the network as it would between machines).
std::string hostIdentity();

}  // namespace ucxb::shm
