// transports/shm/shared_segment.{h,cpp} on its own: create, open, unlink, the errors, and the
// host identity. Built and run by tests/test_shared_memory.py; prints "OK" and exits 0, else
// names the first failed check and exits 1.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "transports/shm/shared_segment.h"
#include "transports/transport.h"

using ucxb::TransportError;
using ucxb::shm::SharedSegment;

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

// The message of the TransportError `fn` throws, or "" when it throws none.
template <typename Fn>
std::string errorOf(Fn fn) {
  try {
    fn();
  } catch (const TransportError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

int main() {
  const std::string name = "/ucxb-test-" + std::to_string(getpid());
  {
    SharedSegment mine = SharedSegment::create(name, 8192);
    expect(mine.valid() && mine.size() == 8192, "create maps the requested size");
    bool zero = true;
    for (size_t i = 0; i < mine.size(); ++i) zero = zero && mine.data()[i] == 0;
    expect(zero, "a new segment is zeroed");
    std::memcpy(mine.data() + 100, "cookie", 6);

    SharedSegment peer = SharedSegment::open(name, 8192);
    expect(std::memcmp(peer.data() + 100, "cookie", 6) == 0, "open sees the creator's bytes");
    peer.data()[5000] = 42;
    expect(mine.data()[5000] == 42, "the creator sees the opener's bytes");

    const std::string again = errorOf([&] { SharedSegment::create(name, 8192); });
    expect(contains(again, "File exists"),
           "creating an existing name fails with EEXIST");
    const std::string small = errorOf([&] { SharedSegment::open(name, 1 << 20); });
    expect(contains(small, "has 8192 bytes, expected 1048576"), "open checks the size");

    SharedSegment moved = std::move(mine);
    expect(!mine.valid() && moved.valid() && moved.data()[5000] == 42, "move keeps the mapping");
    moved.unlink();
    moved.unlink();  // idempotent
    const std::string gone = errorOf([&] { SharedSegment::open(name, 8192); });
    expect(contains(gone, "No such file"), "after unlink the name is gone");
    expect(moved.data()[5000] == 42 && peer.data()[100] == 'c', "mappings outlive the name");
  }
  {
    SharedSegment owner = SharedSegment::create(name, 4096);
  }  // destroyed without unlink(): the destructor removes the name
  expect(contains(errorOf([&] { SharedSegment::open(name, 4096); }), "No such file"),
         "the creator's destructor unlinks");
  expect(contains(errorOf([&] { SharedSegment::create("no-slash/x", 4096); }), "shm_open"),
         "a bad name is an error naming the call");

  const std::string id = ucxb::shm::hostIdentity();
  expect(id == ucxb::shm::hostIdentity(), "the host identity is stable");
  expect(contains(id, "/mnt:") && contains(id, "/net:") && id.find('?') == std::string::npos,
         "the host identity names boot, mount and network namespace");
  if (failures == 0) std::printf("OK\n");
  return failures == 0 ? 0 : 1;
}
