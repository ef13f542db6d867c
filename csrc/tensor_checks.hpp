// Mapping torch dtypes/reduce ops onto the torch-free kernels, and argument validation that
// runs on the caller's thread so bad input raises before anything is sent.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <string>
#include <vector>

#include "csrc/collectives/reduce_kernels.h"

// Declared, not included: its header (torch/csrc/distributed/c10d/Types.hpp) brings in
// torch/custom_class.h, ~5 s of every compile that includes this one.
namespace c10d {
struct ReduceOp;
}  // namespace c10d

namespace ucxb {

std::optional<DType> toDType(at::ScalarType type);

// "float32[4, 8]" for messages.
std::string describe(const at::Tensor& t);
std::string describe(const std::vector<at::Tensor>& ts);

// An op's input tensors, for the call that issues the op (a view: nothing is copied, and
// the caller's tensors outlive the call), and their description for messages (describe()).
// The Flight Recorder records their sizes and dtypes.
struct OpInputs {
  OpInputs() = default;
  OpInputs(const at::Tensor& t) : tensors(t), text(describe(t)) {}  // NOLINT: implicit
  OpInputs(const std::vector<at::Tensor>& ts) : tensors(ts), text(describe(ts)) {}  // NOLINT
  c10::ArrayRef<at::Tensor> tensors;
  std::string text;
  // What the ranks must pass alike besides the op and the dtype (-1: the op has none): the
  // reduce op and the root. They go into the op's tags (TransportBackend::enqueue).
  int reduceOp = -1;
  int root = -1;

  OpInputs&& agreeing(int reduceOpOf, int rootOf) && {
    reduceOp = reduceOpOf;
    root = rootOf;
    return std::move(*this);
  }
};

struct Checker {
  std::string op;
  int rank;
  int size;
  std::string backend = "ucx";
  bool cuda = false;  // CUDA tensors are allowed (the group's `cuda` option)

  [[noreturn]] void fail(const std::string& problem) const;
  // Dense, a supported dtype, on the CPU or (with `cuda`) a CUDA device, and on the same
  // device as every tensor checked before it.
  DType tensor(const at::Tensor& t, const char* role = "tensor") const;
  // Every check of tensor() but the dtype's: for send and recv, which carry a tensor's bytes
  // without reading them as numbers, so that any dtype goes (uint16/32/64, the float8
  // types), as with Gloo.
  void carried(const at::Tensor& t, const char* role = "tensor") const;
  // The CUDA device of the tensors checked so far; none when they are CPU tensors.
  std::optional<c10::Device> device() const { return device_; }
  void single(const std::vector<at::Tensor>& ts, const char* role = "tensors") const;
  void sameAs(const at::Tensor& ref, const at::Tensor& t, const char* role) const;
  void rank_(int64_t r, const char* role) const;
  // No two of `ts` (the places an op writes each rank's data into) share memory, and `input`,
  // when given, shares none with any of them but ts[inputSlot], which it may be (in place).
  // Else the ranks would write over each other's data, and what is left depends on the order
  // the messages arrive in, which differs across ranks. Only dense tensors are compared (a
  // strided view such as a column may interleave with another without sharing an element).
  void disjoint(const std::vector<at::Tensor>& ts, const char* role,
                const at::Tensor* input = nullptr, int inputSlot = -1) const;
  // No input of an all_to_all shares memory with an output (the receive from rank j may write
  // it while the send to rank i still reads), but input `self` may be output `self` itself
  // (this rank's own block, in place). `outputs` must have passed disjoint() already; an
  // undefined one stands for none (scatter passes only the root's own output).
  // O(n log n) in the world size.
  void inputsApart(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                   int self) const;
  // all_gather_into_tensor's one input against its output (as disjoint() for the list form):
  // a contiguous input shares no memory with the output but where it is block `self` of it
  // (in place). Else the op reads it while other ranks' blocks arrive over it, and copies it
  // into its block with a copy that is a memmove on the host but has no overlap rule on a
  // device (DeviceMemory::copy). A strided input is read once, into a copy, first.
  void ownBlockOrApart(const at::Tensor& input, const at::Tensor& output, int self) const;
  // The reduction for (dtype, op); for AVG and PREMUL_SUM the SUM (the backend scales).
  // `like` is one of the op's tensors, which a refusal names (dtype and shape).
  Reduction reduction(DType dtype, const c10d::ReduceOp& op, const at::Tensor& like) const;

  // What tensor() has seen so far (public only so that Checker stays an aggregate).
  mutable std::optional<c10::Device> device_{};
  mutable bool sawCpu_ = false;
};

// The torch dtype of a DType (the inverse of toDType).
at::ScalarType scalarTypeOf(DType dtype);

}  // namespace ucxb
