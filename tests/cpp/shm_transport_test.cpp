// transports/shm/'s ShmTransport on its own: transports of this process talking to each other
// (one thread drives them all through progress(), or one thread each where they sleep on their
// event fds), and a forked child that exits while the parent still waits on it. Matching,
// order, long messages by reference (read out of the sender's memory) and streamed through the
// 16 KiB ring (World's Path), sends that wait for their receive, truncation, zero-length and
// self sends, cancel, abortPeer and a cut-off peer, a long message given up in the instant a
// receive takes it, probe, the doorbell protocol, a dead peer, a peer whose pid names another
// process by connect, and requests that outlive their transport. Built and run by tests/test_shared_memory.py, plain and under ASan/UBSan
// (tests/cpp/check.h: exits 0 when every check passed).
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/cpp/check.h"
#include "transports/shm/inbox.h"
#include "transports/shm/shared_segment.h"
#include "transports/shm/shm_transport.h"
#include "transports/tag.h"

using ucxb::kAnySource;
using ucxb::RequestPtr;
using ucxb::RequestState;
using ucxb::Tag;
using ucxb::check::contains;
using ucxb::shm::ShmTransport;
namespace tag = ucxb::tag;

namespace {

using Clock = std::chrono::steady_clock;

// The tests' groups have this many ranks, of which they make and connect the first few: the
// size only sets the layout of each inbox. Many ranks make the rings small (their size comes
// from the layout, by the group's size: ringBytes()), so that a message several rings long
// still streams through its ring, as it does in a large group, instead of taking whatever
// path a transport has for large messages.
constexpr int kWide = 64;

// Bytes of each sender's ring in an inbox of `ranks` ranks.
size_t ringBytes(int ranks) {
  using ucxb::shm::InboxLayout;
  return (InboxLayout::bytes(ranks) - InboxLayout::ringsOffset(ranks)) / size_t(ranks);
}
const size_t kRing = ringBytes(kWide);
constexpr Tag kFull = tag::kFullMask;
constexpr Tag kAnyMask = tag::kAnySourceMask;

Tag tagOf(uint64_t user, int src) { return tag::p2p(5, user, static_cast<uint32_t>(src)); }

bool done(const RequestPtr& r) { return r->state() == RequestState::kDone; }

// Bytes no other message of a test has at the same offset.
std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 12345;
  for (auto& b : v) {
    x = x * 1103515245u + 12345;
    b = static_cast<uint8_t>(x >> 16);
  }
  return v;
}

bool sameBytes(const void* a, const std::vector<uint8_t>& b, size_t n) {
  return n == 0 || std::memcmp(a, b.data(), n) == 0;
}

bool allAre(const uint8_t* p, size_t n, uint8_t value) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != value) return false;
  }
  return true;
}

bool readable(int fd, int timeoutMs = 0) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeoutMs) == 1;
}

// How a message longer than the ring goes: by reference (the receiver reads the sender's
// buffer, process_vm_readv: always allowed within one process), or streamed through the ring,
// as between ranks whose receiver may not read the sender's memory (ptrace rules, seccomp).
enum class Path { kByReference, kStreamed };

// The name of the inbox segment in a shm transport's address (its sixth line: shm_transport.cpp,
// packAddress).
std::string inboxName(const std::vector<uint8_t>& address) {
  std::string text(address.begin(), address.end()), line;
  std::istringstream in(text);
  for (int i = 0; i < 6; ++i) std::getline(in, line);
  return line;
}

// Ranks 0..n-1 of a group of `size` ranks, transports of this process, each connected to
// every other and itself (the group's other ranks are never made). kStreamed: after connect,
// each receiver's word saying that it may read its senders' memory is cleared, as connect()
// leaves it where its probe read fails, so that long messages stream through the rings.
struct World {
  std::vector<std::unique_ptr<ShmTransport>> t;

  explicit World(int n, int size = kWide, Path path = Path::kByReference) {
    using ucxb::shm::InboxLayout;
    for (int r = 0; r < n; ++r) t.push_back(std::make_unique<ShmTransport>(r, size));
    // Mapped before connect(): the last peer to map an inbox removes its name.
    std::vector<ucxb::shm::SharedSegment> inboxes;
    if (path == Path::kStreamed) {
      for (int r = 0; r < n; ++r) {
        inboxes.push_back(ucxb::shm::SharedSegment::open(inboxName(t[r]->localAddress()),
                                                         InboxLayout::bytes(size)));
      }
    }
    for (int r = 0; r < n; ++r) {
      for (int q = 0; q < n; ++q) t[r]->connect(q, t[q]->localAddress());
    }
    for (size_t r = 0; r < inboxes.size(); ++r) {
      for (int q = 0; q < n; ++q) {
        InboxLayout::ring(inboxes[r].data(), size, q)
            .control()
            .consumerReadsProducer.store(0, std::memory_order_release);
      }
    }
  }
  ucxb::Transport& operator[](int r) { return *t[static_cast<size_t>(r)]; }
  // Progresses every live transport in turn until `until` holds; false at the deadline.
  bool drive(const std::function<bool()>& until, double seconds = 10.0) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (!until()) {
      if (Clock::now() >= deadline) return false;
      for (auto& x : t) {
        if (x) x->progress();
      }
    }
    return true;
  }
  // A few rounds of progress() on every transport: what is in the rings is taken.
  void spin(int rounds = 3) {
    for (int i = 0; i < rounds; ++i) {
      for (auto& x : t) {
        if (x) x->progress();
      }
    }
  }
  bool settle(std::initializer_list<RequestPtr> rs) {
    std::vector<RequestPtr> v(rs);
    return drive([&] {
      for (const auto& r : v) {
        if (r->pending()) return false;
      }
      return true;
    });
  }
};

// ----------------------------------------------------------------------------- matching

void testMatching() {
  World w(2);
  ucxb::Transport& a = w[0];
  ucxb::Transport& b = w[1];

  // Each receive takes the message of its tag, whichever was posted or sent first; a message
  // shorter than the buffer completes with its own length.
  const std::string m1 = "first", m2 = "second!";
  char g1[16] = {}, g2[16] = {};
  auto r2 = b.recv(0, tagOf(2, 0), kFull, g2, sizeof g2);
  auto r1 = b.recv(0, tagOf(1, 0), kFull, g1, sizeof g1);
  auto s1 = a.send(1, tagOf(1, 0), m1.data(), m1.size());
  auto s2 = a.send(1, tagOf(2, 0), m2.data(), m2.size());
  CHECK(w.settle({r1, r2, s1, s2}));
  CHECK(done(r1) && done(r2) && done(s1) && done(s2));
  CHECK_EQ(std::string(g1, r1->receivedBytes()), m1);
  CHECK_EQ(std::string(g2, r2->receivedBytes()), m2);
  CHECK_EQ(r1->senderTag(), tagOf(1, 0));
  CHECK_EQ(r2->senderTag(), tagOf(2, 0));

  // A mask leaves bits out of the match: any source, or any user tag; the sender's tag says
  // which message it was.
  char g3[8] = {}, g4[8] = {};
  auto r3 = b.recv(kAnySource, tagOf(3, 0), kAnyMask, g3, sizeof g3);
  const Tag anyUser = ~(tag::kUserMask << tag::kUserShift);
  auto r4 = b.recv(0, tagOf(0, 0), anyUser, g4, sizeof g4);
  auto s4 = a.send(1, tagOf(44, 0), "user", 5);
  auto s3 = a.send(1, tagOf(3, 0), "any", 4);
  CHECK(w.settle({r3, r4, s3, s4}));
  CHECK(done(r3) && std::string(g3) == "any" && r3->senderTag() == tagOf(3, 0));
  CHECK(done(r4) && std::string(g4) == "user" && r4->senderTag() == tagOf(44, 0));

  // A message whose tag no receive names waits; a receive whose tag no message has stays
  // posted.
  auto s5 = a.send(1, tagOf(6, 0), "six", 4);
  char g5[8] = {};
  auto r5 = b.recv(0, tagOf(7, 0), kFull, g5, sizeof g5);
  CHECK(w.settle({s5}));
  for (int i = 0; i < 50; ++i) {
    a.progress();
    b.progress();
  }
  CHECK(r5->pending());
  CHECK_EQ(b.probe(tagOf(6, 0), kFull), 0);
  r5->cancel();
  b.progress();
  CHECK(r5->failed());
}

// Three ranks: posted any-source receives take messages in posting order, unexpected ones
// are taken in the order they arrived, and a directed receive skips other ranks' messages.
void testAnySource() {
  World w(3);
  char b1[8] = {}, b2[8] = {};
  auto r1 = w[0].recv(kAnySource, tagOf(5, 0), kAnyMask, b1, sizeof b1);
  auto r2 = w[0].recv(kAnySource, tagOf(5, 0), kAnyMask, b2, sizeof b2);
  auto s2 = w[2].send(0, tagOf(5, 2), "two", 4);
  w[0].progress();
  CHECK(done(r1) && r2->pending());
  CHECK(std::string(b1) == "two" && tag::source(r1->senderTag()) == 2);
  auto s1 = w[1].send(0, tagOf(5, 1), "one", 4);
  w[0].progress();
  CHECK(done(r2) && std::string(b2) == "one" && tag::source(r2->senderTag()) == 1);

  auto sa = w[1].send(0, tagOf(6, 1), "A", 2);
  w[0].progress();
  auto sb = w[2].send(0, tagOf(6, 2), "B", 2);
  w[0].progress();
  auto sc = w[1].send(0, tagOf(6, 1), "C", 2);
  w[0].progress();
  CHECK(w.settle({s1, s2, sa, sb, sc}));
  CHECK_EQ(w[0].probe(tagOf(6, 0), kAnyMask), 1);
  CHECK_EQ(w[0].probe(tagOf(6, 2), kFull), 2);
  char d[4] = {}, x[4] = {}, y[4] = {};
  auto rd = w[0].recv(2, tagOf(6, 2), kFull, d, sizeof d);
  auto rx = w[0].recv(kAnySource, tagOf(6, 0), kAnyMask, x, sizeof x);
  auto ry = w[0].recv(kAnySource, tagOf(6, 0), kAnyMask, y, sizeof y);
  CHECK(w.settle({rd, rx, ry}));
  CHECK(std::string(d) == "B" && std::string(x) == "A" && std::string(y) == "C");
  CHECK_EQ(w[0].probe(tagOf(6, 0), kAnyMask), -1);
}

// Many messages of one tag from one sender, of sizes from 0 to several rings, half received
// by receives posted before they came and half taken later as unexpected ones: in order,
// intact, by either path. A send longer than the ring completes only once a receive took it:
// the unexpected ones wait for theirs.
void testFifo(Path path) {
  World w(2, kWide, path);
  constexpr int kMessages = 120;
  std::vector<std::vector<uint8_t>> sent, got;
  std::vector<RequestPtr> sends, recvs;
  for (int i = 0; i < kMessages; ++i) {
    const size_t n = (i % 7 == 0) ? 0 : (i % 11 == 0) ? 2 * kRing + size_t(i) : size_t(i) * 97;
    sent.push_back(pattern(n, uint32_t(i)));
    got.emplace_back(n + 1, 0xEE);
  }
  for (int i = 0; i < kMessages / 2; ++i) {
    recvs.push_back(w[1].recv(0, tagOf(9, 0), kFull, got[i].data(), got[i].size()));
  }
  for (int i = 0; i < kMessages; ++i) {
    sends.push_back(w[0].send(1, tagOf(9, 0), sent[i].data(), sent[i].size()));
  }
  const auto waitsForItsReceive = [&](int i) {
    return i >= kMessages / 2 && sent[size_t(i)].size() > kRing;
  };
  CHECK(w.drive([&] {
    for (int i = 0; i < kMessages; ++i) {
      if (!waitsForItsReceive(i) && sends[size_t(i)]->pending()) return false;
    }
    return true;
  }));
  w.spin();
  int waiting = 0;
  for (int i = 0; i < kMessages; ++i) waiting += waitsForItsReceive(i) && sends[size_t(i)]->pending();
  CHECK_MSG(waiting == 4, "the long sends no receive took yet wait (" + std::to_string(waiting) +
                              " of 4)");
  CHECK_EQ(w[1].probe(tagOf(9, 0), kFull), 0);
  for (int i = kMessages / 2; i < kMessages; ++i) {
    recvs.push_back(w[1].recv(0, tagOf(9, 0), kFull, got[i].data(), got[i].size()));
  }
  CHECK(w.drive([&] {
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (recvs[i]->pending() || sends[i]->pending()) return false;
    }
    return true;
  }));
  int wrong = 0;
  for (int i = 0; i < kMessages; ++i) {
    const size_t n = sent[i].size();
    const bool ok = done(recvs[i]) && done(sends[i]) && recvs[i]->receivedBytes() == n &&
                    sameBytes(got[i].data(), sent[i], n) && got[i][n] == 0xEE;
    if (!ok) ++wrong;
    CHECK_MSG(ok || wrong > 3, "message " + std::to_string(i) + " of " +
                                   std::to_string(n) + " bytes arrived intact, in order");
  }
  CHECK_EQ(wrong, 0);
}

// A message several rings long streams while the receiver copies out (the receiver may not
// read the sender's memory): the send completes only once a receive took it, whether it was
// posted or unexpected, or claimed while still arriving.
void testLarge() {
  World w(2, kWide, Path::kStreamed);
  ucxb::Transport& a = w[0];
  ucxb::Transport& b = w[1];
  const size_t n = 3 * kRing + 123;
  const auto msg = pattern(n, 77);
  std::vector<uint8_t> into(n, 0);
  auto r = b.recv(0, tagOf(1, 0), kFull, into.data(), n);
  auto s = a.send(1, tagOf(1, 0), msg.data(), n);
  for (int i = 0; i < 20; ++i) a.progress();
  CHECK_MSG(s->pending(), "a send of five rings waits for the receiver");
  CHECK(w.settle({r, s}));
  CHECK(done(r) && done(s) && r->receivedBytes() == n && sameBytes(into.data(), msg, n));

  // Unexpected: kept whole by the receiver until a receive asks for it; its send waits.
  auto s2 = a.send(1, tagOf(2, 0), msg.data(), n);
  w.spin(20);
  CHECK_MSG(s2->pending(), "a long send that no receive took waits for one");
  CHECK_EQ(b.probe(tagOf(2, 0), kFull), 0);
  std::vector<uint8_t> into2(n, 0);
  auto r2 = b.recv(0, tagOf(2, 0), kFull, into2.data(), n);
  CHECK(w.settle({r2, s2}));
  CHECK(done(r2) && done(s2) && r2->receivedBytes() == n && sameBytes(into2.data(), msg, n));

  // Claimed while still arriving: a receive posted after the first ring came.
  auto s3 = a.send(1, tagOf(3, 0), msg.data(), n);
  b.progress();
  CHECK_EQ(b.probe(tagOf(3, 0), kFull), 0);
  std::vector<uint8_t> into3(n, 0);
  auto r3 = b.recv(0, tagOf(3, 0), kFull, into3.data(), n);
  CHECK(r3->pending());
  CHECK(w.settle({r3, s3}));
  CHECK(done(r3) && done(s3) && r3->receivedBytes() == n && sameBytes(into3.data(), msg, n));
}

// Large messages in a 2-rank group, from 64 KiB up to several times its ring: whatever path
// the transport takes for them (streamed through the ring, or another), they arrive intact,
// posted or unexpected, are truncated to a short receive, and a send cancelled once begun
// still settles without breaking the next message.
void testLargeMessages() {
  World w(2, 2);
  ucxb::Transport& a = w[0];
  ucxb::Transport& b = w[1];
  const size_t sizes[] = {size_t{64} << 10, (size_t{64} << 10) + 1, 3 * ringBytes(2) + 5,
                          size_t{2} << 20};
  uint32_t seed = 300;
  for (const size_t n : sizes) {
    const std::string what = std::to_string(n) + " bytes";
    const auto msg = pattern(n, seed++);
    std::vector<uint8_t> in(n + 8, 0xEE);
    auto r = b.recv(0, tagOf(1, 0), kFull, in.data(), in.size());
    auto s = a.send(1, tagOf(1, 0), msg.data(), n);
    CHECK_MSG(w.settle({r, s}) && done(r) && done(s) && r->receivedBytes() == n &&
                  sameBytes(in.data(), msg, n) && allAre(in.data() + n, 8, 0xEE),
              what + ", posted: " + r->error());

    auto s2 = a.send(1, tagOf(2, 0), msg.data(), n);
    w.spin();
    CHECK_MSG(b.probe(tagOf(2, 0), kFull) == 0, what + ", unexpected: here");
    std::vector<uint8_t> in2(n);
    auto r2 = b.recv(0, tagOf(2, 0), kFull, in2.data(), n);
    CHECK_MSG(w.settle({r2, s2}) && done(r2) && done(s2) && in2 == msg,
              what + ", unexpected: " + r2->error());

    std::vector<uint8_t> shortBuf(1000 + 8, 0xAB);
    auto r3 = b.recv(0, tagOf(3, 0), kFull, shortBuf.data(), 1000);
    auto s3 = a.send(1, tagOf(3, 0), msg.data(), n);
    CHECK_MSG(w.settle({r3, s3}) && r3->truncated() && done(s3) &&
                  sameBytes(shortBuf.data(), msg, 1000) && allAre(shortBuf.data() + 1000, 8, 0xAB),
              what + ", truncated: " + r3->error());

    auto s4 = a.send(1, tagOf(4, 0), msg.data(), n);
    a.progress();
    s4->cancel();
    auto s5 = a.send(1, tagOf(4, 0), "next", 5);
    std::vector<uint8_t> in4(n);
    char in5[8] = {};
    auto r4 = b.recv(0, tagOf(4, 0), kFull, in4.data(), n);
    auto r5 = b.recv(0, tagOf(4, 0), kFull, in5, sizeof in5);
    CHECK_MSG(w.settle({s4, s5, r4, r5}), what + ", cancelled send: everything settles");
    CHECK_MSG(!done(r4) || in4 == msg, what + ", cancelled send: intact if it arrived");
    CHECK_MSG(done(r5) && std::string(in5) == "next", what + ", the message after a cancelled send");
  }
}

// ----------------------------------------------------------------------------- long messages

// A message longer than the ring goes by reference where the receiver may read the sender's
// memory: the receiver reads it out of the sender's buffer when a receive takes it (a byte
// changed after send() arrives changed), and only then tells the sender, whose send completes
// after the read. Posted, unexpected, truncated to a shorter receive, a cancel once its header
// is out, and a sleeping sender woken by the match notice.
void testByReference() {
  World w(2);
  ucxb::Transport& a = w[0];
  ucxb::Transport& b = w[1];
  const size_t n = 3 * kRing + 5;
  const auto msg = pattern(n, 21);

  // Posted.
  {
    auto src = msg;
    std::vector<uint8_t> in(n + 8, 0xEE);
    auto r = b.recv(0, tagOf(1, 0), kFull, in.data(), n);
    auto s = a.send(1, tagOf(1, 0), src.data(), n);
    for (int i = 0; i < 20; ++i) a.progress();
    CHECK_MSG(s->pending(), "a send by reference waits for the receiver's read");
    src[0] ^= 0xFF;  // read at the match, not copied at send()
    b.progress();
    CHECK_MSG(done(r) && r->receivedBytes() == n && in[0] == src[0] &&
                  sameBytes(in.data() + 1, std::vector<uint8_t>(src.begin() + 1, src.end()),
                            n - 1) &&
                  allAre(in.data() + n, 8, 0xEE),
              "posted: read from the sender's buffer at the match: " + r->error());
    CHECK_MSG(s->pending(), "the send completes when the sender takes the match notice");
    a.progress();
    CHECK(done(s) && s->error().empty());
  }

  // Unexpected: the receive reads it at once; the send waits for it until then.
  {
    auto src = msg;
    std::vector<uint8_t> in(n);
    auto s = a.send(1, tagOf(2, 0), src.data(), n);
    w.spin(20);
    CHECK_MSG(s->pending(), "unexpected: the send waits for a receive");
    CHECK_EQ(b.probe(tagOf(2, 0), kFull), 0);
    src[n - 1] ^= 0xFF;
    auto r = b.recv(0, tagOf(2, 0), kFull, in.data(), n);
    CHECK_MSG(done(r) && in == src, "unexpected: read when the receive takes it: " + r->error());
    CHECK(s->pending());
    CHECK(w.settle({s}) && done(s));
  }

  // Truncated to a shorter receive, posted and unexpected: what fits is read, no byte past
  // the buffer, and the send completes (the receive took it).
  for (const bool posted : {true, false}) {
    const std::string how = posted ? "truncated, posted" : "truncated, unexpected";
    const size_t fits = kRing + 7;
    std::vector<uint8_t> in(fits + 64, 0xAB);
    RequestPtr r, s;
    if (posted) r = b.recv(0, tagOf(3, 0), kFull, in.data(), fits);
    s = a.send(1, tagOf(3, 0), msg.data(), n);
    w.spin();
    if (!posted) {
      CHECK_MSG(s->pending(), how + ": waits for a receive");
      r = b.recv(0, tagOf(3, 0), kFull, in.data(), fits);
    }
    CHECK_MSG(w.settle({r, s}) && r->failed() && r->truncated() && done(s), how + ": " + r->error());
    CHECK_MSG(contains(r->error(), "longer than") && contains(r->error(), std::to_string(n)),
              how + ": " + r->error());
    CHECK_MSG(sameBytes(in.data(), msg, fits) && allAre(in.data() + fits, 64, 0xAB), how);
  }

  // A cancel once its header is out withdraws nothing: the receive still takes it whole and
  // the send completes.
  {
    std::vector<uint8_t> in(n);
    auto s = a.send(1, tagOf(4, 0), msg.data(), n);
    s->cancel();
    w.spin();
    CHECK_MSG(s->pending(), "a send by reference whose header is out stays pending");
    auto r = b.recv(0, tagOf(4, 0), kFull, in.data(), n);
    CHECK(w.settle({r, s}) && done(r) && done(s) && in == msg);
  }

  // A sender asleep on its send is woken by the match notice.
  {
    std::vector<uint8_t> in(n);
    auto s = a.send(1, tagOf(5, 0), msg.data(), n);
    a.progress();
    CHECK(s->pending());
    CHECK(a.arm());
    CHECK(!readable(a.eventFd()));
    auto r = b.recv(0, tagOf(5, 0), kFull, in.data(), n);
    b.progress();
    CHECK_MSG(done(r) && readable(a.eventFd(), 2000), "the match notice wakes the sender");
    a.progress();
    CHECK(done(s) && in == msg);
  }
}

// A sender that gives its send by reference up before the receiver read it (abortPeer: it
// may reuse the buffer at once) makes the receiver's read fail, whether the receiver saw the
// abandonment before its receive or not; and where the receiver cuts the sender off first,
// its later receive fails too (the sender failed that send and may reuse the buffer).
void testByReferenceGivenUp() {
  const size_t n = 3 * kRing + 5;
  const auto msg = pattern(n, 22);
  for (const bool seen : {false, true}) {
    const std::string how = seen ? "the receiver saw the abandonment: "
                                 : "the receiver did not see the abandonment yet: ";
    World w(2);
    auto src = msg;
    std::vector<uint8_t> in(n, 0xEE);
    auto s = w[0].send(1, tagOf(1, 0), src.data(), n);
    w[1].progress();  // holds the header: unexpected
    CHECK_EQ(w[1].probe(tagOf(1, 0), kFull), 0);
    w[0].abortPeer(1, "the sender gave up");
    CHECK(s->failed());
    std::fill(src.begin(), src.end(), 0);  // reused
    if (seen) w[1].progress();
    auto r = w[1].recv(0, tagOf(1, 0), kFull, in.data(), n);
    w[1].progress();
    CHECK_MSG(r->failed() && contains(r->error(), "rank 0"), how + r->error());
    CHECK_MSG(!seen || contains(r->error(), "cut this rank off"), how + r->error());
  }
  {
    World w(2);
    auto src = msg;
    std::vector<uint8_t> in(n, 0xEE);
    auto s = w[0].send(1, tagOf(2, 0), src.data(), n);
    w[1].progress();
    w[1].abortPeer(0, "the receiver gave up");
    w[0].progress();  // cut off: fails the send
    CHECK_MSG(s->failed() && contains(s->error(), "cut this rank off"), s->error());
    std::fill(src.begin(), src.end(), 0);
    auto r = w[1].recv(0, tagOf(2, 0), kFull, in.data(), n);
    w[1].progress();
    CHECK_MSG(r->failed() && r->error() == "the receiver gave up",
              "a receive after cutting the sender off does not read its buffer: " + r->error());
  }
}

// A streamed message longer than the ring, wholly held by the receiver, whose sender gave up
// on it (abortPeer) before a receive asked for it: a receive posted before the receiver's
// progress() saw the abandonment must not take it (csrc/p2p_withdraw.hpp: a retried op would
// get the withdrawn message), as with one sent by reference (testByReferenceGivenUp).
void testStreamedGivenUp() {
  const size_t n = 3 * kRing + 5;
  const auto msg = pattern(n, 24);
  for (const bool whole : {true, false}) {
    const std::string how = whole ? "wholly arrived: " : "partly arrived: ";
    World w(2, kWide, Path::kStreamed);
    std::vector<uint8_t> in(n, 0xEE);
    auto s = w[0].send(1, tagOf(1, 0), msg.data(), n);
    if (whole) {
      w.spin(20);  // all of it unexpected at rank 1
    } else {
      w[1].progress();  // its header and first ring's worth
    }
    CHECK_MSG(s->pending() && w[1].probe(tagOf(1, 0), kFull) == 0, how + "held unexpected");
    w[0].abortPeer(1, "the sender gave up");
    CHECK(s->failed());
    auto r = w[1].recv(0, tagOf(1, 0), kFull, in.data(), n);
    w[1].progress();
    CHECK_MSG(r->failed() && contains(r->error(), "cut this rank off"),
              how + "a receive does not take a message its sender gave up: " +
                  (r->failed() ? r->error() : std::string("taken")));
  }
}

// A long message (longer than the ring: streamed) that a receive took, while the match notice
// that tells its sender waits behind a long message of the receiver's own to the sender
// (notices go between messages), and a sender that gives the send up (abortPeer, as a
// timed-out wait does: csrc/p2p_withdraw.hpp) before it could read that notice: the receive
// must not succeed with a message whose send failed; it fails, naming the cut-off. Given up
// before the notice is out, and in the instant it goes out (the receiver's own send completes
// just before it writes the notice, and its callback gives up for the sender there: the
// receiver then reads the sender's mark after writing the notice). With nobody giving up, the
// receive completes once the notice is out, and both messages arrive whole.
void testNoticeBehindOwnMessage() {
  const size_t n = 3 * kRing + 5;
  const size_t back = 20 * kRing;  // the receiver's own message: out for ~20 rounds
  const auto msg = pattern(n, 41);
  const auto other = pattern(back, 42);
  enum class GiveUp { kBeforeNotice, kAsNoticeGoesOut, kNever };
  for (const GiveUp giveUp : {GiveUp::kBeforeNotice, GiveUp::kAsNoticeGoesOut, GiveUp::kNever}) {
    const std::string how = giveUp == GiveUp::kBeforeNotice     ? "given up before the notice: "
                            : giveUp == GiveUp::kAsNoticeGoesOut ? "given up as it goes out: "
                                                                 : "not given up: ";
    World w(2, kWide, Path::kStreamed);
    ucxb::Transport& sender = w[0];
    ucxb::Transport& receiver = w[1];
    const std::string why = "the sender gave up";
    std::vector<uint8_t> in(n, 0xEE), otherIn(back, 0xEE);
    // The receiver's own long message, matched by the sender at its header (its notice goes
    // out at once: the sender sends nothing yet), so that it completes at its last byte.
    auto otherRecv = sender.recv(1, tagOf(9, 1), kFull, otherIn.data(), back);
    auto otherSend = receiver.send(0, tagOf(9, 1), other.data(), back);
    sender.progress();
    auto r = receiver.recv(0, tagOf(1, 0), kFull, in.data(), n);
    auto s = sender.send(1, tagOf(1, 0), msg.data(), n);
    if (giveUp == GiveUp::kAsNoticeGoesOut) {
      otherSend->onComplete([&](ucxb::Request&) { sender.abortPeer(1, why); });
    }
    for (int i = 0; i < 8; ++i) {  // the whole message is at the receiver, its own is not out
      receiver.progress();
      sender.progress();
    }
    CHECK_MSG(otherSend->pending() && s->pending(), how + "the receiver's message is still out");
    CHECK_MSG(r->pending(), how + "the receive waits for its notice to go out");
    if (giveUp == GiveUp::kBeforeNotice) sender.abortPeer(1, why);
    w.settle({r, s, otherSend});
    if (giveUp == GiveUp::kNever) {
      CHECK_MSG(done(r) && done(s) && sameBytes(in.data(), msg, n),
                how + "the receive completes once its notice is out: " + r->error());
      CHECK_MSG(w.settle({otherRecv}) && done(otherSend) && done(otherRecv) &&
                    sameBytes(otherIn.data(), other, back),
                how + otherRecv->error());
      continue;
    }
    CHECK_MSG(s->failed() && s->error() == why, how + s->error());
    CHECK_MSG(r->failed() && contains(r->error(), "rank 0 cut this rank off"),
              how + "a receive does not take a message whose send failed: " +
                  (r->failed() ? r->error() : std::string("taken")));
  }
}

// A long message a receive took, whose match notice is in the sender's ring when the sender
// gives it up before its progress() read the notice (abortPeer, or destroying its transport):
// the send succeeds, as the receive did (both take the notices first). Streamed and by
// reference.
void testNoticeUnread() {
  const size_t n = 3 * kRing + 5;
  const auto msg = pattern(n, 43);
  for (const Path path : {Path::kStreamed, Path::kByReference}) {
    for (const bool destroy : {false, true}) {
      const std::string how = std::string(path == Path::kStreamed ? "streamed, " : "by reference, ") +
                              (destroy ? "the sender destroyed: " : "abortPeer: ");
      World w(2, kWide, path);
      std::vector<uint8_t> in(n, 0xEE);
      auto s = w[0].send(1, tagOf(1, 0), msg.data(), n);
      w.spin(20);  // all of it at the receiver, unexpected (by reference: its header)
      CHECK_MSG(s->pending(), how + "the send waits for a receive");
      auto r = w[1].recv(0, tagOf(1, 0), kFull, in.data(), n);
      CHECK_MSG(done(r) && sameBytes(in.data(), msg, n), how + r->error());
      if (destroy) {
        w.t[0].reset();
      } else {
        w[0].abortPeer(1, "the sender gave up");
      }
      CHECK_MSG(done(s), how + "a send whose receive took it succeeds: " + s->error());
    }
  }
}

// Streamed where the receiver may not read the sender's memory: the first ring's worth is in
// the ring once send() returns (a byte changed after it does not arrive changed), posted and
// unexpected, and the send still waits for a receive to take it.
void testStreamed() {
  World w(2, kWide, Path::kStreamed);
  ucxb::Transport& a = w[0];
  ucxb::Transport& b = w[1];
  const size_t n = 3 * kRing + 5;
  const auto msg = pattern(n, 23);
  for (const bool posted : {true, false}) {
    const std::string how = posted ? "posted: " : "unexpected: ";
    auto src = msg;
    std::vector<uint8_t> in(n + 8, 0xEE);
    RequestPtr r;
    if (posted) r = b.recv(0, tagOf(1, 0), kFull, in.data(), n);
    auto s = a.send(1, tagOf(1, 0), src.data(), n);
    src[0] ^= 0xFF;  // copied into the ring by send()
    if (!posted) {
      w.spin(20);
      CHECK_MSG(s->pending(), how + "the send waits for a receive");
      r = b.recv(0, tagOf(1, 0), kFull, in.data(), n);
    }
    CHECK_MSG(w.settle({r, s}) && done(r) && done(s) && r->receivedBytes() == n &&
                  sameBytes(in.data(), msg, n) && allAre(in.data() + n, 8, 0xEE),
              how + "streamed as it was at send(): " + r->error());
  }
}

// ----------------------------------------------------------------------------- edge sizes

// A message longer than the receive fails it as truncated, writes no byte past the buffer,
// completes the send, and leaves the stream whole for the next message: posted, unexpected,
// longer than the ring (by either path), and claimed while arriving.
void testTruncation(Path path) {
  World w(2, kWide, path);
  ucxb::Transport& a = w[0];
  ucxb::Transport& b = w[1];
  const auto next = pattern(300, 9);
  int round = 0;
  auto check = [&](size_t sent, size_t posted, const char* how) {
    const auto msg = pattern(sent, uint32_t(100 + round));
    const Tag t = tagOf(uint64_t(10 + round), 0);
    ++round;
    std::vector<uint8_t> buf(posted + 64, 0xAB);
    RequestPtr r, s;
    const std::string what = std::string(how) + ": " + std::to_string(sent) + " bytes into " +
                             std::to_string(posted);
    if (std::string(how) == "posted") {
      r = b.recv(0, t, kFull, buf.data(), posted);
      s = a.send(1, t, msg.data(), sent);
    } else if (std::string(how) == "unexpected") {
      s = a.send(1, t, msg.data(), sent);
      if (sent <= kRing) {
        CHECK_MSG(w.settle({s}), what);
      } else {
        w.spin(20);
        CHECK_MSG(s->pending(), what + ": a long send waits for its receive");
      }
      w.spin();
      CHECK_MSG(b.probe(t, kFull) == 0, what + ": here before its receive");
      r = b.recv(0, t, kFull, buf.data(), posted);
    } else {  // claimed while arriving
      s = a.send(1, t, msg.data(), sent);
      b.progress();
      r = b.recv(0, t, kFull, buf.data(), posted);
    }
    CHECK_MSG(w.settle({r, s}), what);
    CHECK_MSG(r->failed() && r->truncated(), what + ": " + r->error());
    CHECK_MSG(contains(r->error(), "longer than") && contains(r->error(), "rank 0") &&
                  contains(r->error(), std::to_string(sent)),
              what + ": " + r->error());
    CHECK_MSG(done(s), what + ": the send completes");
    CHECK_MSG(sameBytes(buf.data(), msg, posted), what + ": what fits is written");
    CHECK_MSG(allAre(buf.data() + posted, 64, 0xAB), what + ": nothing past the buffer");
    // The stream is whole: the next message arrives intact.
    std::vector<uint8_t> after(next.size());
    auto s2 = a.send(1, t, next.data(), next.size());
    auto r2 = b.recv(0, t, kFull, after.data(), after.size());
    CHECK_MSG(w.settle({r2, s2}) && done(r2) && after == next, what + ": the next message");
  };
  check(100, 40, "posted");
  check(100, 40, "unexpected");
  check(100, 0, "posted");
  check(3 * kRing + 5, kRing + 7, "posted");
  check(3 * kRing + 5, kRing + 7, "unexpected");
  check(3 * kRing + 5, kRing + 7, "claimed");
  check(3 * kRing + 5, 10, "claimed");
}

void testZeroLength() {
  World w(2);
  ucxb::Transport& a = w[0];
  ucxb::Transport& b = w[1];
  auto r = b.recv(0, tagOf(1, 0), kFull, nullptr, 0);
  auto s = a.send(1, tagOf(1, 0), nullptr, 0);
  CHECK(w.settle({r, s}));
  CHECK(done(r) && done(s) && r->receivedBytes() == 0 && r->senderTag() == tagOf(1, 0));

  // Into a larger buffer, which it leaves as it was; unexpected; between two other messages
  // of its tag, in order.
  uint8_t buf[16];
  std::memset(buf, 0xCD, sizeof buf);
  auto r2 = b.recv(0, tagOf(2, 0), kFull, buf, sizeof buf);
  auto s2 = a.send(1, tagOf(2, 0), nullptr, 0);
  CHECK(w.settle({r2, s2}) && done(r2) && r2->receivedBytes() == 0 && allAre(buf, 16, 0xCD));

  auto sx = a.send(1, tagOf(3, 0), "x", 2);
  auto s0 = a.send(1, tagOf(3, 0), nullptr, 0);
  auto sy = a.send(1, tagOf(3, 0), "yz", 3);
  CHECK(w.settle({sx, s0, sy}));
  w.spin();
  CHECK_EQ(b.probe(tagOf(3, 0), kFull), 0);
  char gx[4] = {}, g0[4] = {}, gy[4] = {};
  auto rx = b.recv(0, tagOf(3, 0), kFull, gx, sizeof gx);
  auto r0 = b.recv(0, tagOf(3, 0), kFull, g0, sizeof g0);
  auto ry = b.recv(0, tagOf(3, 0), kFull, gy, sizeof gy);
  CHECK(w.settle({rx, r0, ry}));
  CHECK(std::string(gx) == "x" && r0->receivedBytes() == 0 && std::string(gy) == "yz");
  CHECK_EQ(b.probe(tagOf(3, 0), kFull), -1);
}

// A rank's messages to itself take no ring: posted, unexpected, any-source, zero bytes, and
// in a one-rank group never connected to itself.
void testSelf() {
  World w(2);
  ucxb::Transport& a = w[0];
  char g[8] = {};
  auto r = a.recv(0, tagOf(1, 0), kFull, g, sizeof g);
  auto s = a.send(0, tagOf(1, 0), "self", 5);
  CHECK(w.settle({r, s}) && done(r) && done(s) && std::string(g) == "self");

  auto s2 = a.send(0, tagOf(2, 0), "later", 6);
  CHECK_EQ(a.probe(tagOf(2, 0), kFull), 0);
  char g2[8] = {};
  auto r2 = a.recv(kAnySource, tagOf(2, 0), kAnyMask, g2, sizeof g2);
  CHECK(w.settle({r2, s2}) && done(r2) && std::string(g2) == "later");
  CHECK_EQ(tag::source(r2->senderTag()), 0u);
  auto r3 = a.recv(0, tagOf(3, 0), kFull, nullptr, 0);
  auto s3 = a.send(0, tagOf(3, 0), nullptr, 0);
  CHECK(w.settle({r3, s3}) && done(r3) && r3->receivedBytes() == 0);

  ShmTransport solo(0, 1);
  ucxb::Transport& alone = solo;
  char g4[8] = {};
  auto s4 = alone.send(0, tagOf(4, 0), "solo", 5);
  auto r4 = alone.recv(0, tagOf(4, 0), kFull, g4, sizeof g4);
  for (int i = 0; i < 3; ++i) alone.progress();
  CHECK(done(s4) && done(r4) && std::string(g4) == "solo");
}

// ----------------------------------------------------------------------------- cancel

// Cancel, with long messages streamed (a receive mid-stream, a send behind one that streams).
void testCancel() {
  World w(2, kWide, Path::kStreamed);
  ucxb::Transport& a = w[0];
  ucxb::Transport& b = w[1];
  const size_t big = 3 * kRing + 40;
  const auto msg = pattern(big, 1);
  const auto small = pattern(500, 2);

  // A posted receive: fails in the next progress(), and the next message goes to the next
  // receive, not into its buffer.
  {
    std::vector<uint8_t> buf(64, 0xEE), buf2(small.size());
    auto r = b.recv(0, tagOf(1, 0), kFull, buf.data(), buf.size());
    r->cancel();
    CHECK(r->pending());  // settles in progress(), as ucx settles a cancel
    b.progress();
    CHECK(r->failed() && !r->truncated() && contains(r->error(), "cancelled") &&
          contains(r->error(), "rank 0"));
    auto s = a.send(1, tagOf(1, 0), small.data(), small.size());
    auto r2 = b.recv(0, tagOf(1, 0), kFull, buf2.data(), buf2.size());
    CHECK(w.settle({s, r2}) && done(r2) && buf2 == small && allAre(buf.data(), 64, 0xEE));
    r->cancel();  // settled already: nothing happens
    CHECK(r->failed());
  }

  // A receive mid-stream cannot be withdrawn: its sender's send completes once it is matched,
  // so dropping the rest lost a message the sender counts as received, and the next receive
  // took the next message in its place (until 2026-11-28). It stays pending (its owner cuts
  // the peer off: p2p_withdraw.hpp) and, nobody doing so here, takes its whole message; the
  // next message goes to the next receive.
  {
    std::vector<uint8_t> buf(big, 0xEE), buf2(small.size());
    auto r = b.recv(0, tagOf(2, 0), kFull, buf.data(), big);
    auto s = a.send(1, tagOf(2, 0), msg.data(), big);
    b.progress();
    CHECK(buf[0] == msg[0] && r->pending());
    r->cancel();
    b.progress();
    CHECK_MSG(r->pending(), "a receive that has begun to take a message stays pending");
    CHECK_EQ(r->boundPeer(), 0);
    auto s2 = a.send(1, tagOf(2, 0), small.data(), small.size());
    auto r2 = b.recv(0, tagOf(2, 0), kFull, buf2.data(), buf2.size());
    CHECK(w.settle({r, s, s2, r2}));
    CHECK(done(r) && buf == msg && done(s) && done(s2) && done(r2) && buf2 == small);
  }

  // The same for an any-source receive that claimed an unexpected message still arriving: it
  // names the sender it is tied to (boundPeer), whom its owner cuts off.
  {
    std::vector<uint8_t> buf(big), buf2(small.size());
    auto s = a.send(1, tagOf(3, 0), msg.data(), big);
    b.progress();
    auto r = b.recv(ucxb::kAnySource, tagOf(3, 0), kFull, buf.data(), big);
    r->cancel();
    b.progress();
    CHECK(r->pending() && r->boundPeer() == 0);
    auto s2 = a.send(1, tagOf(3, 0), small.data(), small.size());
    auto r2 = b.recv(0, tagOf(3, 0), kFull, buf2.data(), buf2.size());
    CHECK(w.settle({r, s, s2, r2}));
    CHECK(done(r) && buf == msg && done(r2) && buf2 == small);
  }

  // A send partly in the ring (cancelled twice): its header is out, so it cannot be withdrawn
  // (the receiver holds it, as a ucx peer holds an announced rendezvous) and stays pending;
  // its owner gives the peer up (abortPeer), which fails it, and the peer, cut off, drops the
  // part it took and fails what it waits for from this rank. A pair of its own: cut off.
  {
    World cut(2, kWide, Path::kStreamed);
    const std::string why = "the test gave up on rank 1";
    const size_t n = 3 * kRing + 11;
    std::vector<uint8_t> src(msg.begin(), msg.begin() + n);
    std::vector<uint8_t> buf(n, 0xEE);
    auto s = cut[0].send(1, tagOf(4, 0), src.data(), n);
    CHECK(s->pending());
    s->cancel();
    s->cancel();
    cut[0].progress();
    cut[1].progress();  // takes the first ring's worth: the rest waits in the sender
    CHECK_MSG(s->pending(), "a send whose header is out stays pending after a cancel");
    CHECK_EQ(cut[1].probe(tagOf(4, 0), kFull), 0);
    cut[0].abortPeer(1, why);
    CHECK(s->failed() && s->error() == why);
    std::fill(src.begin(), src.end(), 0);  // the caller may reuse its buffer now
    auto r = cut[1].recv(0, tagOf(4, 0), kFull, buf.data(), n);
    cut.spin();
    CHECK_MSG(r->failed() && contains(r->error(), "rank 0") &&
                  contains(r->error(), "cut this rank off"),
              "the cut-off peer fails the receive of the half-sent message: " + r->error());
    CHECK(contains(cut[1].peerError(0), "cut this rank off"));
    CHECK_EQ(cut[1].probe(tagOf(4, 0), kFull), -1);
  }

  // A send queued behind another, not begun: withdrawn; the receiver never sees it.
  {
    std::vector<uint8_t> buf(big);
    char g[8] = {};
    auto s1 = a.send(1, tagOf(5, 0), msg.data(), big);
    auto s2 = a.send(1, tagOf(6, 0), "gone", 5);
    auto s3 = a.send(1, tagOf(6, 0), "third", 6);
    s2->cancel();
    a.progress();
    CHECK(s2->failed() && contains(s2->error(), "cancelled"));
    auto r1 = b.recv(0, tagOf(5, 0), kFull, buf.data(), big);
    auto r3 = b.recv(0, tagOf(6, 0), kFull, g, sizeof g);
    CHECK(w.settle({s1, s3, r1, r3}));
    CHECK(done(r1) && buf == msg && done(r3) && std::string(g) == "third");
    CHECK_EQ(b.probe(tagOf(6, 0), kFull), -1);
  }
}

// ----------------------------------------------------------------------------- failures

// abortPeer fails every request to and from the peer (and pending any-source receives, naming
// any rank) with its reason, and later ones at once; other peers go on; the aborted peer's
// further bytes are taken and dropped, and the aborted peer, told that it was cut off, fails
// what it sends to this rank. Long messages stream (mid-stream both ways).
void testAbortPeer() {
  World w(3, kWide, Path::kStreamed);
  ucxb::Transport& a = w[0];
  const std::string why = "the test gave up on rank 1";
  const size_t big = 3 * kRing;
  const auto msg = pattern(big, 3);
  std::vector<uint8_t> in(big), mid(big);
  char g[8] = {}, g2[8] = {}, gany[8] = {};

  auto rFrom1 = a.recv(1, tagOf(1, 1), kFull, g, sizeof g);
  auto rAny = a.recv(kAnySource, tagOf(2, 0), kAnyMask, gany, sizeof gany);
  auto rFrom2 = a.recv(2, tagOf(3, 2), kFull, g2, sizeof g2);
  auto sTo1 = a.send(1, tagOf(4, 0), msg.data(), big);  // partly in rank 1's ring
  auto rMid = a.recv(1, tagOf(5, 1), kFull, mid.data(), big);
  auto s1 = w[1].send(0, tagOf(5, 1), msg.data(), big);
  a.progress();  // rMid is now mid-stream
  CHECK(sTo1->pending() && rMid->pending() && mid[0] == msg[0]);

  a.abortPeer(1, why);
  a.progress();
  for (const auto& r : {rFrom1, sTo1, rMid}) {
    CHECK_MSG(r->failed() && r->error() == why && !r->truncated(), r->error());
  }
  CHECK_MSG(rAny->failed() && rAny->error() == "receive from any rank failed: " + why,
            rAny->error());
  CHECK(rFrom2->pending());
  CHECK_EQ(a.peerError(1), why);
  CHECK(a.peerError(2).empty());

  auto later = a.send(1, tagOf(6, 0), "late", 5);
  auto laterRecv = a.recv(1, tagOf(7, 1), kFull, g, sizeof g);
  a.progress();
  CHECK(later->failed() && later->error() == why);
  CHECK(laterRecv->failed() && laterRecv->error() == why);

  // Rank 2 is unaffected; rank 1's sends fail once it sees that rank 0 cut it off (what it
  // wrote before is taken and dropped).
  auto s2 = w[2].send(0, tagOf(3, 2), "fine", 5);
  auto s1b = w[1].send(0, tagOf(8, 1), msg.data(), big);
  CHECK(w.settle({s1, s1b, s2, rFrom2}));
  CHECK(done(rFrom2) && std::string(g2) == "fine");
  for (const auto& r : {s1, s1b}) {
    CHECK_MSG(r->failed() && contains(r->error(), "rank 0 cut this rank off"), r->error());
  }
  CHECK(contains(w[1].peerError(0), "cut this rank off"));
  CHECK(w[1].peerError(2).empty());
  CHECK_EQ(a.probe(tagOf(8, 1), kFull), -1);
  a.abortPeer(1, "again");  // a second abort keeps the first reason
  CHECK_EQ(a.peerError(1), why);
}

// ----------------------------------------------------------------------------- sleeping

// arm() and eventFd(): a sleeper's fd turns readable when a peer sends to it, arm() refuses
// to sleep with bytes or settlements pending, and a producer blocked on a full ring is woken
// once the consumer frees room.
void testArm() {
  World w(2, kWide, Path::kStreamed);
  ucxb::Transport& a = w[0];
  ucxb::Transport& b = w[1];
  a.progress();
  b.progress();
  CHECK(b.arm());
  CHECK_MSG(!readable(b.eventFd()), "an armed idle transport has nothing to wake it");
  auto s = a.send(1, tagOf(1, 0), "ring", 5);
  CHECK_MSG(readable(b.eventFd(), 2000), "a send to an armed peer rings its doorbell");
  b.progress();
  char g[8] = {};
  auto r = b.recv(0, tagOf(1, 0), kFull, g, sizeof g);
  CHECK(done(r) && done(s) && std::string(g) == "ring");
  CHECK(b.arm());
  CHECK_MSG(!readable(b.eventFd()), "arm() took the doorbell's ring");
  b.progress();

  // Not armed: bytes in the ring make arm() refuse.
  auto s2 = a.send(1, tagOf(2, 0), "more", 5);
  CHECK_MSG(!b.arm(), "arm() with bytes in a ring");
  b.progress();
  CHECK(b.arm());
  b.progress();

  // A cancel to settle makes arm() refuse.
  auto rc = b.recv(0, tagOf(3, 0), kFull, g, sizeof g);
  rc->cancel();
  CHECK_MSG(!b.arm(), "arm() with a cancel to settle");
  b.progress();
  CHECK(rc->failed());

  // The producer of a full ring sleeps until the consumer frees room.
  const size_t big = 3 * kRing;
  const auto msg = pattern(big, 4);
  std::vector<uint8_t> buf(big);
  auto rb = b.recv(0, tagOf(4, 0), kFull, buf.data(), big);
  auto sb = a.send(1, tagOf(4, 0), msg.data(), big);
  a.progress();
  CHECK(sb->pending());
  CHECK_MSG(a.arm(), "a producer with a full ring sleeps");
  CHECK(!readable(a.eventFd()));
  b.progress();  // takes a ring's worth
  CHECK_MSG(readable(a.eventFd(), 2000), "the consumer freeing room wakes the producer");
  CHECK(w.settle({rb, sb, s2}));
  CHECK(done(rb) && buf == msg);
}

// The engine's progress thread arms and sleeps on eventFd() while an inline op's caller
// borrows the transport, calls progress() and gives it back (csrc/engine/progress_engine.h):
// the sleeper must still wake for a message that comes after that (a point-to-point receive
// that only it completes), and a ring that came while the caller drove the transport stays
// for it. Until 2026-11-28 progress() cleared the `sleeping` word and took the rings, and
// the sleeper slept through such a receive.
void testArmOutlivesProgress() {
  World w(2);
  ucxb::Transport& a = w[0];
  ucxb::Transport& b = w[1];
  a.progress();
  b.progress();
  CHECK(b.arm());
  b.progress();  // the borrower, while the thread that armed sleeps
  CHECK(!readable(b.eventFd()));
  auto s = a.send(1, tagOf(1, 0), "late", 5);
  CHECK_MSG(readable(b.eventFd(), 2000),
            "a send after arm() wakes the sleeper, though progress() ran in between");
  b.progress();  // the borrower takes the message before the sleeper runs
  CHECK_MSG(readable(b.eventFd()), "progress() leaves the doorbell's ring to the sleeper");
  char g[8] = {};
  auto r = b.recv(0, tagOf(1, 0), kFull, g, sizeof g);
  CHECK(done(r) && done(s) && std::string(g) == "late");
  CHECK(b.arm());
  CHECK_MSG(!readable(b.eventFd()), "arm() takes the rings");
  b.progress();

  // arm() takes rings that came before it: what they announced must still keep it awake.
  // A producer whose full ring the consumer emptied before the producer armed (a message of
  // a ring's length: its last 16 bytes wait for room, and no match notice comes back):
  const size_t big = kRing;
  const auto msg = pattern(big, 9);
  std::vector<uint8_t> buf(big);
  World ws(2, kWide, Path::kStreamed);
  auto rb = ws[1].recv(0, tagOf(2, 0), kFull, buf.data(), big);
  auto sb = ws[0].send(1, tagOf(2, 0), msg.data(), big);
  ws[0].progress();
  CHECK(sb->pending());
  ws[1].progress();  // frees room and rings the producer
  CHECK_MSG(!ws[0].arm() || readable(ws[0].eventFd()), "room freed before arm() keeps it awake");
  CHECK(ws.settle({rb, sb}));
  CHECK(done(rb) && buf == msg);
  // A peer that cut this rank off before it armed:
  a.progress();
  b.progress();
  a.abortPeer(1, "test");
  CHECK_MSG(!b.arm() || readable(b.eventFd()), "a peer's abandonment before arm() keeps it awake");
}

// Two threads, each driving one transport and sleeping on its event fd whenever progress()
// finds nothing: a ping-pong of messages from zero bytes to several rings. A lost wake-up
// (a sleeper that slept through a peer's bytes or freed room) shows as a poll that times out
// while arm() then finds work; the test allows none.
void testSleepers(Path path) {
  World w(2, kWide, path);
  constexpr int kRounds = 240;
  const size_t sizes[] = {0, 1, 100, kRing - 16, kRing, 3 * kRing + 7};
  std::atomic<int> stalls{0};
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0};

  auto wait = [&](ucxb::Transport& t, const RequestPtr& r) {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (r->pending() && !stop.load()) {
      if (t.progress()) continue;
      if (!t.arm()) continue;
      if (!readable(t.eventFd(), 3000)) {
        // Work found after a sleep that nothing ended: a wake-up was lost.
        const bool work = !t.arm();
        t.progress();
        if (work) {
          ++stalls;
          stop = true;
        }
      }
      if (Clock::now() > deadline) stop = true;
    }
    t.progress();  // leaves the armed state
  };
  auto side = [&](int me) {
    ucxb::Transport& t = w[me];
    const int peer = 1 - me;
    for (int i = 0; i < kRounds && !stop.load(); ++i) {
      const size_t n = sizes[size_t(i) % std::size(sizes)];
      const auto out = pattern(n, uint32_t(i * 2 + me));
      const auto expect = pattern(n, uint32_t(i * 2 + peer));
      std::vector<uint8_t> in(n + 1);
      auto r = t.recv(peer, tagOf(uint64_t(i), peer), kFull, in.data(), in.size());
      if (me == 0) {
        auto s = t.send(peer, tagOf(uint64_t(i), me), out.data(), n);
        wait(t, s);
        wait(t, r);
      } else {
        wait(t, r);
        auto s = t.send(peer, tagOf(uint64_t(i), me), out.data(), n);
        wait(t, s);
      }
      if (!done(r) || r->receivedBytes() != n || !sameBytes(in.data(), expect, n)) ++wrong;
    }
  };
  std::thread t1(side, 1);
  side(0);
  t1.join();
  CHECK_EQ(stalls.load(), 0);
  CHECK_EQ(wrong.load(), 0);
  CHECK(!stop.load());
}

// ----------------------------------------------------------------------------- a dead peer

void writeBlob(int fd, const std::vector<uint8_t>& blob) {
  const uint32_t n = static_cast<uint32_t>(blob.size());
  if (::write(fd, &n, sizeof n) != sizeof n ||
      ::write(fd, blob.data(), n) != static_cast<ssize_t>(n)) {
    std::perror("write of an address");
  }
}

std::vector<uint8_t> readBlob(int fd) {
  uint32_t n = 0;
  if (::read(fd, &n, sizeof n) != sizeof n) return {};
  std::vector<uint8_t> blob(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::read(fd, blob.data() + got, n - got);
    if (k <= 0) return {};
    got += size_t(k);
  }
  return blob;
}

// Rank 1 of a 2-rank group in a forked child: exchanges addresses with the parent over
// pipes, connects (the constructor returns once both did), waits for the parent's go (a
// byte), runs `then` and _exit()s with its status, its transport's destructor not run (as a
// crash leaves it: the parent learns of the exit from its pidfd, not of a rank leaving).
struct Child {
  pid_t pid = -1;
  int toChild = -1;
  std::unique_ptr<ShmTransport> parent;  // rank 0, connected to the child

  explicit Child(const std::function<int(ucxb::Transport&)>& then) {
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) throw std::runtime_error("pipe");
    pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork");
    if (pid == 0) {
      ::close(down[1]);
      ::close(up[0]);
      int status = 9;
      try {
        ShmTransport t(1, 2);
        writeBlob(up[1], t.localAddress());
        t.connect(0, readBlob(down[0]));
        const char connected = 1;  // the parent's sends see whether this rank reads its memory
        if (::write(up[1], &connected, 1) != 1) std::perror("write to the parent");
        char go = 0;
        if (::read(down[0], &go, 1) == 1) status = then(t);
        // Here, in t's scope: its destructor would tell the parent that rank 1 left the group.
        ::_exit(status);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child: %s\n", e.what());
      }
      ::_exit(status);
    }
    ::close(down[0]);
    ::close(up[1]);
    toChild = down[1];
    parent = std::make_unique<ShmTransport>(0, 2);
    const auto childAddress = readBlob(up[0]);
    writeBlob(toChild, parent->localAddress());
    parent->connect(1, childAddress);
    char connected = 0;
    if (::read(up[0], &connected, 1) != 1) std::fprintf(stderr, "the child did not connect\n");
    ::close(up[0]);
  }
  void go() {
    const char byte = 1;
    if (::write(toChild, &byte, 1) != 1) std::perror("write to the child");
  }
  // The child's exit status; -1 if it did not exit within the deadline (then it is killed).
  int reap(double seconds = 10.0) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    int status = 0;
    for (;;) {
      const pid_t got = ::waitpid(pid, &status, WNOHANG);
      if (got == pid) break;
      if (Clock::now() >= deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        pid = -1;
        return -1;
      }
      ::usleep(1000);
    }
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (toChild >= 0) ::close(toChild);
  }
};

// The child sends two messages (the first to a posted receive, the second unexpected) and
// exits. The parent, which took neither before the exit, still receives both; what else it
// waits for from or to the child fails naming the rank and its exit, within a bounded time,
// and the parent sleeps again afterwards (the dead peer's pidfd leaves the sleep set).
void testDeadPeer() {
  const auto first = pattern(1000, 5);
  Child child([&](ucxb::Transport& t) {
    auto s1 = t.send(0, tagOf(1, 1), first.data(), first.size());
    auto s2 = t.send(0, tagOf(2, 1), "late", 5);
    return done(s1) && done(s2) ? 0 : 3;  // small: in the parent's ring at once
  });
  ucxb::Transport& t = *child.parent;
  std::vector<uint8_t> got(first.size());
  char never[8] = {}, any[8] = {};
  auto r1 = t.recv(1, tagOf(1, 1), kFull, got.data(), got.size());
  auto rNever = t.recv(1, tagOf(3, 1), kFull, never, sizeof never);
  auto rAny = t.recv(kAnySource, tagOf(4, 0), kAnyMask, any, sizeof any);
  const auto big = pattern(3 * ringBytes(2), 6);
  auto sTo = t.send(1, tagOf(5, 0), big.data(), big.size());  // the child never reads it
  t.progress();
  // Asleep when the child sends and exits: the progress() after the wake looks at the
  // peers before the rings, so the child's bytes are taken by the drain before the failure.
  CHECK(t.arm());
  child.go();
  CHECK_EQ(child.reap(), 0);
  CHECK_MSG(r1->pending(), "the parent has not taken the message before the exit");
  const auto exited = Clock::now();
  bool progressed = false;
  while (rNever->pending() && ucxb::check::wallMs(exited) < 5000) {
    if (t.progress()) {
      progressed = true;
      continue;
    }
    if (t.arm()) readable(t.eventFd(), 100);
  }
  CHECK_MSG(ucxb::check::wallMs(exited) < 2000,
            "the failure is seen within 2 s (" + std::to_string(ucxb::check::wallMs(exited)) + " ms)");
  CHECK_MSG(progressed, "progress() says it did something when it failed the peer");
  CHECK_MSG(done(r1) && got == first, "what the peer wrote before it exited is received: " +
                                          r1->error());
  for (const auto& r : {rNever, rAny, sTo}) {
    CHECK_MSG(r->failed() && contains(r->error(), "rank 1") && contains(r->error(), "exited"),
              r->error());
  }
  CHECK(contains(t.peerError(1), "exited"));
  char late[8] = {};
  auto rLate = t.recv(1, tagOf(2, 1), kFull, late, sizeof late);
  auto rAfter = t.recv(1, tagOf(6, 1), kFull, late, sizeof late);
  auto sAfter = t.send(1, tagOf(7, 0), "x", 2);
  t.progress();
  CHECK_MSG(done(rLate) && std::string(late) == "late",
            "an unexpected message of the dead peer is still taken");
  CHECK(rAfter->failed() && contains(rAfter->error(), "exited"));
  CHECK(sAfter->failed() && contains(sAfter->error(), "exited"));
  t.progress();
  CHECK(t.arm());
  CHECK_MSG(!readable(t.eventFd(), 50), "a dead peer does not keep the event fd readable");
  t.progress();
}

// `address` with its line `index` (from 0) replaced by `value` (shm_transport.cpp,
// packAddress: 3 the pid, 8 the inode of its pidfds).
std::vector<uint8_t> withLine(const std::vector<uint8_t>& address, int index,
                              const std::string& value) {
  std::istringstream in(std::string(address.begin(), address.end()));
  std::string line, out;
  for (int i = 0; std::getline(in, line); ++i) {
    out += (i ? "\n" : "") + (i == index ? value : line);
  }
  return {out.begin(), out.end()};
}

// An address whose pid names a live process other than the one that wrote it, as when its
// writer exited during the group's creation and the pid went to another process before this
// rank opened its pidfd: connect() fails the peer as exited, naming the rank and the pid,
// instead of watching that other process (whose pidfd would never report the writer's
// death: the group would wait out the op's timeout). Checked by the inode of the writer's
// pidfds where pidfds live in pidfs, else (an address without one) by the start time in its
// inbox's name; an address of a live writer passes either way.
void testReusedPid() {
  // A live process that is not rank 1: a child that waits to be killed, forked a few clock
  // ticks (10 ms) after this process started, so that its start time differs.
  ::usleep(30000);
  const pid_t other = ::fork();
  if (other == 0) {
    for (;;) ::pause();
  }
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{other};
  ShmTransport writer(1, kWide);
  const auto address = writer.localAddress();
  const std::string pid = std::to_string(other);
  int rank = 2;
  for (const bool byInode : {true, false}) {
    const std::string how = byInode ? "by the pidfd's inode: " : "by the start time: ";
    const auto own = byInode ? address : withLine(address, 8, "0");
    {
      ShmTransport t(rank++, kWide);
      t.connect(1, own);
      CHECK_MSG(t.peerError(1).empty(), how + "the writer's own address: " + t.peerError(1));
    }
    ShmTransport t(rank++, kWide);
    t.connect(1, withLine(own, 3, pid));
    const std::string error = t.peerError(1);
    CHECK_MSG(contains(error, "rank 1 (pid " + pid + ") exited") &&
                  contains(error, "names another process"),
              how + "a pid that names another process fails the peer: " +
                  (error.empty() ? std::string("watched") : error));
    char got[4] = {};
    auto r = static_cast<ucxb::Transport&>(t).recv(1, tagOf(1, 1), kFull, got, sizeof got);
    t.progress();
    CHECK_MSG(r->failed() && contains(r->error(), "exited"), how + r->error());
  }
}

// A peer that destroyed its transport before this rank connected (its inbox's name is gone
// with it) is failed as one that left, naming it; connect() does not throw, so the creation
// goes on, and a receive from it fails with that reason.
void testLeftBeforeConnect() {
  std::vector<uint8_t> address;
  {
    ShmTransport gone(1, kWide);
    address = gone.localAddress();
  }
  ShmTransport t(2, kWide);
  bool threw = false;
  try {
    t.connect(1, address);
  } catch (const ucxb::TransportError& e) {
    threw = true;
    CHECK_MSG(false, std::string("connect threw: ") + e.what());
  }
  CHECK(!threw);
  const std::string error = t.peerError(1);
  CHECK_MSG(contains(error, "rank 1 (pid ") && contains(error, "left the group before"),
            error.empty() ? std::string("not failed") : error);
  char got[4] = {};
  auto r = static_cast<ucxb::Transport&>(t).recv(1, tagOf(1, 1), kFull, got, sizeof got);
  t.progress();
  CHECK_MSG(r->failed() && contains(r->error(), "left the group"), r->error());
}

// Long messages between two processes go by reference, each way (process_vm_readv across
// processes: a byte the sender changes after send() arrives changed); and one the child sent
// that the parent had not read when the child exited fails the parent's receive, naming the
// exit, instead of reading a process that is gone.
void testByReferenceAcrossProcesses() {
  const size_t n = 3 * ringBytes(2) + 9;
  auto down = pattern(n, 31);
  down[0] ^= 0xFF;  // what the child expects: the parent changes it after send()
  const auto up = pattern(n, 32);
  {
    Child child([&](ucxb::Transport& t) {
      std::vector<uint8_t> in(n);
      auto r = t.recv(0, tagOf(1, 0), kFull, in.data(), n);
      auto s = t.send(0, tagOf(2, 1), up.data(), n);
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while ((r->pending() || s->pending()) && Clock::now() < deadline) t.progress();
      if (!done(r) || !done(s)) return 3;
      return in == down ? 0 : 4;
    });
    ucxb::Transport& t = *child.parent;
    auto src = pattern(n, 31);
    std::vector<uint8_t> in(n);
    auto s = t.send(1, tagOf(1, 0), src.data(), n);
    auto r = t.recv(1, tagOf(2, 1), kFull, in.data(), n);
    src[0] ^= 0xFF;
    child.go();
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while ((r->pending() || s->pending()) && Clock::now() < deadline) t.progress();
    CHECK_MSG(done(r) && in == up, "the child's long message: " + r->error());
    CHECK_MSG(done(s), "the long send to the child completes once it read it: " + s->error());
    CHECK_MSG(child.reap() == 0, "the child read the parent's buffer as it was at its receive");
  }
  {
    Child child([&](ucxb::Transport& t) {
      auto s = t.send(0, tagOf(3, 1), up.data(), n);
      t.progress();
      return s->pending() ? 0 : 3;  // exits with the send unread
    });
    ucxb::Transport& t = *child.parent;
    child.go();
    CHECK_EQ(child.reap(), 0);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (t.peerError(1).empty() && Clock::now() < deadline) t.progress();
    std::vector<uint8_t> in(n, 0xEE);
    auto r = t.recv(1, tagOf(3, 1), kFull, in.data(), n);
    t.progress();
    CHECK_MSG(r->failed() && contains(r->error(), "rank 1") && contains(r->error(), "exited"),
              "an exited sender's unread long message is not read: " + r->error());
  }
}

// A sleeping rank is woken by its peer's exit alone (no message), and a peer that was aborted
// first and exits later does not keep waking it either.
void testPeerExitWakes() {
  {
    Child child([](ucxb::Transport&) { return 0; });
    ucxb::Transport& t = *child.parent;
    char g[8] = {};
    auto r = t.recv(1, tagOf(1, 1), kFull, g, sizeof g);
    t.progress();
    CHECK(t.arm());
    child.go();
    CHECK_MSG(readable(t.eventFd(), 5000), "the peer's exit wakes a sleeper");
    t.progress();
    CHECK(r->failed() && contains(r->error(), "exited"));
    CHECK_EQ(child.reap(), 0);
  }
  {
    Child child([](ucxb::Transport&) { return 0; });
    ucxb::Transport& t = *child.parent;
    t.abortPeer(1, "given up");
    t.progress();
    child.go();
    CHECK_EQ(child.reap(), 0);
    t.progress();
    CHECK(t.arm());
    CHECK_MSG(!readable(t.eventFd(), 50),
              "an aborted peer's later exit does not keep the event fd readable");
    t.progress();
    CHECK_EQ(t.peerError(1), "given up");
  }
}

// ----------------------------------------------------------------------------- teardown

// A rank forked after creation (a DataLoader worker) whose child destroys its copy of the
// transport: the rings, the flags in the peers' inboxes and the epoll set are the parent's, so
// the peers must not read that as the parent leaving the group, and the parent's traffic goes
// on.
void testForkedChildDestroys() {
  World w(2, kWide, Path::kStreamed);
  const pid_t pid = ::fork();
  if (pid == 0) {
    w.t[0].reset();
    ::_exit(0);
  }
  CHECK(pid > 0);
  int status = 0;
  CHECK(::waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  w.spin();
  CHECK_MSG(w[1].peerError(0).empty(), "the child's destruction is not the parent's: " +
                                           w[1].peerError(0));
  const size_t big = 3 * kRing;
  const auto msg = pattern(big, 31);
  std::vector<uint8_t> in(big);
  auto r = w[1].recv(0, tagOf(1, 0), kFull, in.data(), big);
  auto s = w[0].send(1, tagOf(1, 0), msg.data(), big);
  CHECK_MSG(w.settle({r, s}) && done(r) && done(s) && sameBytes(in.data(), msg, big),
            "the parent's traffic goes on: " + r->error() + " / " + s->error());
}

// Destroying a transport fails whatever it still holds (posted, mid-stream, queued, streaming
// out, about to settle) within the bounded flush, runs their callbacks once, and a request
// cancelled after its transport is gone is harmless.
void testDestroy() {
  World w(2, kWide, Path::kStreamed);
  const size_t big = 3 * kRing;
  const auto msg = pattern(big, 8);
  std::vector<uint8_t> mid(big), never(16);
  std::vector<RequestPtr> held;
  int callbacks = 0;
  {
    ucxb::Transport& a = w[0];
    ucxb::Transport& b = w[1];
    auto finished = b.send(0, tagOf(9, 1), "done", 5);
    char fin[8] = {};
    auto finishedRecv = a.recv(1, tagOf(9, 1), kFull, fin, sizeof fin);
    CHECK(w.settle({finished, finishedRecv}));
    held.push_back(finishedRecv);

    auto rMid = a.recv(1, tagOf(1, 1), kFull, mid.data(), big);
    auto sFromB = b.send(0, tagOf(1, 1), msg.data(), big);
    auto rPosted = a.recv(1, tagOf(2, 1), kFull, never.data(), never.size());
    auto rAny = a.recv(kAnySource, tagOf(3, 0), kAnyMask, never.data(), never.size());
    auto sOut = a.send(1, tagOf(4, 0), msg.data(), big);
    auto sQueued = a.send(1, tagOf(5, 0), "queued", 7);
    auto rCancelled = a.recv(1, tagOf(6, 1), kFull, never.data(), never.size());
    a.progress();
    CHECK(rMid->pending() && sOut->pending() && sFromB->pending());
    rCancelled->cancel();
    for (const auto& r : {rMid, rPosted, rAny, sOut, sQueued, rCancelled}) {
      r->onComplete([&](ucxb::Request&) { ++callbacks; });
      held.push_back(r);
    }
    held.push_back(sFromB);
  }
  const auto t0 = Clock::now();
  w.t[0].reset();
  CHECK_MSG(ucxb::check::wallMs(t0) < 3000, "destruction is bounded (" +
                                          std::to_string(ucxb::check::wallMs(t0)) + " ms)");
  CHECK_EQ(callbacks, 6);
  for (size_t i = 1; i < 7; ++i) {
    const auto& r = held[i];
    CHECK_MSG(r->failed() && (contains(r->error(), "shut down") || contains(r->error(), "cancelled")),
              r->error());
  }
  CHECK(held[6]->failed() && contains(held[6]->error(), "cancelled"));
  for (const auto& r : held) r->cancel();  // the transport is gone: harmless
  CHECK(done(held[0]));
  // The other rank goes too; its send into the gone rank's inbox fails within the flush.
  w.t[1].reset();
  CHECK(held.back()->failed());
  held.back()->cancel();
}

// ----------------------------------------------------------------------------- ring pages

// Bytes of /dev/shm the object behind `fd` holds.
size_t allocatedBytes(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<size_t>(st.st_blocks) * 512 : SIZE_MAX;
}

// A receiver reserves only its inbox's header; each sender populates its own ring a step at a
// time before writing there (InboxHeader::sendersPopulate), so a group's first small message
// does not pay for the whole inbox (1 MiB zeroed per rank before).
void testSendersPopulate() {
  using ucxb::shm::InboxLayout;
  constexpr int kRanks = 8;  // 128 KiB rings: several steps
  ShmTransport ra(0, kRanks), rb(1, kRanks);
  ucxb::Transport& a = ra;
  ucxb::Transport& b = rb;
  // Opened before connect(): the last peer to map an inbox removes its name.
  const int fd = ::shm_open(inboxName(a.localAddress()).c_str(), O_RDONLY, 0);
  CHECK(fd >= 0);
  const size_t header = InboxLayout::ringsOffset(kRanks);
  CHECK_MSG(allocatedBytes(fd) == header, "the receiver reserves its header only (holds " +
                                              std::to_string(allocatedBytes(fd)) + " bytes)");
  for (int q = 0; q < 2; ++q) {
    a.connect(q, (q == 0 ? a : b).localAddress());
    b.connect(q, (q == 0 ? a : b).localAddress());
  }
  CHECK_EQ(allocatedBytes(fd), header);
  uint64_t sent = 42, got = 0;
  auto r = a.recv(1, tagOf(1, 1), kFull, &got, sizeof got);
  auto s = b.send(0, tagOf(1, 1), &sent, sizeof sent);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((r->pending() || s->pending()) && Clock::now() < deadline) {
    a.progress();
    b.progress();
  }
  CHECK(done(r) && done(s) && got == 42);
  CHECK_MSG(allocatedBytes(fd) == header + ucxb::shm::kPopulateStep,
            "an 8-byte message populates one step of its sender's ring (the inbox holds " +
                std::to_string(allocatedBytes(fd)) + " bytes)");
  ::close(fd);
}

// A ring's first bytes need not start on a page (rings are 4 KiB-aligned; arm64 kernels have
// 16 or 64 KiB pages): the span a sender populates starts on one anyway, since madvise takes
// no other address, and covers the bytes asked for. Checked against this kernel with a ring
// half a page into a segment, where madvise at the ring's own address fails (EINVAL).
void testPopulateSpan() {
  using ucxb::shm::populateSpan;
  for (const size_t page : {size_t{4096}, size_t{16384}, size_t{65536}}) {
    for (const size_t ring : {size_t{4096}, size_t{4096} + 3 * (size_t{128} << 10)}) {
      for (const auto& [from, upTo] : {std::pair<size_t, size_t>{0, 16384},
                                       {16384, 32768},
                                       {40960, 131072}}) {
        const auto span = populateSpan(ring, from, upTo, page);
        const std::string what = "page " + std::to_string(page) + ", ring at " +
                                 std::to_string(ring) + ", bytes " + std::to_string(from) +
                                 ".." + std::to_string(upTo);
        CHECK_MSG(span.offset % page == 0, what + ": starts on a page");
        CHECK_MSG(span.offset <= ring + from, what + ": starts at or before the bytes");
        CHECK_MSG(span.offset + span.length == ring + upTo, what + ": ends with them");
      }
    }
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const int fd = ::memfd_create("populate_span", MFD_CLOEXEC);
  CHECK(fd >= 0 && ::ftruncate(fd, static_cast<off_t>(4 * page)) == 0);
  auto* base = static_cast<uint8_t*>(
      ::mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  CHECK(base != MAP_FAILED);
  const size_t ring = page / 2;
  CHECK_MSG(::madvise(base + ring, page, MADV_POPULATE_WRITE) != 0 && errno == EINVAL,
            "this kernel refuses to populate from inside a page");
  const auto span = populateSpan(ring, 0, 2 * page, page);
  CHECK_MSG(::madvise(base + span.offset, span.length, MADV_POPULATE_WRITE) == 0,
            std::string("the span populates: ") + std::strerror(errno));
  CHECK_EQ(allocatedBytes(fd), 3 * page);
  ::munmap(base, 4 * page);
  ::close(fd);
}

// Where /dev/shm fills up after the group's creation, a send whose ring pages cannot be
// populated fails the peer with an error that says so, instead of its write dying of SIGBUS,
// and the peer's receive from it fails at once too, naming it and why.
// In a child with a mount namespace of its own and a small tmpfs on /dev/shm (root only;
// elsewhere the check is skipped).
void testFullDevShm() {
  const pid_t child = ::fork();
  if (child == 0) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=24m") != 0) {
      ::_exit(77);  // no privilege for a tmpfs of our own: nothing to check here
    }
    int failures = 0;
    {
      ShmTransport ra(0, 8), rb(1, 8);  // the creation checks room for 8 inboxes: 8 MiB
      ucxb::Transport& a = ra;
      ucxb::Transport& b = rb;
      for (int q = 0; q < 2; ++q) {
        a.connect(q, (q == 0 ? a : b).localAddress());
        b.connect(q, (q == 0 ? a : b).localAddress());
      }
      // Fill what is left.
      const int fill = ::open("/dev/shm/fill", O_RDWR | O_CREAT, 0600);
      for (off_t off = 0; fill >= 0 && ::posix_fallocate(fill, off, 4096) == 0; off += 4096) {
      }
      std::vector<uint8_t> msg(64 << 10, 7), in(64 << 10);
      auto r = a.recv(1, tagOf(2, 1), kFull, in.data(), in.size());
      auto s = b.send(0, tagOf(2, 1), msg.data(), msg.size());
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (s->pending() && Clock::now() < deadline) {
        a.progress();
        b.progress();
      }
      if (!s->failed() || !contains(s->error(), "is /dev/shm full?")) {
        std::fprintf(stderr, "FAILED: the send into a full /dev/shm: %s\n",
                     s->failed() ? s->error().c_str() : "did not fail");
        ++failures;
      }
      // The receiver learns of it too, at once, naming the sender: nothing of rank 1 can
      // reach it any more, and its receive would otherwise wait out the op's timeout.
      const auto told = Clock::now() + std::chrono::seconds(5);
      while (r->pending() && Clock::now() < told) {
        a.progress();
        b.progress();
      }
      if (!r->failed() || !contains(r->error(), "rank 1") ||
          !contains(r->error(), "/dev/shm")) {
        std::fprintf(stderr, "FAILED: the receive from the sender that could not write: %s\n",
                     r->failed() ? r->error().c_str() : "still pending after 5 s");
        ++failures;
      }
      r->cancel();
    }
    ::_exit(failures == 0 ? 0 : 1);
  }
  int status = 0;
  CHECK(::waitpid(child, &status, 0) == child);
  CHECK_MSG(WIFEXITED(status), "the child died of signal " +
                                   std::to_string(WIFSIGNALED(status) ? WTERMSIG(status) : 0));
  CHECK_MSG(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 77),
            "exit status " + std::to_string(WEXITSTATUS(status)));
}

const ucxb::check::Group kGroups[] = {
    {"senders_populate", testSendersPopulate, true},
    {"full_dev_shm", testFullDevShm, true},
    {"populate_span", testPopulateSpan, true},
    {"matching", testMatching, true},
    {"any_source", testAnySource, true},
    {"fifo", [] { testFifo(Path::kByReference); }, true},
    {"fifo_streamed", [] { testFifo(Path::kStreamed); }, true},
    {"large", testLarge, true},
    {"large_messages", testLargeMessages, true},
    {"by_reference", testByReference, true},
    {"by_reference_given_up", testByReferenceGivenUp, true},
    {"streamed", testStreamed, true},
    {"streamed_given_up", testStreamedGivenUp, true},
    {"notice_behind_own_message", testNoticeBehindOwnMessage, true},
    {"notice_unread", testNoticeUnread, true},
    {"truncation", [] { testTruncation(Path::kByReference); }, true},
    {"truncation_streamed", [] { testTruncation(Path::kStreamed); }, true},
    {"zero_length", testZeroLength, true},
    {"self", testSelf, true},
    {"cancel", testCancel, true},
    {"abort_peer", testAbortPeer, true},
    {"arm", testArm, true},
    {"arm_outlives_progress", testArmOutlivesProgress, true},
    {"sleepers", [] { testSleepers(Path::kByReference); }, true},
    {"sleepers_streamed", [] { testSleepers(Path::kStreamed); }, true},
    {"dead_peer", testDeadPeer, true},
    {"reused_pid", testReusedPid, true},
    {"left_before_connect", testLeftBeforeConnect, true},
    {"peer_exit_wakes", testPeerExitWakes, true},
    {"forked_child_destroys", testForkedChildDestroys, true},
    {"by_reference_across_processes", testByReferenceAcrossProcesses, true},
    {"destroy", testDestroy, true},
};

}  // namespace

int main(int argc, char** argv) {
  return ucxb::check::runGroups("shm_transport_test", kGroups, argc, argv);
}
