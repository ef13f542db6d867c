// Peer mapping over UCX (Transport::exposeMemory, mapPeerMemory): a rank registers a CUDA
// buffer (ucp_mem_map) and packs its remote key (ucp_rkey_pack); the peer unpacks the key on
// its endpoint (ucp_ep_rkey_unpack) and asks for a local pointer to the buffer
// (ucp_rkey_ptr). For device memory of a peer on this node, UCX's cuda_ipc memory domain
// answers it with cuIpcOpenMemHandle (or its VMM/fabric-handle equivalents) through its IPC
// cache, keyed by the exporting process, device and allocation: a buffer mapped again is a
// cache hit. Every UCX handle here has one owner that releases it; every status is checked.
//
// What UCX 1.22 does with the mapping (src/uct/cuda/cuda_ipc/cuda_ipc_md.c and
// cuda_ipc_cache.c at v1.22.0):
// * rkey_ptr maps on the device current on the calling thread (cuCtxGetDevice), so the
//   caller makes the op's device current first (the backend's DeviceScope does).
// * the pointer points into the whole allocation of the exporter (the key covers
//   cuMemGetAddressRange's range, as the caching allocator's segment), at the buffer's offset.
// * the mapping stays in the IPC cache after ucp_rkey_destroy (1.22 keeps no reference per
//   key; later versions drop one there and unmap once the cache is disabled), until the
//   exporter's allocation is replaced (a new buffer id at that address) or the cache evicts it.
//   The pointer is used only while the key is alive, and the key outlives every read, but
//   for one case: an op whose wait for the device ends in its timeout while a fold or copy
//   through the mapping is still queued lets the key go as it unwinds, before the backend
//   drains the stream (transport_backend.cpp). Harmless with 1.22, whose cache keeps the
//   mapping; a UCX that unmaps at ucp_rkey_destroy would need the key held to the drain.
// * host memory is refused here: of 1.22's domains only xpmem maps arbitrary host memory of
//   another process (sysv and posix only their own segments), and host memory on one host has
//   the backend's shared-memory staging.
// * ucp_mem_map registers the buffer with every domain that takes device memory (cuda_copy,
//   cuda_ipc, gdr_copy, and an RDMA NIC's where GPUDirect is set up), and fails if one of them
//   fails: an exposure that throws falls back (auto) or fails the op (on).
#pragma once

#include <ucp/api/ucp.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "transports/transport.h"

namespace ucxb::ucx {

// An unpacked remote key that its endpoint's owner can release before the endpoint goes
// (ucp_rkey_destroy must come before the endpoint it was unpacked on is destroyed): the
// transport releases every live one of a peer in abortPeer and in its destructor, the
// mapping releases its own when it goes first.
class RemoteKey {
 public:
  explicit RemoteKey(ucp_rkey_h rkey) : rkey_(rkey) {}
  ~RemoteKey() { release(); }
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;
  ucp_rkey_h get() const { return rkey_; }
  void release() {
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);
    rkey_ = nullptr;
  }

 private:
  ucp_rkey_h rkey_;
};

// Registers `bytes` of CUDA memory at `data` with `context` and packs its key. Null with `why`
// for memory or a context UCX cannot map so (host memory; no cuda_ipc transport); throws
// TransportError when a UCX call fails.
std::unique_ptr<ExposedMemory> exposeDeviceMemory(ucp_context_h context,
                                                  const std::vector<std::string>& transports,
                                                  void* data, size_t bytes, MemoryType memory,
                                                  std::string& why);

// Unpacks `blob` (exposeDeviceMemory's) on `ep` and maps the buffer it names, of which the
// caller touches `bytes`. Null with `why` where UCX cannot map it into this process (not
// device memory; a peer its cuda_ipc does not reach, on another node or device it cannot
// open); throws TransportError for a malformed blob or a failed UCX call. The key is also
// appended to `live`, for the transport to release if the endpoint goes first.
std::unique_ptr<PeerMapping> mapDeviceMemory(ucp_ep_h ep, int peer,
                                             const std::vector<uint8_t>& blob, size_t bytes,
                                             MemoryType memory,
                                             std::vector<std::weak_ptr<RemoteKey>>& live,
                                             std::string& why);

// Releases every key of `live` still alive and empties it: before their endpoint is closed.
void releaseKeys(std::vector<std::weak_ptr<RemoteKey>>& live);

}  // namespace ucxb::ucx
