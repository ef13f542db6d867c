#include "csrc/device_memory.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/minimum.h>
#include <c10/core/StreamGuard.h>

#include <string>

#include "csrc/tensor_checks.hpp"

namespace ucxb {

namespace {

at::Tensor onHost(const void* data, int64_t bytes) {
  return at::from_blob(const_cast<void*>(data), {bytes}, at::TensorOptions().dtype(at::kByte));
}

}  // namespace

void DeviceMemory::finish(const char* what) const {
  drainStream(stream_, done_, deadline_, what);
}

at::Tensor DeviceMemory::onDevice(const void* data, int64_t count, at::ScalarType type) const {
  return at::from_blob(const_cast<void*>(data), {count},
                       at::TensorOptions().dtype(type).device(device_));
}

void DeviceMemory::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  c10::StreamGuard guard(stream_);
  const auto n = static_cast<int64_t>(bytes);
  onDevice(dst, n, at::kByte).copy_(onDevice(src, n, at::kByte), /*non_blocking=*/true);
  finish("a copy on the device");
}

// The same element-wise definitions as the host kernels (reduce_kernels.h): bool's sum and
// max are logical or, its product and min logical and.
void DeviceMemory::reduce(const Reduction& red, void* acc, const void* in, size_t count) {
  if (count == 0) return;
  c10::StreamGuard guard(stream_);
  const at::ScalarType type = scalarTypeOf(red.dtype);
  const auto n = static_cast<int64_t>(count);
  at::Tensor a = onDevice(acc, n, type);
  const at::Tensor b = onDevice(in, n, type);
  const bool logical = red.dtype == DType::kBool;
  switch (red.kind) {
    case ReduceKind::kSum:
    case ReduceKind::kMax:
      if (logical) {
        at::logical_or_out(a, a, b);
      } else if (red.kind == ReduceKind::kSum) {
        a.add_(b);
      } else {
        red.swapped ? at::maximum_out(a, b, a) : at::maximum_out(a, a, b);
      }
      break;
    case ReduceKind::kProduct:
    case ReduceKind::kMin:
      if (logical) {
        at::logical_and_out(a, a, b);
      } else if (red.kind == ReduceKind::kProduct) {
        a.mul_(b);
      } else {
        red.swapped ? at::minimum_out(a, b, a) : at::minimum_out(a, a, b);
      }
      break;
    case ReduceKind::kBand: a.bitwise_and_(b); break;
    case ReduceKind::kBor: a.bitwise_or_(b); break;
    case ReduceKind::kBxor: a.bitwise_xor_(b); break;
  }
  finish("a reduction on the device");
}

uint8_t* DeviceMemory::scratch(size_t bytes) {
  // Allocated at issue on the caller's thread (device_op.hpp): an allocation here, on the
  // progress thread, could wait for a stream that a wait() holds until this very op ends.
  const size_t have = scratch_ ? scratch_->buffer.nbytes() : 0;
  if (bytes > have) {
    throw OpFailed("internal: the algorithm asked for " + std::to_string(bytes) +
                   " bytes of device scratch, and " + std::to_string(have) +
                   " were allocated when the op was issued (algo::scratchBytes)");
  }
  return have == 0 ? nullptr : static_cast<uint8_t*>(scratch_->buffer.data_ptr());
}

uint8_t* DeviceMemory::hostBuffer(size_t bytes, std::shared_ptr<void>& owner) {
  // Pinned (page-locked) memory: the device copies into and out of it directly. Allocated here,
  // on the progress thread: an op that stages (udp) is never held at the gate
  // (device_holds.hpp), and its wait() blocks the host instead.
  auto buffer = std::make_shared<at::Tensor>(
      at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))},
                at::TensorOptions().dtype(at::kByte).pinned_memory(true)));
  auto* data = static_cast<uint8_t*>(buffer->data_ptr());
  owner = std::move(buffer);
  return data;
}

void DeviceMemory::toHost(void* host, const void* src, size_t bytes) {
  if (bytes == 0) return;
  c10::StreamGuard guard(stream_);
  const auto n = static_cast<int64_t>(bytes);
  onHost(host, n).copy_(onDevice(src, n, at::kByte), /*non_blocking=*/true);
  finish("a copy from the device to host staging");
}

void DeviceMemory::fromHost(void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return;
  c10::StreamGuard guard(stream_);
  const auto n = static_cast<int64_t>(bytes);
  onDevice(dst, n, at::kByte).copy_(onHost(host, n), /*non_blocking=*/true);
  finish("a copy from host staging to the device");
}

}  // namespace ucxb
