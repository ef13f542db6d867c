// The endpoint-level fuzz mode of the UDP fuzz target (endpoint_fuzz.cpp).
#pragma once

#include <cstdint>
#include <span>

namespace ucxb::udp::fuzz {

// Runs `input` as a script against one udp Endpoint with pending requests, two honest peer
// Endpoints and an attacker who sends arbitrary datagrams from arbitrary addresses. abort()s
// with a message on the first violated invariant; every byte string is a valid input.
void fuzzEndpoint(std::span<const uint8_t> input);

}  // namespace ucxb::udp::fuzz
