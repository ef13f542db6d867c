// What an op's algorithm needs besides the transport: something that drives its requests to
// completion before a deadline (or gives up on them), and the group's memory it may borrow.
// The backend's ProgressEngine is one; the C++ algorithm tests drive an in-memory transport
// with another, so the algorithms run without the engine's thread. Torch-free and UCX-free.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "csrc/engine/staging_area.h"
#include "transports/transport.h"

namespace ucxb {

using Clock = std::chrono::steady_clock;

// A wait passed its deadline. what() lists the requests still outstanding and their peers.
class OpTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request failed (peer gone, truncated message, size mismatch, ...).
class OpFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Called only on the thread that owns the transport the requests came from.
class OpDriver {
 public:
  virtual ~OpDriver() = default;

  // Drives progress until every request has completed. Throws OpFailed on the first failed
  // request and OpTimeout at the deadline; either way the rest are given up first (abandon).
  virtual void waitAll(const std::vector<RequestPtr>& requests, Clock::time_point deadline) = 0;
  // Gives up on requests outside a waitAll: when this returns, none of them touches its
  // buffer any more (cancelled, or its peer cut off).
  virtual void abandon(const std::vector<RequestPtr>& requests) = 0;
  // A buffer of at least `bytes`, reused by every op of the group; one user at a time. It
  // outlives every request that points into it.
  virtual uint8_t* scratch(size_t bytes) = 0;
  // The group's shared-memory slots; null unless every rank runs on this host.
  virtual StagingArea* staging() const = 0;
};

}  // namespace ucxb
