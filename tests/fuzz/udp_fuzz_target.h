// What the standalone driver needs from the UDP fuzz target beyond libFuzzer's entry point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace ucxb::udp::fuzz {

// A starting corpus: scripts that move honest traffic between two connections (some with
// forged and mutated datagrams mixed in), raw datagrams captured from such traffic, and a few
// random byte strings. Deterministic, so a run is reproducible from its seed alone; the
// driver's -dump_seeds writes them out as a libFuzzer corpus directory.
std::vector<std::vector<uint8_t>> seedInputs();

}  // namespace ucxb::udp::fuzz
