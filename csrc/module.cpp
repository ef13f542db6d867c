// ucxbackend._C: the factory torch.distributed calls to create a "ucx" or "udp" backend, the
// knob schema, facts about the UCX library for `python -m ucxbackend info`, the algorithm
// table, and the tag layout for tests.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include <string>
#include <tuple>
#include <vector>

#include "csrc/backend_options.h"
#include "csrc/transport_factory.hpp"
#include "csrc/collectives/selection.h"
#include "csrc/engine/core_yield.h"
#include "csrc/errors.hpp"
#include "csrc/transport_backend.hpp"
#include "transports/tag.h"
#include "transports/ucx/ucx_context.h"
#include "transports/ucx/ucx_info.h"
#include "transports/udp/crc32c.h"
#include "transports/udp/datagram_auth.h"
#include "transports/udp/faults.h"
#include "transports/config/key_values.h"
#include "transports/config/schema.h"
#include "transports/udp/udp_config.h"
#include "transports/udp/udp_transport.h"

#ifndef UCXB_UCX_HOME
#define UCXB_UCX_HOME "unknown"
#endif
#ifndef UCXB_TORCH_VERSION
#define UCXB_TORCH_VERSION "unknown"
#endif

namespace py = pybind11;

namespace {

// Returned as the c10d::Backend base: torch's own binding of Backend (and its GIL-releasing
// holder) then applies, exactly as for backends built into torch.
c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int size,
                                                std::chrono::milliseconds timeout,
                                                const std::string& groupId,
                                                const std::vector<int64_t>& globalRanks,
                                                const std::map<std::string, std::string>& options) {
  return c10::make_intrusive<ucxb::TransportBackend>(store, rank, size, timeout, groupId,
                                                    globalRanks, options);
}

py::dict countersToDict(const ucxb::Counters& counters) {
  py::dict d;
  for (const auto& [name, value] : counters) d[py::str(name)] = value;
  return d;
}

// The ucxbackend group behind a c10d Backend handle; a TypeError for any other backend.
ucxb::TransportBackend* asGroup(const c10::intrusive_ptr<c10d::Backend>& backend,
                               const char* function) {
  auto* group = dynamic_cast<ucxb::TransportBackend*>(backend.get());
  if (group == nullptr) {
    throw py::type_error(std::string(function) + "(): not a ucxbackend process group backend but '" +
                         backend->getBackendName() + "'");
  }
  return group;
}

// Runs `f`; a config::ConfigError becomes a ValueError through the one translation point.
template <typename F>
auto configCall(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const ucxb::config::ConfigError& e) {
    ucxb::throwBadOption("", e.what());  // the text names what it parsed
  }
}

// One row per setting of `schema`: what Python's config, `info` and the docs show.
template <typename T>
py::list schemaRows(const ucxb::config::Schema<T>& schema) {
  py::list rows;
  for (const auto& f : schema.fields()) {
    const auto& i = f.info;
    py::dict row;
    row["name"] = i.name;
    row["kind"] = ucxb::config::kindName(i.kind);
    row["default"] = schema.defaultOf(f);
    row["allowed"] = i.allowed;
    row["help"] = i.help;
    row["choices"] = i.choices;
    row["min"] = i.min;
    row["max"] = i.max;
    row["internal"] = i.internal;
    row["must_agree"] = i.mustAgree;
    // a knob of "key=value,..." whose keys say for themselves whether they must agree
    row["agreed_keys"] = static_cast<bool>(f.agreedParts);
    rows.append(row);
  }
  return rows;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "Native part of ucxbackend: the c10d backend over UCX or UDP.";
  py::module_::import("torch.distributed");

  m.def("create_backend", &createBackend, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"), py::arg("group_id"), py::arg("global_ranks"), py::arg("options"),
        py::call_guard<py::gil_scoped_release>(),
        "Create the ucx backend for one process group (called by torch.distributed).");

  m.def(
      "traffic",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto* group = asGroup(backend, "traffic");
        ucxb::TrafficSnapshot snap;
        {
          py::gil_scoped_release release;
          snap = group->traffic();
        }
        py::dict out;
        out["backend"] = group->getBackendName();
        py::list peers;
        for (const auto& p : snap.peers) peers.append(countersToDict(p));
        out["peers"] = peers;
        out["total"] = countersToDict(ucxb::sumOverPeers(snap.peers));
        out["transport"] = countersToDict(snap.transport);
        py::list ops;
        for (const auto& op : snap.ops) {
          py::dict o;
          o["op"] = op.op;
          o["seq"] = op.seq;
          o["counters"] = countersToDict(op.counters);
          ops.append(o);
        }
        out["ops"] = ops;
        return out;
      },
      py::arg("backend"),
      "The traffic counters of a ucx/udp backend: per peer, transport-wide and per recent op "
      "(empty for ucx, whose traffic UCX does not count for us).");

  m.def(
      "trace_series",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto* group = asGroup(backend, "trace_series");
        std::vector<ucxb::OpTraceSeries> batches;
        {
          py::gil_scoped_release release;
          batches = group->drainTraceSeries();
        }
        py::list out;
        for (const auto& b : batches) {
          py::dict d;
          d["op"] = b.op;
          d["seq"] = b.seq;
          d["kind"] = b.series.kind;
          d["fields"] = b.series.fields;
          d["values"] = b.series.values;
          d["overwritten"] = b.series.overwritten;
          out.append(d);
        }
        return out;
      },
      py::arg("backend"),
      "The udp time-series samples taken since the last call (udp_config trace_samples), each "
      "batch {op, seq, kind, fields, values (flat, len(fields) per sample), overwritten}.");

  m.def(
      "shared_memory",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        return asGroup(backend, "shared_memory")->sharedMemory();
      },
      py::arg("backend"),
      "Whether the group stages large ring ops through shared memory (all ranks on one host).");

  m.def(
      "wait_stats",
      [] {
        const ucxb::WaitCounts c = ucxb::waitCounts();
        py::dict out;
        out["yields"] = c.yields;
        out["lost_yields"] = c.lostYields;
        out["crowded_spells"] = c.spells;
        out["start_spells"] = c.startSpells;
        out["yields_when_crowded"] = c.yieldsWhenCrowded;
        out["sleeps"] = c.sleeps;
        out["sleep_timeouts"] = c.sleepTimeouts;
        out["group_threads_on_host"] = c.groupThreadsOnHost;
        out["transport_waits"] = c.transportWaits;
        out["transport_wait_us"] = c.transportWaitNs / 1000;
        out["device_waits"] = c.deviceWaits;
        out["device_wait_us"] = c.deviceWaitNs / 1000;
        out["device_polls"] = c.devicePolls;
        out["device_sleeps"] = c.deviceSleeps;
        return out;
      },
      "This process's polling waits since it started, every group together: sched_yield calls "
      "('yields'), those that lost the core to a thread that kept it for over a millisecond "
      "('lost_yields'), crowded spells begun when lost yields added up ('crowded_spells'; waits "
      "then sleep instead of polling for 100 ms), spells begun by a group's creation on a host "
      "with more of its ranks than this process has cores ('start_spells'), yields begun in such a spell ('yields_when_crowded': none but a race), sleeps of waits in ops "
      "and of idle progress threads ('sleeps'), those that ended by their timeout, with no "
      "event ('sleep_timeouts'), and the threads of the largest group's ranks on this host "
      "that a lost yield counts as the group's own ('group_threads_on_host'); the waits of ops "
      "for their transport requests and their time ('transport_waits', 'transport_wait_us'), "
      "and for a CUDA stream or event ('device_waits', 'device_wait_us'), with the polls that "
      "found the device not there yet and the sleeps between them ('device_polls', "
      "'device_sleeps': in neither 'yields' nor 'sleeps').");

  m.def(
      "inline_stats",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto* group = asGroup(backend, "inline_stats");
        py::dict out;
        out["inline"] = group->inlineOps();
        out["handed_over"] = group->handedOver();
        out["core_moves"] = group->coreMoves();
        return out;
      },
      py::arg("backend"),
      "How many ops of the group ran on the caller's thread ('inline'), how many of those "
      "started there and were handed to the progress thread ('handed_over'), and how many "
      "times such a caller moved off a core it shared with a peer rank ('core_moves').");

  m.def(
      "startup_profile",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        const auto& profile = asGroup(backend, "startup_profile")->startupProfile();
        py::dict phases;  // insertion-ordered: the order the phases ran in
        py::dict phaseCalls;
        for (size_t i = 0; i < profile.phases.size(); ++i) {
          phases[py::str(profile.phases[i].first)] = profile.phases[i].second;
          phaseCalls[py::str(profile.phases[i].first)] = profile.phaseStoreCalls[i];
        }
        py::dict out;
        out["phases"] = phases;
        out["store_calls"] = profile.store.calls;
        out["store_calls_by_phase"] = phaseCalls;
        out["store_bytes"] = profile.store.bytes;
        out["store_watch_calls"] = profile.store.watchCalls;
        out["transports"] = profile.transports;
        return out;
      },
      py::arg("backend"),
      "Where this rank's creation of a ucx/udp group spent its time: its phases in seconds, "
      "in order, the Store calls and bytes it made, its Store calls by phase (and the calls "
      "of its liveness watch, on a connection of its own), and the transports below the "
      "group's (ucxbackend.startup_profile).");

  m.def(
      "get_error",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        return asGroup(backend, "get_error")->getError();
      },
      py::arg("backend"),
      "c10d::Backend::getError of a ucx/udp backend (torch has no Python binding for it): "
      "ErrorType.SUCCESS while the group is healthy, else the kind of its first failure.");

  m.def(
      "_inject_transport_fault",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, const std::string& where) {
        asGroup(backend, "_inject_transport_fault")->injectTransportFault(where);
      },
      py::arg("backend"), py::arg("where") = "progress",
      "Test-only: the group's transport throws from its next progress() or arm() (the group "
      "must have been created with UCXBACKEND_TEST_FAULT_INJECTION=1).");
  m.def(
      "_transport_fault_counts",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        py::dict out;
        const auto* group = asGroup(backend, "_transport_fault_counts");
        out["folded_receives"] = group->injectedTransportFolds();
        return out;
      },
      py::arg("backend"),
      "Test-only: what the fault-injecting transport of a group created with "
      "UCXBACKEND_TEST_FAULT_INJECTION=1 saw: folded_receives (its transport folded them).");

  m.def(
      "flight_recorder_capacity",
      [] { return ucxb::FlightRecorder::instance().capacity(); },
      "Entries the Flight Recorder of ucx/udp groups keeps (0: off; TORCH_FR_BUFFER_SIZE).");
  m.def(
      "flight_recorder_entries",
      [] {
        const auto records = ucxb::FlightRecorder::instance().dump();
        py::list out;
        for (const auto& r : records) {
          py::dict e;
          e["record_id"] = r.recordId;
          e["pg_id"] = r.pgId;
          e["pg_name"] = r.pgName;
          e["pg_desc"] = r.pgDesc;
          e["pg_ranks"] = r.pgRanks;
          e["last_enqueued_collective"] = r.lastEnqueued;
          e["last_started_collective"] = r.lastStarted;
          e["last_completed_collective"] = r.lastCompleted;
          e["thread_name"] = r.threadName;
          e["thread_id"] = r.threadId;
          e["collective_seq_id"] = r.collectiveSeq;
          e["p2p_seq_id"] = r.p2pSeq;
          e["op_id"] = r.opId;
          e["profiling_name"] = r.profilingName;
          e["time_created_ns"] = r.createdNs;
          e["time_started_ns"] = r.startedNs;
          e["time_completed_ns"] = r.completedNs;
          e["retired"] = r.retired;
          e["timeout_ms"] = r.timeoutMs;
          e["is_p2p"] = r.p2p;
          e["input_sizes"] = r.inputSizes;
          e["input_dtypes"] = r.inputDtypes;
          e["output_sizes"] = r.outputSizes;
          e["output_dtypes"] = r.outputDtypes;
          out.append(e);
        }
        return out;
      },
      "The Flight Recorder's entries, oldest first, as raw fields (ucxbackend.flight_recorder "
      "lays them out as torch's dump).");

  m.def("ucx_version", &ucxb::ucx::libraryVersion);
  m.def("ucx_library_path", &ucxb::ucx::libraryPath);
  m.def("ucx_transports", &ucxb::ucx::transports, py::call_guard<py::gil_scoped_release>());
  m.def(
      "one_host_transport",
      [](const std::map<std::string, std::string>& options) {
        const auto choice =
            configCall([&] { return ucxb::oneHostTransport(ucxb::parseBackendOptions(options)); });
        return py::make_tuple(choice.transport, choice.why);
      },
      "What carries a ucx group on one host for these options and this process's environment: "
      "('shm' or 'ucx', why).");
  m.def("ucx_leave_device_modules_out", &ucxb::ucx::leaveDeviceModulesOut,
        "UCX_MODULES=^<kDeviceModules> for this process unless the user set UCX_MODULES "
        "(transports/ucx/ucx_context.h); whether UCX took it.");
  // The UCX settings the backend chooses unless the user set them, for `info`: per group of
  // variables set together, (variables, value, oldest UCX "major.minor" that takes them).
  m.def("ucx_defaults", []() {
    std::vector<std::tuple<std::vector<std::string>, std::string, std::string>> rows;
    for (const auto& d : ucxb::ucx::ucxDefaults()) {
      rows.emplace_back(d.variables, d.value,
                        std::to_string(d.minMajor) + "." + std::to_string(d.minMinor));
    }
    return rows;
  });
  m.def("build_info", []() {
    // udp_crc32c: the checksum kernel this CPU runs (transports/udp/crc32c.h).
    return std::map<std::string, std::string>{
        {"ucx_home", UCXB_UCX_HOME},
        {"torch_version", UCXB_TORCH_VERSION},
        {"udp_crc32c", ucxb::udp::crc32cKernelName(ucxb::udp::crc32cActiveKernel())},
        // udp_auth: whether secret_file can work here (transports/udp/datagram_auth.h).
        {"udp_auth", ucxb::udp::authAvailable() ? "openssl (aes-256-gcm)"
                                                : "unavailable (built without OpenSSL)"}};
  });

  auto algos = m.def_submodule("algorithms", "Algorithm selection (csrc/collectives/selection.h).");
  algos.def("names", []() {
    std::map<std::string, std::vector<std::string>> names;
    for (size_t i = 0; i < ucxb::algo::kOpCount; ++i) {
      const auto op = static_cast<ucxb::algo::Op>(i);
      names[ucxb::algo::opName(op)] = ucxb::algo::namesFor(op);
    }
    return names;
  }, "op -> the algorithm names its algo_<op> knob accepts ('auto' first).");
  algos.def("thresholds", []() {
    namespace a = ucxb::algo;
    return std::map<std::string, size_t>{
        {"allreduce_recursive_doubling_max", a::kAllreduceRecursiveDoublingMax},
        {"allreduce_rabenseifner_max", a::kAllreduceRabenseifnerMax},
        {"allreduce_pair_slots_min", a::kAllreducePairSlotsMin},
        {"allgather_bruck_max", a::kAllgatherBruckMax},
        {"reduce_scatter_halving_max", a::kReduceScatterHalvingMax},
        {"broadcast_binomial_max", a::kBroadcastBinomialMax},
        {"reduce_binomial_max", a::kReduceBinomialMax},
        {"alltoall_linear_max", a::kAlltoallLinearMax},
        {"default_chunk_bytes", a::kHostChunkBytes},
        {"default_device_chunk_bytes", a::kDeviceChunkBytes},
        {"allreduce_peer_map_min", a::kAllreducePeerMapMin},
        {"ring_max_ranks", static_cast<size_t>(a::kRingMaxRanks)}};
  }, "The byte thresholds of the automatic choice.");
  algos.def(
      "choose",
      [](const std::string& opName, size_t bytes, int worldSize,
         const std::map<std::string, std::string>& options, bool device) {
        const auto tuning =
            configCall([&] { return ucxb::parseBackendOptions(options).tuning(device); });
        for (size_t i = 0; i < ucxb::algo::kOpCount; ++i) {
          const auto op = static_cast<ucxb::algo::Op>(i);
          if (opName == ucxb::algo::opName(op)) {
            return std::string(
                ucxb::algo::algorithmName(ucxb::algo::choose(tuning, op, bytes, worldSize,
                                                             device)));
          }
        }
        throw py::value_error("unknown op '" + opName + "'");
      },
      py::arg("op"), py::arg("bytes"), py::arg("world_size"),
      py::arg("options") = std::map<std::string, std::string>{}, py::arg("device") = false,
      "The algorithm a group with these options runs for an op of `bytes` bytes of CPU "
      "tensors, or of CUDA tensors with `device` (see selection.h for what `bytes` counts).");

  algos.def(
      "peer_map_applies",
      [](size_t bytes, int worldSize, const std::map<std::string, std::string>& options,
         bool device) {
        const auto tuning =
            configCall([&] { return ucxb::parseBackendOptions(options).tuning(device); });
        return ucxb::algo::peerMapApplies(tuning, bytes, worldSize, device);
      },
      py::arg("bytes"), py::arg("world_size"),
      py::arg("options") = std::map<std::string, std::string>{}, py::arg("device") = false,
      "Whether a group with these options runs an all_reduce of `bytes` bytes as the "
      "peer-mapped pair (device_peer_map; docs/algorithms.md), on a transport that carries "
      "device memory (ucx; others never do).");

  auto cfg = m.def_submodule(
      "config", "The knobs of a group, declared once in csrc/backend_options.cpp.");
  cfg.def("schema", [] { return schemaRows(ucxb::backendOptionsSchema()); },
          "One row per knob (internal ones included): name, kind, default, allowed, help, "
          "choices, min, max, internal.");
  cfg.def(
      "normalize",
      [](const std::string& name, const std::string& value) {
        return configCall(
            [&] { return ucxb::backendOptionsSchema().normalizeValue(name, value); });
      },
      py::arg("name"), py::arg("value"),
      "The canonical text of a knob's value; ValueError naming what is allowed if it is bad.");
  cfg.def(
      "parse_size",
      [](const std::string& text) {
        const auto bytes = ucxb::config::parseSize(text);
        if (!bytes) {
          ucxb::throwBadOption("", "'" + text +
                                       "' is not a size (digits with an optional K/M/G/T "
                                       "unit, 1024^n, e.g. 4M or 4MiB)");
        }
        return *bytes;
      },
      py::arg("text"), "Bytes in a size such as '4194304', '4M' or '4 MiB' (the one size parser).");
  cfg.def("format_size", &ucxb::config::formatSize, py::arg("bytes"));

  auto udp = m.def_submodule("udp", "The udp transport's configuration (transports/udp/).");
  udp.def("config_keys", &ucxb::udp::udpConfigKeys);
  udp.def("fault_keys", &ucxb::udp::faultConfigKeys);
  udp.def("config_schema", [] { return schemaRows(ucxb::udp::udpConfigSchema()); },
          "One row per udp_config key: name, kind, default, allowed, help.");
  udp.def("fault_schema", [] { return schemaRows(ucxb::udp::faultConfigSchema()); },
          "One row per udp_faults key.");
  udp.def(
      "describe_config",
      [](const std::string& text) {
        return configCall([&] { return ucxb::udp::describe(ucxb::udp::parseUdpConfig(text)); });
      },
      py::arg("text") = "",
      "Every knob of the reliability layer after applying `text` (raises ValueError if bad).");
  udp.def(
      "describe_faults",
      [](const std::string& text) {
        return configCall([&] {
          // One section per path, ';'-separated (faults.h).
          std::string out;
          for (const auto& path : ucxb::udp::parseFaultPaths(text)) {
            out += (out.empty() ? "" : ";") + ucxb::udp::describe(path);
          }
          return out;
        });
      },
      py::arg("text") = "");

  udp.def(
      "socket_buffers",
      [](const std::string& host, const std::string& udpConfig) {
        // What the kernel grants a udp group's socket: without root (SO_RCVBUFFORCE) it caps
        // the request at net.core.rmem_max / wmem_max.
        const auto config = configCall([&] { return ucxb::udp::parseUdpConfig(udpConfig); });
        const ucxb::udp::UdpSocket socket(ucxb::udp::SocketAddress::parse(host, 0),
                                          static_cast<int>(config.socketBufferBytes));
        return std::make_pair(socket.receiveBufferBytes(), socket.sendBufferBytes());
      },
      py::arg("host") = "127.0.0.1", py::arg("udp_config") = "",
      "(receive, send) buffer bytes the kernel gives a socket of a udp group with `udp_config` "
      "bound to `host`.");

  auto tags = m.def_submodule("tags", "The 64-bit tag layout (transports/tag.h), for tests.");
  tags.def("collective", &ucxb::tag::collective, py::arg("group"), py::arg("seq"),
           py::arg("step"), py::arg("src"));
  tags.def("p2p", &ucxb::tag::p2p, py::arg("group"), py::arg("user_tag"), py::arg("src"));
  tags.def("fields", [](uint64_t t) {
    return py::dict(py::arg("p2p") = ucxb::tag::isP2P(t), py::arg("group") = ucxb::tag::group(t),
                    py::arg("seq") = ucxb::tag::seq(t), py::arg("step") = ucxb::tag::step(t),
                    py::arg("user") = ucxb::tag::user(t), py::arg("src") = ucxb::tag::source(t));
  });
  tags.def("group_hash", [](const std::string& id) { return ucxb::tag::groupHash(id.c_str()); });
  tags.attr("ANY_SOURCE_MASK") = ucxb::tag::kAnySourceMask;
  tags.attr("MAX_RANKS") = ucxb::tag::kMaxRanks;
  tags.attr("MAX_STEPS") = ucxb::tag::kMaxSteps;
  tags.attr("SEQ_WINDOW") = ucxb::tag::kSeqMask + 1;
}
