#include "transports/ucx/ucx_context.h"

#include <cstdlib>
#include <mutex>
#include <string>
#include <utility>

#include "transports/ucx/ucx_status.h"

namespace ucxb::ucx {

namespace {

struct ConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};

ucp_context_h createContext() {
  ucp_config_t* raw = nullptr;
  check(ucp_config_read(nullptr, nullptr, &raw), "ucp_config_read");
  std::unique_ptr<ucp_config_t, ConfigDeleter> config(raw);

  // Endpoints use peer error handling (a dead peer fails its requests). UCX leaves shared
  // memory out of such endpoints unless its own peer-failure checks are enabled, which would
  // silently push same-host traffic onto TCP loopback. Enable them unless the user chose.
  // UCX's keepalive notices a dead peer (process gone, connection reset) every 20 s by
  // default; a collective stuck on a dead rank should fail in about a second instead. It
  // checks liveness, not responsiveness, so a peer busy computing is never reported.
  const std::pair<const char*, const char*> defaults[] = {
      {"POSIX_ERROR_HANDLING", "y"}, {"SYSV_ERROR_HANDLING", "y"}, {"KEEPALIVE_INTERVAL", "1s"}};
  for (const auto& [name, value] : defaults) {
    if (std::getenv((std::string("UCX_") + name).c_str()) == nullptr) {
      check(ucp_config_modify(config.get(), name, value),
            std::string("ucp_config_modify ") + name);
    }
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // WAKEUP lets an idle progress thread sleep on the worker's event fd instead of spinning.
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  // Each group has its own worker, driven by its own thread: the context is shared by them.
  params.mt_workers_shared = 1;

  ucp_context_h ctx = nullptr;
  check(ucp_init(&params, config.get(), &ctx), "ucp_init");
  return ctx;
}

}  // namespace

Context::~Context() { ucp_cleanup(handle_); }

std::shared_ptr<Context> Context::shared() {
  static std::mutex mu;
  static std::weak_ptr<Context> current;
  std::lock_guard<std::mutex> lock(mu);
  auto ctx = current.lock();
  if (!ctx) {
    ctx = std::make_shared<Context>(createContext());
    current = ctx;
  }
  return ctx;
}

}  // namespace ucxb::ucx
