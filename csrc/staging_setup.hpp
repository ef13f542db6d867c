// Decides, once per group, whether its ranks stage large messages through shared memory, and
// sets the segments up (see engine/staging_area.h).
#pragma once

#include <memory>
#include <string>

#include "csrc/address_exchange.hpp"
#include "csrc/backend_options.h"
#include "csrc/engine/staging_area.h"
#include "transports/transport.h"

namespace ucxb {

// The one place that decides whether a group stages. Returns the staging area when every rank
// of the group wants it (options.shared_memory "auto" and a transport that permits shared
// memory: Transport::permitsSharedMemory), runs on this host (shm::hostIdentity) with the same
// slot size, and could map every peer's segment; null otherwise. All ranks reach the same
// answer: each publishes what it found through the Store before anyone decides. `chunkBytes`
// (the group's chunk_bytes) caps the slot size; options.staging_stores says how this rank
// writes its slots. Which messages then go through the slots is decided per message, by
// collectives/staged_path.h.
std::unique_ptr<StagingArea> setUpStaging(const BackendOptions& options,
                                          const Transport& transport, size_t chunkBytes,
                                          AddressExchange& exchange);

}  // namespace ucxb
