// The one place where failures become c10 exceptions with the context a user needs: the op,
// its sequence number, this rank, the group size, the tensors and the peer involved.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <exception>
#include <string>

namespace ucxb {

struct OpContext {
  std::string op;       // e.g. "allreduce"
  int rank = -1;
  int size = 0;
  uint64_t seq = 0;
  std::string tensors;  // e.g. "float32[1024]"
  std::string backend = "ucx";  // "ucx" or "udp": errors start with it
};

// Wraps any exception from the transport, engine or algorithm as c10::DistBackendError.
std::exception_ptr toDistError(const OpContext& ctx, std::exception_ptr cause);

// Bad arguments from the caller: c10::ValueError (Python ValueError).
[[noreturn]] void throwInvalid(const std::string& op, int rank, const std::string& problem,
                               const std::string& backend = "ucx");

// The caller's wait() gave up before the op finished.
[[noreturn]] void throwWaitTimeout(const OpContext& ctx, int64_t waitedMs,
                                   const std::string& waitingFor);

}  // namespace ucxb
