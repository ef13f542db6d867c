// Mapping torch dtypes/reduce ops onto the torch-free kernels, and argument validation that
// runs on the caller's thread so bad input raises before anything is sent.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>
#include <string>
#include <vector>

#include "csrc/collectives/reduce_kernels.h"

namespace ucxb {

std::optional<DType> toDType(at::ScalarType type);

// "float32[4, 8]" for messages.
std::string describe(const at::Tensor& t);
std::string describe(const std::vector<at::Tensor>& ts);

struct Checker {
  std::string op;
  int rank;
  int size;
  std::string backend = "ucx";

  [[noreturn]] void fail(const std::string& problem) const;
  // CPU, dense, a supported dtype.
  DType tensor(const at::Tensor& t, const char* role = "tensor") const;
  void single(const std::vector<at::Tensor>& ts, const char* role = "tensors") const;
  void sameAs(const at::Tensor& ref, const at::Tensor& t, const char* role) const;
  void rank_(int64_t r, const char* role) const;
  // The kernel for (dtype, op); for AVG and PREMUL_SUM the SUM kernel (the backend scales).
  ReduceFn reduction(DType dtype, const c10d::ReduceOp& op) const;
};

}  // namespace ucxb
