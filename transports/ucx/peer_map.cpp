#include "transports/ucx/peer_map.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <utility>

#include "transports/ucx/ucx_status.h"

namespace ucxb::ucx {

namespace {

// What a blob starts with, before the packed remote key: where the buffer is in the
// exporter's address space (ucp_rkey_ptr's raddr) and how long the exposed part is.
struct BlobHeader {
  uint64_t address;
  uint64_t bytes;
};

// The registration of a buffer with a context (ucp_mem_map), undone with it.
class MemoryHandle {
 public:
  MemoryHandle(ucp_context_h context, ucp_mem_h memh) : context_(context), memh_(memh) {}
  // ucp_mem_unmap fails only for a handle UCX does not know (UCS_ERR_INVALID_PARAM), which
  // one owner per handle rules out; a destructor has no caller to tell, so the status is
  // asserted in debug builds and otherwise dropped.
  ~MemoryHandle() {
    [[maybe_unused]] const ucs_status_t status = ucp_mem_unmap(context_, memh_);
    assert(status == UCS_OK);
  }
  MemoryHandle(const MemoryHandle&) = delete;
  MemoryHandle& operator=(const MemoryHandle&) = delete;
  ucp_mem_h get() const { return memh_; }

 private:
  ucp_context_h context_;
  ucp_mem_h memh_;
};

// A packed remote key as ucp_rkey_pack returns it, released with ucp_rkey_buffer_release.
// Not ucp_memh_pack, its successor: UCX 1.22 packs only exported handles through it, and
// aborts the process (ucs_fatal "packing rkey using ucp_memh_pack() is unsupported") for a
// remote key (src/ucp/core/ucp_rkey.c, ucp_memh_packed_size).
struct PackedKeyDeleter {
  void operator()(void* buffer) const { ucp_rkey_buffer_release(buffer); }
};
using PackedKey = std::unique_ptr<void, PackedKeyDeleter>;

class UcxExposed final : public ExposedMemory {
 public:
  UcxExposed(std::unique_ptr<MemoryHandle> handle, std::vector<uint8_t> blob)
      : handle_(std::move(handle)), blob_(std::move(blob)) {}
  const std::vector<uint8_t>& blob() const override { return blob_; }

 private:
  std::unique_ptr<MemoryHandle> handle_;
  std::vector<uint8_t> blob_;
};

class UcxMapping final : public PeerMapping {
 public:
  UcxMapping(std::shared_ptr<RemoteKey> key, void* data) : key_(std::move(key)), data_(data) {}
  void* data() const override { return data_; }

 private:
  std::shared_ptr<RemoteKey> key_;  // the pointer is valid while the key is (peer_map.h)
  void* data_;
};

bool unreachable(ucs_status_t status) {
  return status == UCS_ERR_UNREACHABLE || status == UCS_ERR_UNSUPPORTED;
}

}  // namespace

std::unique_ptr<ExposedMemory> exposeDeviceMemory(ucp_context_h context,
                                                  const std::vector<std::string>& transports,
                                                  void* data, size_t bytes, MemoryType memory,
                                                  std::string& why) {
  if (memory != MemoryType::kCuda) {
    why = "ucx maps only device memory between ranks";
    return nullptr;
  }
  if (std::find(transports.begin(), transports.end(), "cuda_ipc") == transports.end()) {
    why = "this rank's UCP context has no cuda_ipc transport (UCX_TLS, or no CUDA driver)";
    return nullptr;
  }
  if (bytes == 0) {
    why = "an empty buffer has nothing to map";
    return nullptr;
  }
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = data;
  params.length = bytes;
  params.memory_type = UCS_MEMORY_TYPE_CUDA;
  ucp_mem_h memh = nullptr;
  check(ucp_mem_map(context, &params, &memh), "ucp_mem_map of a CUDA buffer to expose");
  auto handle = std::make_unique<MemoryHandle>(context, memh);
  void* packed = nullptr;
  size_t packedBytes = 0;
  check(ucp_rkey_pack(context, handle->get(), &packed, &packedBytes),
        "ucp_rkey_pack of an exposed CUDA buffer");
  const PackedKey key(packed);
  std::vector<uint8_t> blob(sizeof(BlobHeader) + packedBytes);
  const BlobHeader header{reinterpret_cast<uintptr_t>(data), bytes};
  std::memcpy(blob.data(), &header, sizeof(header));
  std::memcpy(blob.data() + sizeof(header), key.get(), packedBytes);
  return std::make_unique<UcxExposed>(std::move(handle), std::move(blob));
}

std::unique_ptr<PeerMapping> mapDeviceMemory(ucp_ep_h ep, int peer,
                                             const std::vector<uint8_t>& blob, size_t bytes,
                                             MemoryType memory,
                                             std::vector<std::weak_ptr<RemoteKey>>& live,
                                             std::string& why) {
  if (memory != MemoryType::kCuda) {
    why = "ucx maps only device memory between ranks";
    return nullptr;
  }
  BlobHeader header{};
  if (blob.size() <= sizeof(header)) {
    throw TransportError("the exposed buffer of " + peerLabel(peer) + " came as " +
                             std::to_string(blob.size()) + " bytes, too short for a key",
                         peer);
  }
  std::memcpy(&header, blob.data(), sizeof(header));
  if (bytes > header.bytes) {
    throw TransportError(peerLabel(peer) + " exposed " + std::to_string(header.bytes) +
                             " bytes, " + std::to_string(bytes) + " to be mapped",
                         peer);
  }
  ucp_rkey_h rkey = nullptr;
  ucs_status_t status = ucp_ep_rkey_unpack(ep, blob.data() + sizeof(header), &rkey);
  if (unreachable(status)) {
    why = describe(status, "ucp_ep_rkey_unpack of " + peerLabel(peer) + "'s key");
    return nullptr;
  }
  check(status, "ucp_ep_rkey_unpack of " + peerLabel(peer) + "'s key", peer);
  auto key = std::make_shared<RemoteKey>(rkey);
  void* local = nullptr;
  status = ucp_rkey_ptr(key->get(), header.address, &local);
  if (unreachable(status)) {
    why = describe(status, "ucp_rkey_ptr to " + peerLabel(peer) + "'s buffer");
    return nullptr;
  }
  check(status, "ucp_rkey_ptr to " + peerLabel(peer) + "'s buffer", peer);
  // Forget keys released since: the list stays as long as the mappings alive at once.
  live.erase(std::remove_if(live.begin(), live.end(),
                            [](const std::weak_ptr<RemoteKey>& k) { return k.expired(); }),
             live.end());
  live.push_back(key);
  return std::make_unique<UcxMapping>(std::move(key), local);
}

void releaseKeys(std::vector<std::weak_ptr<RemoteKey>>& live) {
  for (auto& weak : live) {
    if (auto key = weak.lock()) key->release();
  }
  live.clear();
}

}  // namespace ucxb::ucx
