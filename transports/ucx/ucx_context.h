// A process-wide UCP context, shared by every group's worker. Creating a context reads the
// UCX_* environment and loads transport modules, which costs milliseconds; workers are cheap.
#pragma once

#include <ucp/api/ucp.h>

#include <memory>

namespace ucxb::ucx {

class Context {
 public:
  // Returns the live shared context, creating it on first use (thread-safe).
  static std::shared_ptr<Context> shared();

  explicit Context(ucp_context_h handle) : handle_(handle) {}
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context_h handle() const { return handle_; }

 private:
  ucp_context_h handle_;
};

}  // namespace ucxb::ucx
