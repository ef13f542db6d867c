#include "csrc/errors.hpp"

#include "csrc/engine/progress_engine.h"
#include "transports/transport.h"

namespace ucxb {

namespace {

std::string prefix(const OpContext& ctx) {
  std::string s = ctx.backend + " " + ctx.op + " (op #" + std::to_string(ctx.seq) + ") on rank " +
                  std::to_string(ctx.rank) + " of " + std::to_string(ctx.size);
  if (!ctx.tensors.empty()) {
    s += " [" + ctx.tensors + "]";
  }
  return s;
}

}  // namespace

std::exception_ptr toDistError(const OpContext& ctx, std::exception_ptr cause) {
  std::string what;
  try {
    std::rethrow_exception(cause);
  } catch (const c10::Error& e) {
    // Already a torch error (e.g. a ValueError from packing): keep its type.
    return std::current_exception();
  } catch (const OpTimeout& e) {
    what = prefix(ctx) + " timed out: " + e.what();
  } catch (const std::exception& e) {
    what = prefix(ctx) + " failed: " + e.what();
  } catch (...) {
    what = prefix(ctx) + " failed with an unknown error";
  }
  return std::make_exception_ptr(c10::DistBackendError(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, what));
}

std::string messageOf(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

void throwInvalid(const std::string& op, int rank, const std::string& problem,
                  const std::string& backend) {
  throw c10::ValueError(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
      backend + " " + op + " on rank " + std::to_string(rank) + ": " + problem);
}

void throwBadOption(const std::string& backend, const std::string& problem) {
  throw c10::ValueError(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
      backend.empty() ? problem : backend + ": " + problem);
}

void throwSetupFailed(const std::string& backend, const std::string& groupId, int rank,
                      const std::string& why) {
  throw c10::DistBackendError(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
      backend + ": setting up group '" + groupId + "' on rank " + std::to_string(rank) +
          " failed: " + why);
}

void throwNegativeWait(const OpContext& ctx, int64_t timeoutMs) {
  throw c10::ValueError(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
      prefix(ctx) + ": wait(timeout) got a negative timeout (" + std::to_string(timeoutMs) +
          " ms); pass a positive one, or 0 (or none) to wait up to the op's own timeout");
}

void throwWaitTimeout(const OpContext& ctx, int64_t waitedMs, const std::string& waitingFor) {
  std::string what = prefix(ctx) + " timed out after " + std::to_string(waitedMs) + " ms";
  what += waitingFor.empty() ? " (queued behind earlier ops or not yet matched by its peers)"
                             : "; still waiting for: " + waitingFor;
  throw c10::DistBackendError(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, what);
}

}  // namespace ucxb
