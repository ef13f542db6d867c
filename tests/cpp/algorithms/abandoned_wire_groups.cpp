// A tripwire (Comm::tripwire) that its op gives up but that goes on to catch a message: UCX
// cannot cancel a receive already matched to an eager message whose last fragments are still
// arriving, so the wire settles in a later progress(), after its Comm is gone. Its callback
// writes into the Comm, so it must not run then: a heap corruption on rank 0 of a 3-rank
// straddle case of tests/test_failure_model.py until 2026-11-27 ("munmap_chunk(): invalid
// pointer"), and a heap-use-after-free under AddressSanitizer (tests/test_algorithms_asan.py).
// Here a transport of held receives plays UCX's part, with no threads: the test settles each
// receive by hand.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "csrc/collectives/comm.h"
#include "tests/cpp/algorithms/groups.h"
#include "tests/cpp/check.h"

namespace ucxb::algotest {

namespace {

// A receive that cancel() cannot stop; the test delivers a message too long for it.
class HeldReceive final : public Request {
 public:
  HeldReceive(int peer, size_t bytes) : Request(/*isSend=*/false, peer, bytes) {}
  void cancel() override {}
  void deliverTooLong() { failTruncated("message truncated"); }
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
  RequestPtr recv(int peer, Tag, Tag, void*, size_t bytes, MemoryType) override {
    received.push_back(std::make_shared<HeldReceive>(peer, bytes));
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

}  // namespace ucxb::algotest
