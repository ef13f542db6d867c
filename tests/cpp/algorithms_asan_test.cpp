// The groups of algorithms_test (tests/cpp/algorithms_test.cpp) that guard memory a failed op
// leaves behind, in a program of their own for the AddressSanitizer build
// (tests/test_algorithms_asan.py): with only these groups' sources linked, that build compiles
// the algorithms and the in-memory transport, and none of the other groups' checks (a third of
// what algorithms_test compiles, docs/testing.md).
#include "tests/cpp/algorithms/groups.h"
#include "tests/cpp/check.h"

int main(int argc, char** argv) {
  const ucxb::check::Group groups[] = {
      {"allreduce_half_made", ucxb::algotest::testAllreduceHalfMade, true},
      {"abandoned_wire", ucxb::algotest::testAbandonedWireOutlivesItsComm, true},
      {"abandoned_receive", ucxb::algotest::testAbandonedReceiveKeepsItsBuffer, true},
  };
  return ucxb::check::runGroups("algorithms_asan_test", groups, argc, argv);
}
