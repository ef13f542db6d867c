#include "transports/shm/shared_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <utility>
#include <vector>

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

SharedSegment SharedSegment::create(const std::string& name, size_t bytes,
                                    size_t reservedBytes, size_t segmentsAlike) {
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) fail("shm_open(create) " + name, errno);
  // Until the segment is returned, a failure removes the name and closes the descriptor;
  // the segment keeps the descriptor for reserve().
  struct Undo {
    const std::string& name;
    int fd;
    bool armed = true;
    ~Undo() {
      if (!armed) return;
      shm_unlink(name.c_str());
      ::close(fd);
    }
  } undo{name, fd};
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    fail("ftruncate of shared memory " + name + " to " + std::to_string(bytes) + " bytes", errno);
  }
  // A full /dev/shm (64 MB in a default Docker container) fails here, as it did when every
  // page was reserved at creation, so that a group then goes without shared memory instead
  // of failing an op later. tmpfs mounted without a size limit reports no blocks at all.
  struct statvfs fs {};
  if (fstatvfs(fd, &fs) != 0) fail("fstatvfs of shared memory " + name, errno);
  const uint64_t freeBytes = uint64_t{fs.f_bavail} * fs.f_frsize;
  const uint64_t needed = uint64_t{bytes} * std::max<size_t>(segmentsAlike, 1);
  if (fs.f_blocks != 0 && freeBytes < needed) {
    throw TransportError("shared memory " + name + ": /dev/shm has " +
                         std::to_string(freeBytes) + " bytes free, the segment needs " +
                         std::to_string(bytes) + " (" + std::to_string(needed) + " for " +
                         std::to_string(segmentsAlike) + " segments of its group)");
  }
  SharedSegment segment(name, mapShared(fd, bytes, name), bytes, true, fd);
  undo.armed = false;  // the segment owns the name and the descriptor now
  segment.reserve(0, std::min(bytes, reservedBytes));
  return segment;
}

void SharedSegment::reserve(size_t offset, size_t length) {
  if (fd_ < 0) throw TransportError("shared memory " + name_ + ": reserve() on a peer's mapping");
  if (length == 0) return;
  // Reserving the pages (posix_fallocate zeroes them) makes a full /dev/shm an ENOSPC here
  // instead of a SIGBUS on the first write.
  if (const int err = posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(length));
      err != 0) {
    fail("posix_fallocate of shared memory " + name_ + " (" + std::to_string(length) +
             " bytes at offset " + std::to_string(offset) + "; is /dev/shm full?)",
         err);
  }
}

SharedSegment SharedSegment::open(const std::string& name, size_t bytes) {
  auto segment = openIfPresent(name, bytes);
  if (!segment) fail("shm_open " + name, ENOENT);
  return std::move(*segment);
}

std::optional<SharedSegment> SharedSegment::openIfPresent(const std::string& name,
                                                          size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0 && errno == ENOENT) return std::nullopt;
  if (fd < 0) fail("shm_open " + name, errno);
  FdCloser closer{fd};
  struct stat st {};
  if (fstat(fd, &st) != 0) fail("fstat of shared memory " + name, errno);
  if (static_cast<size_t>(st.st_size) < bytes) {
    throw TransportError("shared memory " + name + " has " + std::to_string(st.st_size) +
                         " bytes, expected " + std::to_string(bytes));
  }
  return SharedSegment(name, mapShared(fd, bytes, name), bytes, false, -1);
}

SharedSegment::~SharedSegment() { release(); }

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owner_(std::exchange(other.owner_, false)),
      fd_(std::exchange(other.fd_, -1)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_ = std::exchange(other.owner_, false);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void SharedSegment::unlink() {
  if (owner_) {
    shm_unlink(name_.c_str());  // ENOENT only if someone else removed it: nothing to do
    owner_ = false;
  }
}

void SharedSegment::removeName() {
  if (!name_.empty()) shm_unlink(name_.c_str());  // ENOENT: already gone, nothing to do
  owner_ = false;
}

void SharedSegment::release() noexcept {
  unlink();
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  data_ = nullptr;
  size_ = 0;
}

namespace {

// Read once per process: the boot id cannot change while a process runs, and a group's
// creation asks for it about five times (host identity, liveness cards, the transport's
// guess), each an ifstream of /proc that cost 6-20 us (docs/performance.md, "The creation's
// entropy and /proc reads"). A forked child inherits the answer, which is still true for it.
const std::string& bootId() {
  static const std::string boot = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(in, id);
    return id;
  }();
  return boot;
}

}  // namespace

std::string hostIdentity() {
  const std::string& boot = bootId();
  return (boot.empty() ? "?" : boot) + "/mnt:" + namespaceOf("mnt") + "/net:" + namespaceOf("net");
}

bool hostIdentityIsUnique() { return !bootId().empty(); }

namespace {

// Reads field 3 (state) and field 22 (start time) of /proc/<pid>/stat: 0, or the errno
// (ENOENT when there is no such process).
int readProcStat(long pid, uint64_t& startTime, char& state) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  FdCloser closer{fd};
  char buf[1024];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  if (n <= 0) return n < 0 ? errno : EIO;
  buf[n] = '\0';
  // "pid (comm) state ppid ...": comm may hold spaces and ')', so fields start after the last
  // ')'. Split in place (no istringstream: the orphan sweep reads one such file per segment
  // in /dev/shm, every other rank's of the group being created included).
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return EIO;
  ++p;
  for (int i = 3; i <= 22; ++i) {
    while (*p == ' ') ++p;
    if (*p == '\0' || *p == '\n') return EIO;
    const char* fieldEnd = p;
    while (*fieldEnd != ' ' && *fieldEnd != '\0' && *fieldEnd != '\n') ++fieldEnd;
    if (i == 3) state = *p;
    if (i == 22) {
      char* end = nullptr;
      startTime = std::strtoull(p, &end, 10);
      return end == fieldEnd && end != p ? 0 : EIO;
    }
    p = fieldEnd;
  }
  return EIO;
}

uint64_t pidNamespaceInode() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

// A run of decimal digits at `s[pos]`, up to `stop` (which must follow); advances pos past it.
bool takeNumber(const std::string& s, size_t& pos, char stop, uint64_t& value) {
  const size_t begin = pos;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') ++pos;
  if (pos == begin || pos - begin > 20) return false;
  errno = 0;
  value = std::strtoull(s.c_str() + begin, nullptr, 10);
  if (errno != 0) return false;
  if (stop == '\0') return pos == s.size();
  if (pos >= s.size() || s[pos] != stop) return false;
  ++pos;
  return true;
}

constexpr char kSegmentPrefix[] = "ucxb-";

}  // namespace

SegmentOwner currentOwner() {
  // Asked three or four times per creation (segment names, the liveness card): kept per
  // thread for the process that asked, so that a forked child (another pid) asks again. Per
  // thread, not behind a lock, which a fork while another thread held it would leave locked.
  thread_local SegmentOwner cached;
  const long pid = static_cast<long>(getpid());
  if (cached.pid == pid) return cached;
  SegmentOwner me;
  me.pid = pid;
  char state = '?';
  if (readProcStat(me.pid, me.startTime, state) != 0) me.startTime = 0;
  me.pidNamespace = pidNamespaceInode();
  cached = me;
  return me;
}

std::string segmentName(const SegmentOwner& owner, uint64_t nonce, int rank) {
  return "/" + std::string(kSegmentPrefix) + std::to_string(owner.pid) + "-" +
         std::to_string(owner.startTime) + "-" + std::to_string(owner.pidNamespace) + "-" +
         std::to_string(nonce) + "-r" + std::to_string(rank);
}

bool parseSegmentName(const std::string& name, SegmentOwner& owner) {
  size_t pos = name.empty() || name[0] != '/' ? 0 : 1;
  if (name.compare(pos, sizeof(kSegmentPrefix) - 1, kSegmentPrefix) != 0) return false;
  pos += sizeof(kSegmentPrefix) - 1;
  uint64_t pid = 0, start = 0, ns = 0, nonce = 0, rank = 0;
  if (!takeNumber(name, pos, '-', pid) || !takeNumber(name, pos, '-', start) ||
      !takeNumber(name, pos, '-', ns) || !takeNumber(name, pos, '-', nonce)) {
    return false;
  }
  if (pos >= name.size() || name[pos] != 'r') return false;
  ++pos;
  if (!takeNumber(name, pos, '\0', rank)) return false;
  if (pid == 0 || pid > 0x7fffffff) return false;
  owner = SegmentOwner{static_cast<long>(pid), start, ns};
  return true;
}

namespace {

Liveness ownerLivenessIn(const SegmentOwner& owner, uint64_t ns) {
  if (ns == 0 || owner.pidNamespace != ns || owner.pid <= 0) return Liveness::kUnknown;
  uint64_t start = 0;
  char state = '?';
  const int err = readProcStat(owner.pid, start, state);
  if (err == ENOENT || err == ESRCH) return Liveness::kDead;  // no such process here
  if (err != 0) return Liveness::kUnknown;  // e.g. /proc mounted with hidepid
  if (owner.startTime == 0) return Liveness::kUnknown;  // it could not record its start time
  if (start != owner.startTime) return Liveness::kDead;  // the pid now names another process
  // A zombie has released its mappings and will never unlink anything again.
  return state == 'Z' || state == 'X' ? Liveness::kDead : Liveness::kAlive;
}

}  // namespace

Liveness ownerLiveness(const SegmentOwner& owner) {
  return ownerLivenessIn(owner, pidNamespaceInode());
}

size_t removeOrphanedSegments(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  std::vector<std::string> dead;
  // While a group is being created, /dev/shm holds its other ranks' segments (an inbox and a
  // staging segment each): every sweep of the creation meets them, so what a live segment
  // costs is what the sweep costs. Each owner's liveness is read from /proc once per sweep,
  // not once per segment, and only a dead owner's segment is stat'ed (the checks that keep
  // the sweep off another user's files and off anything but a regular file).
  const uint64_t ns = pidNamespaceInode();
  std::vector<std::pair<SegmentOwner, Liveness>> seen;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    SegmentOwner owner;
    if (!parseSegmentName(name, owner)) continue;
    auto known = std::find_if(seen.begin(), seen.end(),
                              [&owner](const auto& s) { return s.first == owner; });
    if (known == seen.end()) {
      known = seen.insert(seen.end(), {owner, ownerLivenessIn(owner, ns)});
    }
    if (known->second != Liveness::kDead) continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;  // never another user's
    dead.push_back(name);
  }
  ::closedir(d);
  size_t removed = 0;
  for (const auto& name : dead) {
    // The owner is dead, so nobody can create this name again: no race with a new segment.
    if (::unlink((dir + "/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace ucxb::shm
