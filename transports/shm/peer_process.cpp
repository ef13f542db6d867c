#include "transports/shm/peer_process.h"

#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "transports/shm/shared_segment.h"
#include "transports/transport.h"

namespace ucxb::shm {

const uint64_t kReadableProbe = 0x7563786270726f62ULL;  // "ucxbprob"

namespace {

constexpr char kAddressMagic[] = "ucxb-shm-2";

// PIDFS_MAGIC (linux/magic.h): the file system pidfds live in since Linux 6.9.
constexpr decltype(statfs::f_type) kPidfsMagic = 0x50494446;

}  // namespace

int pidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

uint64_t ownPidfdInode() {
  const int fd = pidfdOpen(::getpid());
  if (fd < 0) return 0;
  struct statfs fs {};
  struct stat st {};
  const bool pidfs = ::fstatfs(fd, &fs) == 0 && fs.f_type == kPidfsMagic && ::fstat(fd, &st) == 0;
  ::close(fd);
  return pidfs ? static_cast<uint64_t>(st.st_ino) : 0;
}

std::vector<uint8_t> packAddress(const ShmAddress& a) {
  std::ostringstream out;
  out << kAddressMagic << '\n'
      << a.host << '\n'
      << a.pidNamespace << '\n'
      << a.pid << '\n'
      << a.ranks << '\n'
      << a.segment << '\n'
      << a.doorbell << '\n'
      << a.probe << '\n'
      << a.pidfdInode;
  const std::string text = out.str();
  return {text.begin(), text.end()};
}

bool unpackAddress(const std::vector<uint8_t>& bytes, ShmAddress& a) {
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::string magic, pidNs, pid, ranks, probe, pidfdInode;
  if (!std::getline(in, magic) || magic != kAddressMagic) return false;
  if (!std::getline(in, a.host) || !std::getline(in, pidNs) || !std::getline(in, pid) ||
      !std::getline(in, ranks) || !std::getline(in, a.segment) || !std::getline(in, a.doorbell) ||
      !std::getline(in, probe) || !std::getline(in, pidfdInode)) {
    return false;
  }
  try {
    a.pidNamespace = std::stoull(pidNs);
    a.pid = static_cast<pid_t>(std::stol(pid));
    a.ranks = std::stoi(ranks);
    a.probe = std::stoull(probe);
    a.pidfdInode = std::stoull(pidfdInode);
  } catch (const std::exception&) {
    return false;
  }
  return a.pid > 0 && !a.segment.empty() && !a.doorbell.empty();
}

// Whether the process `pidfd` refers to is the one that wrote the address `a`; "" if so, else
// why not. The pid alone cannot say: the writer may have exited after it published the
// address and before this rank opened the pidfd, and its pid gone to another process, whose
// pidfd would never report the writer's death (the group would wait out the op's timeout
// instead of failing at once). Where the writer published its pidfds' inode (pidfs), one
// fstat() of this pidfd compares them, with no race: it names the process the pidfd holds.
// Elsewhere the start time its inbox's name records (SegmentOwner) against /proc/<pid>/stat,
// read after pidfd_open: the same start time means the writer still held the pid then, so it
// did when the pidfd was opened (a later process with that pid would have had to start in
// the clock tick in which the writer started, made its inbox and exited). "" too where that
// cannot be told (/proc unreadable, no start time recorded), as before pidfds were checked.
// Throws TransportError naming `peer` where fstat fails.
std::string wroteAddress(int pidfd, const ShmAddress& a, int peer) {
  const std::string other = "pid " + std::to_string(a.pid) + " names another process now";
  if (a.pidfdInode != 0) {
    struct stat st {};
    if (::fstat(pidfd, &st) != 0) {
      throw TransportError("fstat of the pidfd of " + peerLabel(peer) + ": " + std::strerror(errno),
                           peer);
    }
    return static_cast<uint64_t>(st.st_ino) == a.pidfdInode ? "" : other;
  }
  SegmentOwner owner;
  if (!parseSegmentName(a.segment, owner)) return "";
  owner.pid = a.pid;  // the pid the pidfd was opened for (the name's, in any address written)
  return ownerLiveness(owner) == Liveness::kDead ? other : "";
}

// Copies `length` bytes at `remote` in process `pid` into `local`; "" or why not.
std::string readPeerMemory(pid_t pid, uint64_t remote, void* local, size_t length) {
  size_t done = 0;
  while (done < length) {
    iovec to{static_cast<uint8_t*>(local) + done, length - done};
    iovec from{reinterpret_cast<void*>(remote + done), length - done};
    const ssize_t n = ::process_vm_readv(pid, &to, 1, &from, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return std::string("process_vm_readv: ") + (n < 0 ? std::strerror(errno) : "no progress");
    }
    done += static_cast<size_t>(n);
  }
  return {};
}

}  // namespace ucxb::shm
