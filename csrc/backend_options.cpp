#include "csrc/backend_options.h"

#include "transports/udp/faults.h"
#include "transports/udp/udp_config.h"

namespace ucxb {
namespace {

constexpr uint64_t kSpinUsMax = (uint64_t{1} << 31) - 1;  // fits any int parser
constexpr uint64_t kChunkBytesMax = uint64_t{1} << 40;

// A "key=value,..." knob checked against `schema` now, so a typo fails where it is written;
// returns the list with blanks removed and each value in its canonical spelling.
template <typename T>
config::TextCheck keyValuesOf(const config::Schema<T>& schema,
                              void (*validate)(const T&) = nullptr) {
  return [&schema, validate](const std::string& value) {
    std::string out;
    T parsed{};
    for (const auto& kv : config::splitKeyValues(value, schema.what())) {
      const std::string canonical = schema.normalizeValue(kv.key, kv.value);
      schema.set(parsed, kv.key, canonical);
      out += (out.empty() ? "" : ",") + kv.key + "=" + canonical;
    }
    if (validate != nullptr) validate(parsed);
    return out;
  };
}

// udp_faults: one "key=value,..." section per path, ';'-separated (transports/udp/faults.h).
config::TextCheck faultPathsOf(const config::Schema<udp::FaultConfig>& schema) {
  return [check = keyValuesOf(schema)](const std::string& value) {
    std::string out;
    size_t start = 0;
    for (;;) {
      const size_t end = value.find(';', start);
      out += check(value.substr(start, end == std::string::npos ? std::string::npos : end - start));
      if (end == std::string::npos) return out;
      out += ";";
      start = end + 1;
    }
  };
}

// For a "key=value,..." knob that `transport` reads: its keys that must agree, with their
// defaults filled in (a rank that leaves a key unset and one that sets it to its default
// agree). None in a group of another transport, which never reads the knob.
template <typename T>
std::function<std::vector<config::Setting>(const BackendOptions&)> agreedKeysOf(
    const config::Schema<T>& schema, std::string BackendOptions::*knob, const char* transport) {
  return [&schema, knob, transport](const BackendOptions& o) {
    if (o.transport != transport) return std::vector<config::Setting>{};
    return schema.agreed(schema.parse(o.*knob));
  };
}

template <typename T>
std::string keyValuesAllowed(const config::Schema<T>& schema) {
  return "'key=value,...' with keys " + config::joinNames(schema.keys());
}

config::Field<BackendOptions> algorithmField(size_t i) {
  const auto op = static_cast<algo::Op>(i);
  const std::string name = std::string("algo_") + algo::opName(op);
  // Every rank must run the same algorithm: each rank's steps are the other ranks' matches.
  return {config::sameOnEveryRank(config::choice(
              name, algo::namesFor(op),
              "force the " + std::string(algo::opName(op)) +
                  " algorithm; 'auto' chooses by message size and group size "
                  "(docs/algorithms.md)")),
          {},
          [i](BackendOptions& o, const std::string& v) { o.algorithms[i] = v; },
          [i](const BackendOptions& o) { return o.algorithms[i]; },
          {}};
}

std::vector<config::Field<BackendOptions>> fields() {
  using config::choice;
  using config::member;
  using O = BackendOptions;
  auto internal = [](config::FieldInfo info) {
    info.internal = true;
    return info;
  };
  std::vector<config::Field<O>> f = {
      // Must agree, and is checked before the rest: the address record names it.
      member(internal(config::sameOnEveryRank(
                 choice("transport", {"ucx", "udp"}, "the transport under the group"))),
             &O::transport),
      member(internal(config::text("udp_host", "a numeric IPv4 address",
                                   "udp: the address this rank binds")),
             &O::udpHost),
      member(internal(config::text("ucx_net_devices", "UCX_NET_DEVICES' syntax",
                                   "ucx: the devices for the group's UCX context, picked by "
                                   "ifname; '' keeps UCX's choice")),
             &O::ucxNetDevices),
      member(choice("progress_mode", {"sleep", "poll"},
                    "sleep: the progress thread blocks on the transport's wake-up fd when idle "
                    "and after spinning briefly (spin_us) during an op; poll: busy-poll, "
                    "lowest latency, burns a core per rank"),
             &O::progressMode),
      member(config::integer("spin_us", 0, kSpinUsMax,
                             "microseconds to poll (yielding the core between polls) before "
                             "sleeping: the progress thread while an op waits and after its "
                             "last op, the caller in Work.wait()"),
             &O::spinUs),
      member(config::bytes("inline_bytes", 0, kChunkBytesMax,
                           "largest op that runs on the caller's thread while the group is "
                           "idle, two thread hops fewer (today a CPU all_reduce of one "
                           "contiguous tensor between 2 ranks: up to 32 KiB as one exchange "
                           "through the transport, above that in a group that stages through "
                           "shared memory, up to what its slots hold at once); one not done "
                           "after spin_us is handed to the progress thread; 0: off "
                           "(docs/architecture.md#inline-ops)"),
             &O::inlineBytes),
      member(choice("log_level", {"DEBUG", "INFO", "WARNING", "ERROR"},
                    "level of the 'ucxbackend' logger (standard Python logging)"),
             &O::logLevel),
      // Must agree: a receiver posts chunk-sized receives for what its peer sends in chunks.
      member(config::sameOnEveryRank(config::bytes(
                 "chunk_bytes", 1, kChunkBytesMax,
                 "largest piece of a message on host memory reduced or pipelined at once; "
                 "extra memory per op is at most two chunks (docs/algorithms.md)")),
             &O::chunkBytes),
      member(config::sameOnEveryRank(config::bytes(
                 "device_chunk_bytes", 1, kChunkBytesMax,
                 "chunk_bytes for ops on CUDA tensors: larger, since each exchange of device "
                 "memory has a fixed cost far above its bytes' (docs/cuda.md); extra device "
                 "memory per op is at most two chunks")),
             &O::deviceChunkBytes),
  };
  for (size_t i = 0; i < algo::kOpCount; ++i) f.push_back(algorithmField(i));
  const auto& udpSchema = udp::udpConfigSchema();
  const auto& faultSchema = udp::faultConfigSchema();
  std::vector<config::Field<O>> rest = {
      member(choice("shared_memory", {"auto", "off"},
                    "ucx backend only: with 'auto', a group whose ranks all run on one host "
                    "(same boot, mount and network namespace) moves large all_reduce, "
                    "all_gather, broadcast and all_to_all messages through shared-memory "
                    "slots, one copy less per byte than through UCX; off when UCX_TLS leaves "
                    "out shared memory"),
             &O::sharedMemory),
      // Must agree: a group whose ranks chose differently (auto reads per-rank facts) is
      // built again over ucx for any host (transport_factory.cpp), as one spanning hosts is.
      member(config::sameOnEveryRank(choice(
                 "one_host_transport", {"auto", "ucx", "shm"},
                 "ucx backend only: what carries the messages of a group whose ranks all run "
                 "on one host; 'shm': the backend's own shared-memory rings, without a UCX "
                 "context or worker, for a faster creation (host memory only: a CUDA tensor "
                 "is staged through pinned host memory); 'ucx': UCX (its shared-memory "
                 "transports, CUDA IPC); 'auto': shm, unless the rank carries CUDA tensors "
                 "(cuda=1) and sees a GPU, or UCX_TLS is set; a group that spans hosts takes "
                 "UCX either way "
                 "(docs/architecture.md#one-host-transport)")),
             &O::oneHostTransport),
      // Need not agree: a receiver matches a message whichever of the sender's workers sent it.
      member(choice("send_lane", {"auto", "on", "off"},
                    "ucx backend only: large collective sends (256 KiB and up) to a peer go "
                    "through a second UCX worker with a thread of its own, so that a rank "
                    "sends and receives at once (two TCP connections per peer, one per "
                    "direction); 'auto': only to peers on another host reached over TCP "
                    "alone, 'on': to every peer, 'off': never "
                    "(docs/performance.md#both-directions-at-once)"),
             &O::sendLane),
      member(choice("staging_stores", {"auto", "cached", "streaming"},
                    "ucx backend, shared-memory staging only: how a rank writes the slots its "
                    "peer reads; 'streaming' uses non-temporal stores that go around its "
                    "cache, for hosts where handing freshly written cache lines to another "
                    "core is slow (when scripts/cross_core_copy.cpp runs faster with "
                    "'streaming'); 'cached' uses plain stores; 'auto': streaming for a "
                    "2-rank all_reduce of 4-256 KiB (the pair slots), cached otherwise"),
             &O::stagingStores),
      member(config::text("ifname",
                          "'' (automatic) or interface names: 'eth0', 'eth,ib' (prefixes), "
                          "'=eth0' (exact), '^docker,lo' (exclude)",
                          "network interface(s) for traffic between hosts, for both backends "
                          "(like NCCL_SOCKET_IFNAME): udp binds the first one's address; ucx "
                          "uses those interfaces plus their RDMA ports (UCX_NET_DEVICES), "
                          "unless UCX_NET_DEVICES is set. Automatic: the interface that routes "
                          "to the rendezvous host, never loopback for a remote one"),
             &O::ifname),
      // Flagged for the keys flagged in udpConfigSchema(), which alone must agree.
      [&udpSchema] {
        auto field = member(config::sameOnEveryRank(config::text(
                                "udp_config", keyValuesAllowed(udpSchema),
                                "udp backend only: the reliability layer's settings, e.g. "
                                "'loss_recovery=go_back_n,congestion=aimd' (mtu_payload "
                                "defaults to the interface MTU); docs/configuration.md lists "
                                "every key")),
                            &O::udpConfig, keyValuesOf(udpSchema, &udp::validate));
        field.agreedParts = agreedKeysOf(udpSchema, &O::udpConfig, "udp");
        return field;
      }(),
      member(config::text("udp_faults", keyValuesAllowed(faultSchema),
                          "udp backend only: seeded fault injection on received datagrams, "
                          "e.g. 'drop=0.01,dup=0.001,reorder=0.02,seed=7'; with udp_config "
                          "paths > 1, ';'-separated sections are the paths' own "
                          "('seed=7;drop=0.05': path 1 loses 5%)"),
             &O::udpFaults, faultPathsOf(faultSchema)),
      // Must agree, but not as text: each rank may keep the secret at its own path. The
      // ranks compare a key check derived from the secret instead: withKeyCheck
      // (csrc/udp_auth_setup.hpp) replaces the path in the agreed settings with it.
      member(config::sameOnEveryRank(config::text(
                 "secret_file", "'' (off) or the path of a file of at least 32 secret bytes "
                                "that only its owner can read (chmod 600)",
                 "udp backend only: authenticate every datagram (AES-256-GCM, keys derived "
                 "from this file's secret, the group and its instance) and drop forged and "
                 "replayed ones; every rank needs the same secret (compared at creation as a "
                 "key check, not as a path). '' (default): unauthenticated, anyone who can "
                 "reach the ports and read the Store can inject traffic. The ucx backend "
                 "ignores it (UCX has no authentication). docs/failure-model.md#security")),
             &O::secretFile),
      // Per rank: a rank's choice of device is its own (like NCCL, a group may mix devices).
      member(config::integer("cuda", 0, 1,
                             "1: carry CUDA tensors (ucx moves device memory itself, udp "
                             "stages it through pinned host memory); 0: a CUDA tensor is a "
                             "ValueError, and a one-host group keeps the shm rings on a GPU "
                             "host too. docs/cuda.md"),
             &O::cuda),
      member(choice("cuda_wait", {"host", "stream"},
                    "what Work.wait() on a CUDA collective blocks: 'host' waits until the op "
                    "has ended (its outputs are then final on every stream, as with Gloo); "
                    "'stream' makes the caller's current stream wait for the op on the device "
                    "and returns at once (NCCL's semantics; experimental, docs/cuda.md)"),
             &O::cudaWait),
      // Must agree: a rank that maps waits for notices that a peer running another algorithm
      // never sends (the op would end in its timeout on both ranks).
      member(config::sameOnEveryRank(choice(
                 "device_peer_map", {"off", "auto", "on"},
                 "ucx backend, CUDA tensors, 2-rank groups only: all_reduce maps the peer's "
                 "buffer (CUDA IPC through UCX) and folds half of the vector straight out of "
                 "the peer's memory, with five small host notices and no message of the bulk "
                 "(docs/algorithms.md#peer-mapped-all_reduce); 'auto': from 64 KiB, and the "
                 "usual algorithm where a rank cannot map (both ranks learn it in the op); "
                 "'on': at every size, and the op fails where a rank cannot map, naming it "
                 "and why; 'off' (the default until a GPU run has verified it, docs/cuda.md)")),
             &O::devicePeerMap),
  };
  f.insert(f.end(), rest.begin(), rest.end());
  return f;
}

}  // namespace

EngineConfig BackendOptions::engine() const {
  EngineConfig config;
  config.mode = progressMode == "poll" ? ProgressMode::kPoll : ProgressMode::kSleep;
  config.spin = std::chrono::microseconds(spinUs);
  return config;
}

algo::Tuning BackendOptions::tuning(bool deviceMemory) const {
  algo::Tuning tuning;
  for (size_t i = 0; i < algo::kOpCount; ++i) {
    tuning.forced[i] = algo::parseAlgorithm(static_cast<algo::Op>(i), algorithms[i]);
  }
  tuning.chunkBytes = static_cast<size_t>(deviceMemory ? deviceChunkBytes : chunkBytes);
  if (deviceMemory && devicePeerMap != "off") {
    tuning.peerMap = devicePeerMap == "on" ? algo::PeerMapMode::kOn : algo::PeerMapMode::kAuto;
  }
  return tuning;
}

SlotStores BackendOptions::slotStores() const {
  if (stagingStores == "streaming") return SlotStores::kStreaming;
  return stagingStores == "cached" ? SlotStores::kCached : SlotStores::kAuto;
}

const config::Schema<BackendOptions>& backendOptionsSchema() {
  static const config::Schema<BackendOptions> schema("ucxbackend option", fields());
  return schema;
}

std::vector<config::Setting> agreedSettings(const BackendOptions& options) {
  return backendOptionsSchema().agreed(options);
}

BackendOptions parseBackendOptions(const std::map<std::string, std::string>& options) {
  BackendOptions parsed;
  const auto& schema = backendOptionsSchema();
  for (const auto& [key, value] : options) schema.set(parsed, key, value);
  return parsed;
}

}  // namespace ucxb
