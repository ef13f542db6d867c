// The one place where failures become c10 exceptions with the context a user needs: the op,
// its sequence number, this rank, the group size, the tensors and the peer involved. Bad
// input, bad options, set-up failures, failed ops and timeouts all leave csrc/ through here.
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
  std::string tensors;  // e.g. "Float[1024]"
  std::string backend = "ucx";  // "ucx" or "udp": errors start with it
};

// Wraps any exception from the transport, engine or algorithm as c10::DistBackendError.
std::exception_ptr toDistError(const OpContext& ctx, std::exception_ptr cause);

// The text of an error from toDistError (a c10 error's message without its backtrace): what a
// group records as its first failure.
std::string messageOf(std::exception_ptr error);

// Bad arguments from the caller: c10::ValueError (Python ValueError).
[[noreturn]] void throwInvalid(const std::string& op, int rank, const std::string& problem,
                               const std::string& backend = "ucx");

// A knob with a bad value (a config::ConfigError's text): c10::ValueError, prefixed with the
// backend's name when the value belongs to a group ("" for a bare check from Python).
[[noreturn]] void throwBadOption(const std::string& backend, const std::string& problem);

// Creating a group failed (transport set-up, address exchange): c10::DistBackendError.
[[noreturn]] void throwSetupFailed(const std::string& backend, const std::string& groupId,
                                   int rank, const std::string& why);

// wait(timeout) with a negative timeout: c10::ValueError naming the op. (0 is torch's
// kNoTimeout: wait up to the op's own timeout.)
[[noreturn]] void throwNegativeWait(const OpContext& ctx, int64_t timeoutMs);

// The caller's wait() gave up before the op finished.
[[noreturn]] void throwWaitTimeout(const OpContext& ctx, int64_t waitedMs,
                                   const std::string& waitingFor);

}  // namespace ucxb
