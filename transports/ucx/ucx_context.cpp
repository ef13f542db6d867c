#include "transports/ucx/ucx_context.h"

#include <ucs/config/global_opts.h>
#include <uct/api/uct.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "transports/ucx/shared_memory_tls.h"
#include "transports/ucx/ucx_info.h"
#include "transports/ucx/ucx_status.h"

namespace ucxb::ucx {

namespace {

struct ConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};

// Sets `d`'s variables in `config` if it applies.
void apply(ucp_config_t* config, const UcxDefault& d) {
  if (!appliesNow(d)) return;
  for (const std::string& variable : d.variables) {
    const std::string name = variable.substr(4);  // ucp_config_modify wants no "UCX_"
    check(ucp_config_modify(config, name.c_str(), d.value.c_str()),
          "ucp_config_modify " + name + "=" + d.value);
  }
}

// A context from UCX's configuration (the environment), the backend's defaults, `tls` unless
// it is null, and `netDevices` unless it is empty.
ucp_context_h initContext(const std::string& netDevices, const char* tls) {
  ucp_config_t* raw = nullptr;
  check(ucp_config_read(nullptr, nullptr, &raw), "ucp_config_read");
  std::unique_ptr<ucp_config_t, ConfigDeleter> config(raw);
  for (const UcxDefault& d : ucxDefaults()) apply(config.get(), d);
  if (!registersMemory() && std::getenv("UCX_RCACHE_ENABLE") == nullptr) {
    // A UCX that has no such setting (UCP's own cache is younger than some distributions'
    // UCX) keeps what it does: this only saves start-up time.
    const ucs_status_t status = ucp_config_modify(config.get(), "RCACHE_ENABLE", "n");
    if (status != UCS_ERR_NO_ELEM) check(status, "ucp_config_modify RCACHE_ENABLE=n");
  }
  if (tls != nullptr) {
    check(ucp_config_modify(config.get(), "TLS", tls), std::string("ucp_config_modify TLS=") + tls);
  }
  if (!netDevices.empty()) {
    check(ucp_config_modify(config.get(), "NET_DEVICES", netDevices.c_str()),
          "ucp_config_modify NET_DEVICES=" + netDevices);
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

std::shared_ptr<Context> createContext(const std::string& netDevices, Reach reach) {
  const char* userTls = std::getenv("UCX_TLS");  // what ucp_config_read takes it from
  // The user's UCX_TLS always wins, also over a one-host guess.
  const bool oneHostOnly = reach == Reach::kOneHost && userTls == nullptr;
  ucp_context_h ctx = initContext(netDevices, oneHostOnly ? kOneHostTls : nullptr);
  std::vector<std::string> opened = contextTransports(ctx);
  if (oneHostOnly && lacksSysv(opened)) {
    ucp_cleanup(ctx);
    ctx = initContext(netDevices, kOneHostWithoutSysvTls);
    opened = contextTransports(ctx);
  }
  // Staging follows what the user asked of UCX, not the transports the backend left out.
  return std::make_shared<Context>(ctx, tlsIncludesSharedMemory(userTls != nullptr ? userTls : ""),
                                   oneHostOnly, std::move(opened));
}

}  // namespace

const std::vector<UcxDefault>& ucxDefaults() {
  // Endpoints use peer error handling (a dead peer fails its requests). UCX leaves shared
  // memory out of such endpoints unless its own peer-failure checks are enabled, which would
  // silently push same-host traffic onto TCP loopback.
  // UCX's keepalive notices a dead peer (process gone, connection reset) every 20 s by
  // default; a collective stuck on a dead rank should fail in about a second instead. It
  // checks liveness, not responsiveness, so a peer busy computing is never reported.
  // UCX's TCP transport moves a large message in pieces of its segment sizes: 8 KiB per send
  // and 64 KiB per receive system call by default, which also makes it stage messages above
  // ~270 KB through its own buffers. 512 KiB pieces cut the system calls per MB 8-64x and let
  // rendezvous send from the user's buffer: a 64 MB all_reduce across a veth pair went from
  // 3.0-3.7 to 4.3-4.7 GB/s. An endpoint holds a segment only while a message is in transit to
  // or from it. UCX requires RX >= TX, so the two are one setting. UCX 1.13 (Debian's) ignores
  // them when set through ucp_config_modify; 1.22 is the oldest release we have seen take them.
  // Each group's worker sets up receive buffers (8 KiB each) for its two shared-memory
  // transports, posix and sysv, when it is created: with UCX's defaults that page fault took
  // about half of ucp_worker_create's CPU time here (6.8-7.3 ms; 3.3-3.7 ms with a 64-entry
  // FIFO and buffers added 32 at a time, either alone saving at most 1 ms), and half of a
  // whole 8-rank start-up's CPU difference to Gloo's. A group sends few messages through UCX
  // at once (the bulk of a same-host op goes through the backend's own slots), and small-op
  // latency and a 4-rank all_to_all were no slower (docs/performance.md#start-up).
  static const std::vector<UcxDefault> table = {
      {{"UCX_POSIX_ERROR_HANDLING"}, "y"},
      {{"UCX_SYSV_ERROR_HANDLING"}, "y"},
      {{"UCX_KEEPALIVE_INTERVAL"}, "1s"},
      {{"UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE"}, "512k", 1, 22},
      {{"UCX_POSIX_FIFO_SIZE", "UCX_SYSV_FIFO_SIZE"}, "64"},
      {{"UCX_POSIX_RX_BUFS_GROW", "UCX_SYSV_RX_BUFS_GROW"}, "32"},
  };
  return table;
}

bool appliesNow(const UcxDefault& d) {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  if (major < d.minMajor || (major == d.minMajor && minor < d.minMinor)) return false;
  for (const std::string& variable : d.variables) {
    if (std::getenv(variable.c_str()) != nullptr) return false;
  }
  return true;
}

bool registersMemory() {
  // Asked after ucp_config_read, which loads UCX's modules: the list is complete then.
  static const bool answer = [] {
    uct_component_h* components = nullptr;
    unsigned count = 0;
    if (uct_query_components(&components, &count) != UCS_OK) return true;  // unknown: keep it
    bool other = false;
    for (unsigned i = 0; i < count && !other; ++i) {
      uct_component_attr_t attr{};
      attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
      if (uct_component_query(components[i], &attr) != UCS_OK) {
        other = true;
        break;
      }
      other = std::none_of(kCopyOnlyComponents.begin(), kCopyOnlyComponents.end(),
                           [&](const char* name) { return std::strcmp(name, attr.name) == 0; });
    }
    uct_release_component_list(components);
    return other;
  }();
  return answer;
}

bool leaveDeviceModulesOut() {
  if (std::getenv("UCX_MODULES") != nullptr) return false;  // the user's choice
  const std::string denied = std::string("^") + kDeviceModules;
  return ucs_global_opts_set_value("MODULES", denied.c_str()) == UCS_OK;
}

Context::~Context() { ucp_cleanup(handle_); }

std::shared_ptr<Context> Context::shared(const std::string& netDevices, Reach reach) {
  static std::mutex mu;
  static std::map<std::pair<std::string, Reach>, std::weak_ptr<Context>> live;
  // Under the user's UCX_TLS both reaches make the same context: share one.
  if (std::getenv("UCX_TLS") != nullptr) reach = Reach::kAnyHost;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = live[{netDevices, reach}];
  auto ctx = slot.lock();
  if (!ctx) {
    ctx = createContext(netDevices, reach);
    slot = ctx;
  }
  return ctx;
}

}  // namespace ucxb::ucx
