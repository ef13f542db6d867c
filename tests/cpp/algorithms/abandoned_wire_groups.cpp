// A tripwire (Comm::tripwire) that its op gives up but that goes on to catch a message: UCX
// cannot cancel a receive already matched to an eager message whose last fragments are still
// arriving, so the wire settles in a later progress(), after its Comm is gone. Its callback
// writes into the Comm, so it must not run then: a heap corruption on rank 0 of a 3-rank
// straddle case of tests/test_failure_model.py until 2026-11-27 ("munmap_chunk(): invalid
// pointer"), and a heap-use-after-free under AddressSanitizer (tests/test_algorithms_asan.py).
// The same fact for a receive's buffer: a receive given up that the transport cannot stop
// goes on writing into it, so memory the op's caller frees as the op ends (the backend's
// contiguous copies of strided tensors, its packed buffers: Comm::keep) must stay with the
// request; until 2026-11-27 the writes went into freed memory.
// Here a transport of held receives plays UCX's part, with no threads: the test settles each
// receive by hand.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "csrc/collectives/comm.h"
#include "tests/cpp/algorithms/groups.h"
#include "tests/cpp/check.h"

namespace ucxb::algotest {

namespace {

// A receive that cancel() cannot stop; the test delivers a message too long for it, or one
// that fits, written into its buffer as UCX writes an eager message's last fragments.
class HeldReceive final : public Request {
 public:
  HeldReceive(int peer, void* data, size_t bytes)
      : Request(/*isSend=*/false, peer, bytes), data_(static_cast<uint8_t*>(data)) {}
  void cancel() override {}
  void deliverTooLong() { failTruncated("message truncated"); }
  void deliver(uint8_t fill) {
    std::memset(data_, fill, postedBytes());
    complete(postedBytes(), 0);
  }

 private:
  uint8_t* data_;
};

// Two ranks, this one rank 0; it only receives, and keeps every receive for the test.
class HeldReceives final : public Transport {
 public:
  std::string name() const override { return "held"; }
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::vector<uint8_t> localAddress() const override { return {}; }
  void connect(int, const std::vector<uint8_t>&) override {}
  RequestPtr send(int, Tag, const void*, size_t, MemoryType) override {
    throw TransportError("held: this test sends nothing");
  }
  RequestPtr recv(int peer, Tag, Tag, void* data, size_t bytes, MemoryType) override {
    received.push_back(std::make_shared<HeldReceive>(peer, data, bytes));
    return received.back();
  }
  bool progress() override { return false; }
  bool arm() override { return true; }
  int eventFd() const override { return -1; }
  std::string peerError(int) const override { return ""; }
  void abortPeer(int, const std::string&) override {}

  std::vector<std::shared_ptr<HeldReceive>> received;
};

// Gives requests up by cancelling them, as the drivers do; never waits.
class CancellingDriver final : public OpDriver {
 public:
  void waitAll(const std::vector<RequestPtr>&, Clock::time_point) override {
    throw OpFailed("this test waits for nothing");
  }
  void abandon(const std::vector<RequestPtr>& requests) override {
    for (const auto& r : requests) r->cancel();
  }
  uint8_t* scratch(size_t bytes) override {
    scratch_.resize(bytes);
    return scratch_.data();
  }
  StagingArea* staging() const override { return nullptr; }

 private:
  std::vector<uint8_t> scratch_;
};

}  // namespace

void testAbandonedWireOutlivesItsComm() {
  HeldReceives transport;
  CancellingDriver driver;
  const algo::Tuning tuning;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  int asked = 0;  // calls of the wires' `why`: a caught message that tripped its Comm
  auto why = [&asked](const Request&) {
    ++asked;
    return std::string("tripped");
  };

  // Left pending as its op ends: the Comm's destructor gives it up.
  auto comm = std::make_unique<Comm>(transport, driver, 1, 1, deadline, tuning);
  comm->tripwire(1, 0, nullptr, 0, why);
  comm.reset();
  CHECK_EQ(transport.received.size(), size_t{1});
  CHECK(transport.received[0]->pending());
  transport.received[0]->deliverTooLong();
  CHECK_MSG(asked == 0, "a wire whose Comm is gone tripped it");

  // Given up by its op (Comm::abandon) while the Comm lives on: it trips nothing later.
  Comm alive(transport, driver, 1, 2, deadline, tuning);
  RequestPtr wire = alive.tripwire(1, 0, nullptr, 0, why);
  alive.abandon({wire});
  transport.received.back()->deliverTooLong();
  CHECK_MSG(asked == 0, "a wire given up tripped its Comm");
  CHECK_EQ(alive.trippedBy(), -1);

  // The control: a wire still armed trips its Comm on the same message.
  RequestPtr armed = alive.tripwire(1, 1, nullptr, 0, why);
  transport.received.back()->deliverTooLong();
  CHECK_EQ(asked, 1);
  CHECK_EQ(alive.trippedBy(), 1);
}

void testAbandonedReceiveKeepsItsBuffer() {
  HeldReceives transport;
  CancellingDriver driver;
  const algo::Tuning tuning;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  constexpr size_t kBytes = 4096;

  // An op that fails with a receive posted into a buffer of its own (the backend's contiguous
  // copy of a strided tensor): the op's frame frees its reference as the exception leaves it,
  // then the Comm gives the receive up, and the transport cannot stop it.
  auto buffer = std::make_shared<std::vector<uint8_t>>(kBytes, 0);
  const std::weak_ptr<std::vector<uint8_t>> watch = buffer;
  auto comm = std::make_unique<Comm>(transport, driver, 1, 3, deadline, tuning);
  comm->keep(buffer);
  comm->recv(1, 0, buffer->data(), kBytes);
  buffer.reset();
  comm.reset();
  CHECK_EQ(transport.received.size(), size_t{1});
  CHECK(transport.received[0]->pending());
  CHECK_MSG(!watch.expired(), "a receive still pending lost the buffer it writes into");
  // The rest of the message arrives: into memory the request still holds (under
  // AddressSanitizer, a heap-use-after-free without it).
  transport.received[0]->deliver(0xab);
  if (auto held = watch.lock()) CHECK_EQ((*held)[kBytes - 1], uint8_t{0xab});
  // Settled and let go by the transport: the buffer goes with the request.
  transport.received.clear();
  CHECK_MSG(watch.expired(), "the buffer outlived the request that held it");

  // An op whose receives all completed keeps nothing once its Comm is gone.
  auto done = std::make_shared<std::vector<uint8_t>>(kBytes, 0);
  const std::weak_ptr<std::vector<uint8_t>> doneWatch = done;
  {
    Comm alive(transport, driver, 1, 4, deadline, tuning);
    alive.keep(done);
    alive.recv(1, 0, done->data(), kBytes);
    transport.received.back()->deliver(0xcd);
    done.reset();
  }
  CHECK_MSG(doneWatch.expired(), "a Comm whose requests completed kept its buffer");
  transport.received.clear();
}

}  // namespace ucxb::algotest
