// A POSIX shared-memory object mapped into this process, and the test of whether two processes
// can share one at all. Torch-free and UCX-free.
//
// The creator names the object and peers open it by that name. The name is removed as soon as
// every peer holds a mapping, so that a process that dies later leaves nothing behind in
// /dev/shm; the memory itself goes when the last mapping does. A segment whose creator died
// before that is recognised by its name, which records the creator (SegmentOwner), and
// removed by a later process once the creator is provably dead (removeOrphanedSegments).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace ucxb::shm {

class SharedSegment {
 public:
  SharedSegment() = default;
  // Creates `name` ("/..." as shm_open wants) with `bytes` of zeroed memory, of which the
  // first `reservedBytes` are reserved now and the rest by reserve() before they are written:
  // reserving zeroes every page, a cost a group that never writes its slots need not pay.
  // Throws TransportError naming the call and errno, also when /dev/shm has no room now for
  // `bytes` times `segmentsAlike` (the segments of the same size that the other ranks of a
  // group on this host make at the same time, none of them reserved yet: each rank checks
  // for all, so that a /dev/shm too small for the group is found at creation, as when every
  // segment was reserved whole, and not by an op's first write).
  static SharedSegment create(const std::string& name, size_t bytes,
                              size_t reservedBytes = SIZE_MAX, size_t segmentsAlike = 1);
  // Maps an existing object; throws TransportError if it is missing or smaller than `bytes`.
  static SharedSegment open(const std::string& name, size_t bytes);
  // open(), but nullopt where no object has the name (ENOENT): its creator removed it.
  static std::optional<SharedSegment> openIfPresent(const std::string& name, size_t bytes);

  ~SharedSegment();
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  // Reserves [offset, offset + length) of a created segment (its creator only; from any
  // thread that the caller keeps to one at a time). A write into memory that was never
  // reserved kills the process with SIGBUS when /dev/shm is full; after this it cannot.
  // Throws TransportError (ENOSPC: /dev/shm is full) naming the segment and the range.
  void reserve(size_t offset, size_t length);

  // Removes the name (creator only; idempotent). Mappings stay valid.
  void unlink();
  // Removes the name whoever created it: the last peer to map a segment does, so that the
  // name lives no longer than the handoff (csrc/staging_setup.cpp). Mappings stay valid; a
  // name already gone is no error.
  void removeName();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool valid() const { return data_ != nullptr; }

 private:
  SharedSegment(std::string name, uint8_t* data, size_t size, bool owner, int fd)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner), fd_(fd) {}
  void release() noexcept;

  std::string name_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owner_ = false;  // created it and has not unlinked the name yet
  int fd_ = -1;         // the creator's descriptor, for reserve(); -1 in a peer's mapping
};

// Equal for two processes only when they run under the same kernel boot, in the same mount
// namespace (so they see the same /dev/shm) and in the same network namespace (so ranks a
// user placed on separate "hosts" with network namespaces or containers stay apart, and
// their traffic keeps crossing the network as it would between machines).
std::string hostIdentity();
// False when the boot id could not be read: the identity then holds namespace numbers alone,
// which two machines in their initial namespaces can share, so it must not decide that two
// ranks share a host where a wrong "yes" leaves them unreachable (a ucx worker without TCP).
bool hostIdentityIsUnique();

// Who created a segment, as its name records it: enough to tell, from any process of the same
// user on the host, whether that creator is still alive.
struct SegmentOwner {
  long pid = 0;
  uint64_t startTime = 0;     // field 22 of /proc/<pid>/stat: survives pid reuse
  uint64_t pidNamespace = 0;  // inode of /proc/self/ns/pid: pids mean something only in it
  bool operator==(const SegmentOwner&) const = default;
};

// This process, as a segment's owner (zeros where /proc cannot say).
SegmentOwner currentOwner();

// "/ucxb-<pid>-<start time>-<pid namespace>-<nonce>-r<rank>" for `owner`: the name a group's
// staging segment gets (csrc/staging_setup.cpp).
std::string segmentName(const SegmentOwner& owner, uint64_t nonce, int rank);

// The owner named by a segment name made by segmentName() (with or without the leading '/');
// false for any other name (another program's, or an older release's without a start time).
bool parseSegmentName(const std::string& name, SegmentOwner& owner);

enum class Liveness { kAlive, kDead, kUnknown };

// kDead only when the owner provably cannot be running: it is in this process's pid namespace
// and its pid is gone, a zombie, or taken by a process that started at another time. kUnknown
// when that cannot be told (another pid namespace, /proc unreadable, no start time recorded).
Liveness ownerLiveness(const SegmentOwner& owner);

// Removes every segment in `dir` (shm_open's /dev/shm) named by segmentName() whose owner is
// provably dead (kDead) and that is a regular file of this effective user; nothing else.
// Returns how many it removed. Never throws.
size_t removeOrphanedSegments(const std::string& dir = "/dev/shm");

}  // namespace ucxb::shm
