// transports/shm/shared_segment.{h,cpp} on its own: create, open, unlink, the errors, the
// host identity, segment names and their owners' liveness, and the sweep of dead owners'
// segments. Built and run by tests/test_shared_memory.py (tests/cpp/check.h: exits 0 when
// every check passed).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "tests/cpp/check.h"
#include "transports/shm/shared_segment.h"
#include "transports/transport.h"

using ucxb::TransportError;
using ucxb::shm::Liveness;
using ucxb::shm::SegmentOwner;
using ucxb::shm::SharedSegment;

namespace {

using ucxb::check::contains;

// The message of the TransportError `fn` throws, or "" when it throws none.
template <typename Fn>
std::string errorOf(Fn fn) {
  return ucxb::check::thrownMessage<TransportError>(fn);
}

void testSegment() {
  const std::string name = "/ucxb-test-" + std::to_string(getpid());
  {
    SharedSegment mine = SharedSegment::create(name, 8192);
    CHECK_MSG(mine.valid() && mine.size() == 8192, "create maps the requested size");
    bool zero = true;
    for (size_t i = 0; i < mine.size(); ++i) zero = zero && mine.data()[i] == 0;
    CHECK_MSG(zero, "a new segment is zeroed");
    std::memcpy(mine.data() + 100, "cookie", 6);

    SharedSegment peer = SharedSegment::open(name, 8192);
    CHECK_MSG(std::memcmp(peer.data() + 100, "cookie", 6) == 0, "open sees the creator's bytes");
    peer.data()[5000] = 42;
    CHECK_MSG(mine.data()[5000] == 42, "the creator sees the opener's bytes");

    const std::string again = errorOf([&] { SharedSegment::create(name, 8192); });
    CHECK_MSG(contains(again, "File exists"),
           "creating an existing name fails with EEXIST");
    const std::string small = errorOf([&] { SharedSegment::open(name, 1 << 20); });
    CHECK_MSG(contains(small, "has 8192 bytes, expected 1048576"), "open checks the size");

    SharedSegment moved = std::move(mine);
    CHECK_MSG(!mine.valid() && moved.valid() && moved.data()[5000] == 42, "move keeps the mapping");
    moved.unlink();
    moved.unlink();  // idempotent
    const std::string gone = errorOf([&] { SharedSegment::open(name, 8192); });
    CHECK_MSG(contains(gone, "No such file"), "after unlink the name is gone");
    CHECK_MSG(moved.data()[5000] == 42 && peer.data()[100] == 'c', "mappings outlive the name");
  }
  {
    SharedSegment owner = SharedSegment::create(name, 4096);
  }  // destroyed without unlink(): the destructor removes the name
  CHECK_MSG(contains(errorOf([&] { SharedSegment::open(name, 4096); }), "No such file"),
         "the creator's destructor unlinks");
  CHECK_MSG(contains(errorOf([&] { SharedSegment::create("no-slash/x", 4096); }), "shm_open"),
         "a bad name is an error naming the call");
}

// Bytes of /dev/shm that `name` holds (tmpfs counts only the pages allocated).
size_t allocatedBytes(const std::string& name) {
  struct stat st {};
  if (::stat(("/dev/shm" + name).c_str(), &st) != 0) return SIZE_MAX;
  return static_cast<size_t>(st.st_blocks) * 512;
}

void testReserve() {
  const std::string name = "/ucxb-test-reserve-" + std::to_string(getpid());
  {
    SharedSegment lazy = SharedSegment::create(name, 1 << 20, 4096);
    CHECK_MSG(allocatedBytes(name) == 4096,
              "a segment created with 4 KiB reserved holds only those pages (got " +
                  std::to_string(allocatedBytes(name)) + " bytes)");
    lazy.reserve(65536, 8192);
    CHECK_MSG(allocatedBytes(name) == 4096 + 8192,
              "reserve() takes the pages of its range before anything is written there");
    CHECK_MSG(lazy.data()[65536] == 0 && lazy.data()[(1 << 20) - 1] == 0,
              "reserved and unreserved pages read as zeros");
    SharedSegment peer = SharedSegment::open(name, 1 << 20);
    CHECK_MSG(contains(errorOf([&] { peer.reserve(0, 4096); }), "peer's mapping"),
              "only the creator reserves");
  }
  {
    SharedSegment whole = SharedSegment::create(name, 65536);
    CHECK_MSG(allocatedBytes(name) == 65536, "by default every page is reserved at creation");
  }
  struct statvfs fs {};
  CHECK_MSG(statvfs("/dev/shm", &fs) == 0, "statvfs of /dev/shm");
  const size_t tooBig = static_cast<size_t>(fs.f_bavail) * fs.f_frsize + (size_t{1} << 30);
  if (fs.f_blocks != 0) {
    const std::string err = errorOf([&] { SharedSegment::create(name, tooBig, 4096); });
    CHECK_MSG(contains(err, "bytes free, the segment needs " + std::to_string(tooBig)),
              "a segment larger than /dev/shm's free space fails at creation: " + err);
    CHECK_MSG(allocatedBytes(name) == SIZE_MAX, "and leaves no name behind");
    // Room for one segment but not for the group's: each of its ranks checks for all.
    const size_t fits = static_cast<size_t>(fs.f_bavail) * fs.f_frsize / 4;
    const std::string groupErr = errorOf([&] { SharedSegment::create(name, fits, 4096, 8); });
    CHECK_MSG(contains(groupErr, "for 8 segments of its group"),
              "a group whose segments together exceed /dev/shm's free space fails: " + groupErr);
    CHECK_MSG(allocatedBytes(name) == SIZE_MAX, "and leaves no name behind");
  }
}

void testHostIdentity() {
  const std::string id = ucxb::shm::hostIdentity();
  CHECK_MSG(id == ucxb::shm::hostIdentity(), "the host identity is stable");
  CHECK_MSG(contains(id, "/mnt:") && contains(id, "/net:") && id.find('?') == std::string::npos,
         "the host identity names boot, mount and network namespace");
}

void testSegmentNames() {
  const SegmentOwner me = ucxb::shm::currentOwner();
  CHECK_MSG(me.pid == getpid() && me.startTime > 0 && me.pidNamespace > 0,
            "this process's owner record has its pid, start time and pid namespace");
  const std::string name = ucxb::shm::segmentName(me, 123456789, 7);
  SegmentOwner parsed;
  CHECK_MSG(ucxb::shm::parseSegmentName(name, parsed) && parsed == me,
            "a segment name gives back its owner");
  CHECK_MSG(ucxb::shm::parseSegmentName(name.substr(1), parsed) && parsed == me,
            "also as a /dev/shm file name, without the slash");
  CHECK_MSG(contains(name, "/ucxb-" + std::to_string(getpid()) + "-") &&
                contains(name, "-r7"),
            "the name starts with the pid and ends with the rank");
  for (const char* bad : {"/ucxb-1-2-3-4-r", "/ucxb-1-2-3-r0", "/ucxb-1-2-3-4-r0x",
                          "/ucxb-0-2-3-4-r0", "/ucxb-12-999999-r1", "/ucxb-a-2-3-4-r0",
                          "/other-1-2-3-4-r0", "/ucxb-1-2-3-4-5-r0", ""}) {
    CHECK_MSG(!ucxb::shm::parseSegmentName(bad, parsed), std::string("rejects ") + bad);
  }
}

// A child process that has exited; reaped (its pid is gone) or not (a zombie).
SegmentOwner exitedChild(bool reap, pid_t& pid) {
  pid = fork();
  if (pid == 0) {
    pause();
    _exit(0);
  }
  SegmentOwner child = ucxb::shm::currentOwner();
  child.pid = pid;
  uint64_t start = 0;
  // The child's start time, as currentOwner() would have recorded it in the child.
  if (FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r")) {
    char buf[1024] = {};
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    const std::string line(buf, n);
    const char* p = line.c_str() + line.rfind(')') + 2;
    for (int field = 3; field < 22; ++field) p = std::strchr(p, ' ') + 1;
    start = std::strtoull(p, nullptr, 10);
  }
  child.startTime = start;
  kill(pid, SIGKILL);
  if (reap) {
    waitpid(pid, nullptr, 0);
  } else {
    siginfo_t info{};
    waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT);  // dead, not reaped
  }
  return child;
}

void testLiveness() {
  const SegmentOwner me = ucxb::shm::currentOwner();
  CHECK_MSG(ucxb::shm::ownerLiveness(me) == Liveness::kAlive, "this process is alive");
  SegmentOwner reused = me;
  reused.startTime += 1;
  CHECK_MSG(ucxb::shm::ownerLiveness(reused) == Liveness::kDead,
            "a pid whose process started at another time is a dead owner (pid reuse)");
  SegmentOwner elsewhere = me;
  elsewhere.pidNamespace += 1;
  CHECK_MSG(ucxb::shm::ownerLiveness(elsewhere) == Liveness::kUnknown,
            "an owner in another pid namespace is never called dead");
  SegmentOwner noStart = me;
  noStart.startTime = 0;
  CHECK_MSG(ucxb::shm::ownerLiveness(noStart) == Liveness::kUnknown,
            "a live pid without a recorded start time is not called dead");
  pid_t pid = 0;
  const SegmentOwner zombie = exitedChild(false, pid);
  CHECK_MSG(zombie.startTime > 0 && ucxb::shm::ownerLiveness(zombie) == Liveness::kDead,
            "a zombie is a dead owner");
  waitpid(pid, nullptr, 0);
  CHECK_MSG(ucxb::shm::ownerLiveness(zombie) == Liveness::kDead, "a reaped child is a dead owner");
}

void testSweep() {
  pid_t pid = 0;
  const SegmentOwner dead = exitedChild(true, pid);
  const SegmentOwner me = ucxb::shm::currentOwner();
  const uint64_t nonce = static_cast<uint64_t>(getpid()) * 1000;
  const std::string deadName = ucxb::shm::segmentName(dead, nonce + 1, 0);
  const std::string liveName = ucxb::shm::segmentName(me, nonce + 2, 0);
  SegmentOwner foreignNs = dead;
  foreignNs.pidNamespace += 1;
  const std::string foreignNsName = ucxb::shm::segmentName(foreignNs, nonce + 3, 0);
  // Left behind as a killed creator leaves them: named, with nobody to unlink them.
  for (const auto& n : {deadName, liveName, foreignNsName}) {
    const int fd = shm_open(n.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    CHECK_MSG(fd >= 0, "made " + n);
    if (fd >= 0) close(fd);
  }
  const size_t removed = ucxb::shm::removeOrphanedSegments();
  auto exists = [](const std::string& n) {
    struct stat st {};
    return ::stat(("/dev/shm" + n).c_str(), &st) == 0;
  };
  CHECK_MSG(removed >= 1 && !exists(deadName), "the sweep removes a dead owner's segment");
  CHECK_MSG(exists(liveName), "the sweep keeps a live owner's segment");
  CHECK_MSG(exists(foreignNsName), "the sweep keeps a segment from another pid namespace");
  shm_unlink(liveName.c_str());
  shm_unlink(foreignNsName.c_str());
  CHECK_MSG(ucxb::shm::removeOrphanedSegments("/nonexistent-dir") == 0,
            "a missing directory is nothing to sweep");
}

void testRemoveName() {
  const std::string name = "/ucxb-test-rm-" + std::to_string(getpid());
  SharedSegment mine = SharedSegment::create(name, 4096);
  SharedSegment peer = SharedSegment::open(name, 4096);
  peer.data()[10] = 9;
  peer.removeName();  // the last peer to map it
  CHECK_MSG(contains(errorOf([&] { SharedSegment::open(name, 4096); }), "No such file"),
            "a peer removes the name");
  CHECK_MSG(mine.data()[10] == 9, "both mappings stay");
  mine.unlink();  // the creator's own unlink then finds nothing: no error
}

}  // namespace

int main(int argc, char** argv) {
  const ucxb::check::Group groups[] = {
      {"segment", testSegment, true},
      {"reserve", testReserve, true},
      {"host_identity", testHostIdentity, true},
      {"segment_names", testSegmentNames, true},
      {"liveness", testLiveness, true},
      {"sweep", testSweep, true},
      {"remove_name", testRemoveName, true},
  };
  return ucxb::check::runGroups("shared_segment_test", groups, argc, argv);
}
