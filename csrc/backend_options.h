// Every knob of a ucx or udp process group, declared once in backendOptionsSchema(): name,
// kind, range or choices, help, and the member below it fills (whose initializer is the
// default). Python reads the schema from _C (ucxbackend/config.py builds its knobs from it),
// so adding a knob is one Field here plus the code that uses it. Torch-free.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "csrc/collectives/selection.h"
#include "csrc/engine/progress_engine.h"
#include "csrc/engine/staging_area.h"
#include "transports/config/schema.h"

namespace ucxb {

struct BackendOptions {
  // Set by the Python layer for the group, not by users (FieldInfo::internal).
  std::string transport = "ucx";     // "ucx" or "udp": the registered backend's name
  std::string udpHost = "127.0.0.1";  // udp: the numeric address to bind
  std::string ucxNetDevices;          // ucx: UCX_NET_DEVICES for the group's context

  std::string progressMode = "sleep";
  uint64_t spinUs = 250;
  // 1 MiB: a 2-rank all_reduce that stages through shared memory goes inline up to what its
  // slots hold at once (four 256 KiB pieces by default); measured in docs/performance.md.
  uint64_t inlineBytes = uint64_t{1} << 20;
  std::string logLevel = "WARNING";  // read by the Python layer only (the logging module)
  uint64_t chunkBytes = algo::kHostChunkBytes;
  uint64_t deviceChunkBytes = algo::kDeviceChunkBytes;
  std::array<std::string, algo::kOpCount> algorithms = {"auto", "auto", "auto",
                                                        "auto", "auto", "auto"};
  std::string sharedMemory = "auto";
  std::string sendLane = "auto";  // ucx: transports/ucx/send_lane.h
  std::string oneHostTransport = "auto";  // ucx: transports/shm/shm_transport.h
  std::string stagingStores = "auto";
  std::string ifname;  // read by the Python layer (interface selection, UCX_NET_DEVICES)
  std::string udpConfig;
  std::string udpFaults;
  std::string secretFile;  // udp: authenticated mode (csrc/udp_auth_setup.hpp)
  uint64_t cuda = 1;  // 1: carry CUDA tensors (verified on a GPU, docs/cuda.md#status)
  std::string cudaWait = "host";  // what Work.wait() on a CUDA collective blocks
  // 2-rank all_reduce of CUDA tensors out of the peer's mapped buffer (collectives/peer_map.cpp);
  // "off" until a GPU run has verified it (docs/cuda.md).
  std::string devicePeerMap = "off";

  // What the engine, the algorithms and staging take from these.
  EngineConfig engine() const;
  // For an op on host memory (chunk_bytes), or on device memory (device_chunk_bytes).
  algo::Tuning tuning(bool deviceMemory = false) const;
  bool stagingWanted() const { return sharedMemory == "auto"; }
  SlotStores slotStores() const;
};

const config::Schema<BackendOptions>& backendOptionsSchema();

// The settings every rank of the group must share (FieldInfo::mustAgree), canonical, in
// schema order: what the group's address records carry (csrc/handshake.h), once withKeyCheck
// (csrc/udp_auth_setup.hpp) has put secret_file's key check in place of its path.
std::vector<config::Setting> agreedSettings(const BackendOptions& options);

// The options of one group from the name -> text map Python hands over. Throws
// config::ConfigError naming the knob, the value and what is allowed (an unknown name too).
BackendOptions parseBackendOptions(const std::map<std::string, std::string>& options);

}  // namespace ucxb
