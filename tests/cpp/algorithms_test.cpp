// Every collective algorithm of csrc/collectives, run on threads of this one process over the
// in-memory transport (tests/cpp/inproc/), at world sizes 1-5 and 8, with and without the
// shared-memory staging slots, for uneven sizes (0 elements, 1, not divisible by the world,
// many chunks of a tiny chunk size, 64 KiB+ messages that take the staged paths, messages
// of more one-byte chunks than an op has tag steps) and every dtype x reduce op the kernels
// have. Each result is compared byte for byte with a reference
// computed here (tests/cpp/algorithms/elements.h); memory an op must not write (inputs, the
// bytes around every buffer) is checked too. One group per op x algorithm (the groups are in
// tests/cpp/algorithms/; the transport's own checks in inproc_transport_checks.h); built and
// run by tests/test_algorithms_inproc.py (`algorithms_test --list`, `algorithms_test GROUP`).
#include "tests/cpp/algorithms/groups.h"
#include "tests/cpp/check.h"
#include "tests/cpp/inproc_transport_checks.h"

int main(int argc, char** argv) {
  using namespace ucxb::algotest;
  const ucxb::check::Group groups[] = {
      {"inproc_transport", ucxb::inproc_checks::testInprocTransport, true},
      {"comm_errors", ucxb::inproc_checks::testCommErrors, true},
      {"allreduce_ring", testAllreduceRing, true},
      {"allreduce_recursive_doubling", testAllreduceRecursiveDoubling, true},
      {"allreduce_rabenseifner", testAllreduceRabenseifner, true},
      {"allreduce_pair_slots", testAllreducePairSlots, true},
      {"allreduce_fused_pair", testAllreduceFusedPairSlowPeer, true},
      {"allreduce_half_made", testAllreduceHalfMade, true},
      {"staged_failures", testStagedFailures, true},
      {"abandoned_wire", testAbandonedWireOutlivesItsComm, true},
      {"abandoned_receive", testAbandonedReceiveKeepsItsBuffer, true},
      {"reduce_scatter_ring", testReduceScatterRing, true},
      {"reduce_scatter_recursive_halving", testReduceScatterRecursiveHalving, true},
      {"reduce_binomial", testReduceBinomial, true},
      {"reduce_chain", testReduceChain, true},
      {"broadcast_binomial", testBroadcastBinomial, true},
      {"broadcast_chain", testBroadcastChain, true},
      {"all_gather_ring", testAllgatherRing, true},
      {"all_gather_bruck", testAllgatherBruck, true},
      {"all_gather_linear", testAllgatherLinear, true},
      {"gather", testGather, true},
      {"scatter", testScatter, true},
      {"all_to_all_pairwise", testAlltoallPairwise, true},
      {"all_to_all_linear", testAlltoallLinear, true},
      {"barrier", testBarrier, true},
      {"device_memory_routing", testDeviceMemoryTakesNoHostPath, true},
      {"device_pair_allreduce", testDevicePairAllreduceExchangesOnce, true},
      {"peer_map_allreduce", testPeerMapAllreduce, true},
      {"peer_map_routing", testPeerMapRouting, true},
      {"peer_map_failures", testPeerMapFallbackAndFailures, true},
      {"scratch_fits_the_message", testScratchFitsTheMessage, true},
  };
  return ucxb::check::runGroups("algorithms_test", groups, argc, argv);
}
