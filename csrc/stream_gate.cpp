#include "csrc/stream_gate.hpp"

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <vector>

namespace ucxb {

namespace {

// The few driver API declarations needed (cuda.h's types, spelled out: no CUDA headers).
using CUresult = int;
using CUstream = void*;
using CUdeviceptr = unsigned long long;
constexpr CUresult kCudaSuccess = 0;
constexpr unsigned kWaitValueGeq = 0x0;  // CU_STREAM_WAIT_VALUE_GEQ

struct Driver {
  CUresult (*waitValue64)(CUstream, CUdeviceptr, uint64_t, unsigned) = nullptr;
  CUresult (*hostDevicePointer)(CUdeviceptr*, void*, unsigned) = nullptr;
  bool usable() const { return waitValue64 != nullptr && hostDevicePointer != nullptr; }
};

const Driver& driver() {
  static const Driver d = [] {
    Driver found;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);  // CUDA torch loaded it
    if (lib == nullptr) return found;
    auto sym = [lib](const char* a, const char* b) {
      void* p = dlsym(lib, a);
      return p != nullptr ? p : dlsym(lib, b);
    };
    found.waitValue64 = reinterpret_cast<decltype(found.waitValue64)>(
        sym("cuStreamWaitValue64_v2", "cuStreamWaitValue64"));
    found.hostDevicePointer = reinterpret_cast<decltype(found.hostDevicePointer)>(
        sym("cuMemHostGetDevicePointer_v2", "cuMemHostGetDevicePointer"));
    return found;
  }();
  return d;
}

// Gate words outlive their groups (see stream_gate.hpp).
std::mutex wordsMu;
std::vector<at::Tensor>& words() {
  static auto* kept = new std::vector<at::Tensor>();
  return *kept;
}

}  // namespace

StreamGate::StreamGate(uint64_t* word, uint64_t deviceAddress)
    : word_(word), deviceAddress_(deviceAddress) {}

std::shared_ptr<StreamGate> StreamGate::open(c10::Device device) {
  if (!device.is_cuda() || !driver().usable()) return nullptr;
  at::Tensor word =
      at::zeros({1}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  auto* p = static_cast<uint64_t*>(word.data_ptr());
  CUdeviceptr address = 0;
  if (driver().hostDevicePointer(&address, p, 0) != kCudaSuccess) return nullptr;
  {
    std::lock_guard<std::mutex> lock(wordsMu);
    words().push_back(word);
  }
  return std::shared_ptr<StreamGate>(new StreamGate(p, address));
}

bool StreamGate::holdUntil(const c10::Stream& stream, uint64_t seq) const {
  return driver().waitValue64(static_cast<CUstream>(stream.native_handle()), deviceAddress_, seq,
                              kWaitValueGeq) == kCudaSuccess;
}

void StreamGate::release(uint64_t seq) {
  // Monotonic: ops of a group end in issue order, except that an op refused or abandoned
  // after a failure may end before an earlier one; never move the word back.
  std::atomic_ref<uint64_t> word(*word_);
  uint64_t seen = word.load(std::memory_order_relaxed);
  while (seen < seq && !word.compare_exchange_weak(seen, seq, std::memory_order_release)) {
  }
}

}  // namespace ucxb
