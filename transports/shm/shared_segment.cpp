#include "transports/shm/shared_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "transports/transport.h"

namespace ucxb::shm {

namespace {

[[noreturn]] void fail(const std::string& what, int err) {
  throw TransportError(what + ": " + std::strerror(err));
}

uint8_t* mapShared(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("mmap of shared memory " + name, errno);
  return static_cast<uint8_t*>(p);
}

// Closes the descriptor once the mapping exists (the mapping keeps the object alive).
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

std::string namespaceOf(const char* kind) {
  struct stat st {};
  const std::string path = std::string("/proc/self/ns/") + kind;
  if (::stat(path.c_str(), &st) != 0) return "?";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

}  // namespace

SharedSegment SharedSegment::create(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) fail("shm_open(create) " + name, errno);
  FdCloser closer{fd};
  // Reserve the pages now: a full /dev/shm (64 MB in a default Docker container) then fails
  // here with ENOSPC instead of killing the process with SIGBUS on its first write.
  if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    shm_unlink(name.c_str());
    fail("posix_fallocate of shared memory " + name + " (" + std::to_string(bytes) + " bytes)",
         err);
  }
  try {
    return SharedSegment(name, mapShared(fd, bytes, name), bytes, true);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
}

SharedSegment SharedSegment::open(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) fail("shm_open " + name, errno);
  FdCloser closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) fail("fstat of shared memory " + name, errno);
  if (static_cast<size_t>(st.st_size) < bytes) {
    throw TransportError("shared memory " + name + " has " + std::to_string(st.st_size) +
                         " bytes, expected " + std::to_string(bytes));
  }
  return SharedSegment(name, mapShared(fd, bytes, name), bytes, false);
}

SharedSegment::~SharedSegment() { release(); }

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owner_(std::exchange(other.owner_, false)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

void SharedSegment::unlink() {
  if (owner_) {
    shm_unlink(name_.c_str());  // ENOENT only if someone else removed it: nothing to do
    owner_ = false;
  }
}

void SharedSegment::release() noexcept {
  unlink();
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

std::string hostIdentity() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  return (boot.empty() ? "?" : boot) + "/mnt:" + namespaceOf("mnt") + "/net:" + namespaceOf("net");
}

}  // namespace ucxb::shm
