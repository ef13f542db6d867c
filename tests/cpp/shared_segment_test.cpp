// transports/shm/shared_segment.{h,cpp} on its own: create, open, unlink, the errors, and the
// host identity. Built and run by tests/test_shared_memory.py (tests/cpp/check.h: exits 0 when
// every check passed).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "tests/cpp/check.h"
#include "transports/shm/shared_segment.h"
#include "transports/transport.h"

using ucxb::TransportError;
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

void testHostIdentity() {
  const std::string id = ucxb::shm::hostIdentity();
  CHECK_MSG(id == ucxb::shm::hostIdentity(), "the host identity is stable");
  CHECK_MSG(contains(id, "/mnt:") && contains(id, "/net:") && id.find('?') == std::string::npos,
         "the host identity names boot, mount and network namespace");
}

}  // namespace

int main(int argc, char** argv) {
  const ucxb::check::Group groups[] = {
      {"segment", testSegment, true},
      {"host_identity", testHostIdentity, true},
  };
  return ucxb::check::runGroups("shared_segment_test", groups, argc, argv);
}
