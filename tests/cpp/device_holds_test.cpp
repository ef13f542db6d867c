// csrc/device_holds.hpp, without a GPU: which ops a wait() may hold the stream behind (marks
// by ticket), and that what the progress thread held of an op goes on the thread that prunes,
// only once nothing else holds it, its mark with it.
#include "csrc/device_holds.hpp"

#include <memory>
#include <thread>

#include "tests/cpp/check.h"

namespace {

using ucxb::DeviceHolds;

// A wait() for the op numbered t may hold the stream when no op numbered below t is marked;
// the op's own mark (t) and later ones do not count. Marks count per op (a Future's and the
// op's own may both be there).
void testMarks() {
  auto holds = std::make_shared<DeviceHolds>();
  const uint64_t first = holds->nextTicket();
  const uint64_t second = holds->nextTicket();
  CHECK(second > first);
  CHECK(holds->clearBefore(first));
  CHECK(holds->clearBefore(second));
  {
    const DeviceHolds::Mark mark(holds, first);
    CHECK(holds->clearBefore(first));
    CHECK(!holds->clearBefore(second));
    holds->add(first);  // getFuture() on the same op
    CHECK(!holds->clearBefore(second));
    holds->remove(first);
    CHECK(!holds->clearBefore(second));  // the mark still counts
  }
  CHECK(holds->clearBefore(second));
  holds->remove(second);  // one that is not there: nothing
  CHECK(holds->clearBefore(second + 1));
}

// What a queued op's task holds, as queueTask makes it: its mark first, then its references.
struct Held {
  std::unique_ptr<DeviceHolds::Mark> mark;
  std::shared_ptr<int> tensor;
};

// prune() lets go of an entry only once the list alone holds it (the task, its request and its
// callback are gone), and then its mark with it, on the pruning thread; what another thread
// still holds stays, marked.
void testPrune() {
  auto holds = std::make_shared<DeviceHolds>();
  const uint64_t ticket = holds->nextTicket();
  auto tensor = std::make_shared<int>(7);
  std::weak_ptr<int> watch = tensor;
  auto held = std::make_shared<Held>(
      Held{std::make_unique<DeviceHolds::Mark>(holds, ticket), std::move(tensor)});
  holds->keep(held);
  holds->prune();
  CHECK(!watch.expired());  // the task still holds it
  CHECK(!holds->clearBefore(ticket + 1));
  // The progress thread lets go of its copy.
  std::thread([task = std::move(held)]() mutable { task.reset(); }).join();
  CHECK(!watch.expired());  // not there: the list still has it
  CHECK(!holds->clearBefore(ticket + 1));
  holds->prune();
  CHECK(watch.expired());
  CHECK(holds->clearBefore(ticket + 1));
}

// clear() (the group's end) drops the whole list: an entry still held elsewhere goes with that
// holder, an entry held by nobody else goes at once (a kept op holds its Work, which holds the
// list: without this they would keep each other).
void testClear() {
  auto holds = std::make_shared<DeviceHolds>();
  auto alone = std::make_shared<int>(1);
  std::weak_ptr<int> aloneWatch = alone;
  holds->keep(std::move(alone));
  auto shared = std::make_shared<int>(2);
  holds->keep(shared);
  holds->clear();
  CHECK(aloneWatch.expired());
  CHECK(shared.use_count() == 1);
}

const ucxb::check::Group kGroups[] = {
    {"marks", testMarks, true},
    {"prune", testPrune, true},
    {"clear", testClear, true},
};

}  // namespace

int main(int argc, char** argv) {
  return ucxb::check::runGroups("device_holds_test", kGroups, argc, argv);
}
