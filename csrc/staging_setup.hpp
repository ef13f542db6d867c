// Decides, once per group, whether its ranks stage large messages through shared memory, and
// sets the segments up (see engine/staging_area.h).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "csrc/address_exchange.hpp"
#include "csrc/engine/staging_area.h"

namespace ucxb {

// options["shared_memory"]: "auto" (default) or "off"; options["transport"] as for
// makeTransport. With "auto" on the ucx transport, returns the staging area when every rank
// of the group runs on this host (shm::hostIdentity) with the same slot size and could map every peer's segment;
// null otherwise. All ranks reach the same answer: each publishes what it found through the
// Store before anyone decides. A bad value raises c10::ValueError.
// `chunkBytes` (the group's chunk_bytes) caps the slot size. options["staging_stores"]:
// "cached" (default) or "streaming", how this rank writes its slots (SlotStores).
std::unique_ptr<StagingArea> setUpStaging(const std::map<std::string, std::string>& options,
                                          int rank, int size, size_t chunkBytes,
                                          AddressExchange& exchange);

}  // namespace ucxb
