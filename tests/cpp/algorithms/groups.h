// The groups of tests/cpp/algorithms_test.cpp, one per op x algorithm (reducing_groups.cpp:
// the ops that reduce; moving_groups.cpp: those that only move bytes, and the barrier).
#pragma once

namespace ucxb::algotest {

void testAllreduceRing();
void testAllreduceRecursiveDoubling();
void testAllreduceRabenseifner();
void testAllreducePairSlots();
void testAllreduceFusedPairSlowPeer();
// failing_post_groups.cpp: a posted all_reduce that fails part-way through posting.
void testAllreduceHalfMade();
// failing_staged_groups.cpp: staged ops of a 2-rank group that fail part-way, and the ops after.
void testStagedFailures();
// abandoned_wire_groups.cpp: a tripwire given up that catches a message later.
void testAbandonedWireOutlivesItsComm();
// ... and a receive given up that writes into its op's buffer after the op (Comm::keep).
void testAbandonedReceiveKeepsItsBuffer();
void testReduceScatterRing();
void testReduceScatterRecursiveHalving();
void testReduceBinomial();
void testReduceChain();

void testBroadcastBinomial();
void testBroadcastChain();
void testAllgatherRing();
void testAllgatherBruck();
void testAllgatherLinear();
void testGather();
void testScatter();
void testAlltoallPairwise();
void testAlltoallLinear();
void testBarrier();

// host_path_groups.cpp: device memory takes no host-only path (op_memory.h).
void testDeviceMemoryTakesNoHostPath();
void testDevicePairAllreduceExchangesOnce();
void testScratchFitsTheMessage();

// peer_map_groups.cpp: the peer-mapped all_reduce of two ranks (csrc/collectives/peer_map.cpp).
void testPeerMapAllreduce();
void testPeerMapRouting();
void testPeerMapFallbackAndFailures();

}  // namespace ucxb::algotest
