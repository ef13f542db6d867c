// Decides, once per group, whether its ranks stage large messages through shared memory, and
// sets the segments up (see engine/staging_area.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "csrc/address_exchange.hpp"
#include "csrc/backend_options.h"
#include "csrc/engine/staging_area.h"
#include "transports/shm/shared_segment.h"
#include "transports/transport.h"

namespace ucxb {

// This rank's side of the set-up, made before the address exchange so that its offer travels
// in the same Store record as its address.
struct StagingOffer {
  StagingLayout layout;
  shm::SharedSegment segment;  // this rank's, when it offers one
  uint64_t cookie = 0;
  // What the rank publishes: "<host identity> slot=<bytes>\n<segment name>\n<cookie>", or
  // empty when it takes no part (shared memory off, or its segment could not be created).
  std::string text;
};

// Creates this rank's segment when it wants staging: its options ask for it
// (options.shared_memory "auto") and its transport permits it
// (Transport::permitsSharedMemory), in a group of more than one rank. `chunkBytes` (the
// group's chunk_bytes) caps the slot size.
StagingOffer offerStaging(const BackendOptions& options, const Transport& transport,
                          size_t chunkBytes);

// The one place that decides whether a group stages, once every rank's offer is known
// (`offers[p]`, this rank's own included). Returns the staging area when every rank offered
// a segment on this host with the same slot size and every rank could map every peer's; null
// otherwise. All ranks reach the same answer: they agree through one Store counter
// (AddressExchange::everyoneSays). options.staging_stores says how this rank writes its
// slots. Which messages then go through the slots is decided per message, by
// collectives/staged_path.h.
std::unique_ptr<StagingArea> setUpStaging(const BackendOptions& options, StagingOffer mine,
                                          const std::vector<std::string>& offers, int rank,
                                          AddressExchange& exchange);

}  // namespace ucxb
