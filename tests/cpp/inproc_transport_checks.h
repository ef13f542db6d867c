// Checks of the in-memory transport itself (tests/cpp/inproc/), so the algorithm results that
// rest on it can be trusted: tag and any-source matching, FIFO order, rendezvous completion,
// truncation, cancellation, abortPeer, the event fd, and Comm's errors over it. Part of
// algorithms_test (groups inproc_transport and comm_errors).
#pragma once

#include <poll.h>

#include <string>
#include <vector>

#include "csrc/collectives/comm.h"
#include "tests/cpp/check.h"
#include "tests/cpp/inproc/thread_world.h"
#include "transports/tag.h"

namespace ucxb::inproc_checks {

inline Tag tagOf(uint32_t step, uint32_t src) { return tag::collective(1, 1, step, src); }

inline bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

// One thread drives all three transports here: each is still used by one thread at a time.
inline void testInprocTransport() {
  inproc::Fabric fabric(3);
  auto t0 = fabric.transport(0);
  auto t1 = fabric.transport(1);
  auto t2 = fabric.transport(2);
  CHECK_EQ(t1->rank(), 1);
  CHECK_EQ(t1->size(), 3);
  t0->connect(1, t1->localAddress());
  CHECK_THROWS(t0->connect(2, t1->localAddress()), TransportError, "another rank");

  // Tag matching: the receive takes the message whose tag it names, not the earlier one.
  char a[4] = "aaa", b[4] = "bbb", got[4] = {};
  auto sb = t0->send(1, tagOf(2, 0), b, 4);
  auto sa = t0->send(1, tagOf(1, 0), a, 4);
  auto ra = t1->recv(0, tagOf(1, 0), tag::kFullMask, got, 4);
  CHECK(t0->progress() == false && sa->pending());  // a rendezvous: nobody received yet
  CHECK(t1->progress());
  CHECK(!ra->pending() && !ra->failed() && std::string(got) == "aaa");
  CHECK_EQ(ra->receivedBytes(), size_t{4});
  CHECK_EQ(ra->senderTag(), tagOf(1, 0));
  CHECK(sa->pending());  // completes only in its owner's progress()
  CHECK(t0->progress() && !sa->pending() && !sa->failed() && sb->pending());

  // Any source: the mask leaves out the source bits; the sender's tag says who sent it.
  char c[4] = "ccc";
  auto sc = t2->send(1, tagOf(2, 2), c, 4);
  auto any = t1->recv(kAnySource, tagOf(2, 2), tag::kAnySourceMask, got, 4);
  t1->progress();
  // rank 0's "bbb" (step 2 from rank 0) came first and matches the wildcard too.
  CHECK(!any->pending() && std::string(got) == "bbb" && tag::source(any->senderTag()) == 0);
  auto any2 = t1->recv(kAnySource, tagOf(2, 0), tag::kAnySourceMask, got, 4);
  t1->progress();
  CHECK(!any2->pending() && std::string(got) == "ccc" && tag::source(any2->senderTag()) == 2);

  // FIFO among messages with one tag; a short message completes with its own length.
  char x[2] = "x", y[3] = "yy", first[8] = {}, second[8] = {};
  t0->send(1, tagOf(5, 0), x, 2);
  t0->send(1, tagOf(5, 0), y, 3);
  auto r1 = t1->recv(0, tagOf(5, 0), tag::kFullMask, first, 8);
  auto r2 = t1->recv(0, tagOf(5, 0), tag::kFullMask, second, 8);
  t1->progress();
  CHECK(std::string(first) == "x" && std::string(second) == "yy");
  CHECK_EQ(r1->receivedBytes(), size_t{2});

  // Truncation fails the receive and completes the send.
  char big[8] = "1234567", small[4] = {};
  auto sbig = t0->send(1, tagOf(6, 0), big, 8);
  auto rsmall = t1->recv(0, tagOf(6, 0), tag::kFullMask, small, 4);
  t1->progress();
  t0->progress();
  CHECK(rsmall->failed() && check::contains(rsmall->error(), "truncated"));
  CHECK(!sbig->pending() && !sbig->failed());

  // Cancel: an unmatched send is withdrawn (a later receive does not see it); a receive fails.
  auto sCancel = t0->send(1, tagOf(7, 0), big, 8);
  sCancel->cancel();
  t0->progress();
  CHECK(sCancel->failed() && check::contains(sCancel->error(), "cancelled"));
  auto rLate = t1->recv(0, tagOf(7, 0), tag::kFullMask, small, 8);
  t1->progress();
  CHECK(rLate->pending());
  rLate->cancel();
  t1->progress();
  CHECK(rLate->failed());

  // The event fd: readable after a peer's send; arm() refuses to sleep on unseen events.
  t1->progress();
  CHECK(t1->arm());
  CHECK(!readable(t1->eventFd()));
  auto sWake = t2->send(1, tagOf(8, 2), c, 4);
  CHECK(readable(t1->eventFd()));
  CHECK(!t1->arm());  // the event came after the last progress(): progress first

  // abortPeer: every outstanding request with the peer fails now; the peer learns of it.
  auto pendingSend = t0->send(2, tagOf(9, 0), big, 8);
  auto pendingRecv = t0->recv(2, tagOf(9, 2), tag::kFullMask, small, 4);
  auto peersRecv = t2->recv(0, tagOf(10, 0), tag::kFullMask, small, 4);
  t0->abortPeer(2, "test abort");
  CHECK(pendingSend->failed() && pendingRecv->failed());
  CHECK_EQ(t0->peerError(2), std::string("test abort"));
  t2->progress();
  CHECK(peersRecv->failed() && check::contains(peersRecv->error(), "test abort"));
  auto afterwards = t2->send(0, tagOf(11, 2), c, 4);
  CHECK(afterwards->failed());
  CHECK(t0->peerError(1).empty());
  (void)sWake;
}

// Comm's own errors over the in-memory transport: a missing peer times out naming what is
// still outstanding; ranks that disagree on a message's size fail instead of corrupting.
inline void testCommErrors() {
  inproc::WorldOptions options;
  options.size = 2;
  options.opTimeout = std::chrono::milliseconds(100);
  inproc::ThreadWorld world(options);
  const std::string timeout = world.run([](Comm& c) -> std::string {
    char buf[4];
    if (c.rank() == 0) c.wait({c.recv(1, 0, buf, 4)});
    return "";
  });
  CHECK_MSG(check::contains(timeout, "rank 0: threw: no progress before the timeout") &&
                check::contains(timeout, "receive of 4 bytes from rank 1"),
            timeout);
  inproc::ThreadWorld world2(options);
  const std::string mismatch = world2.run([](Comm& c) -> std::string {
    char buf[16] = {};
    if (c.rank() == 0) c.wait({c.send(1, 0, buf, 8)});
    if (c.rank() == 1) c.wait({c.recv(0, 0, buf, 16)});
    return "";
  });
  CHECK_MSG(check::contains(mismatch, "expected 16 bytes from rank 0 but received 8"), mismatch);
}

}  // namespace ucxb::inproc_checks
