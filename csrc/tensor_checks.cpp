#include "csrc/tensor_checks.hpp"

#include <ATen/MemoryOverlap.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "csrc/errors.hpp"

namespace ucxb {

std::optional<DType> toDType(at::ScalarType type) {
  switch (type) {
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kChar: return DType::kInt8;
    case at::kByte: return DType::kUInt8;
    case at::kShort: return DType::kInt16;
    case at::kInt: return DType::kInt32;
    case at::kLong: return DType::kInt64;
    case at::kBool: return DType::kBool;
    case at::kComplexFloat: return DType::kComplex64;
    case at::kComplexDouble: return DType::kComplex128;
    default: return std::nullopt;
  }
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) {
    return "undefined";
  }
  // Every op describes its inputs when it is issued (OpInputs), so this stays off
  // std::ostringstream, whose construction alone cost a few hundred ns of each small op
  // (perf, docs/performance.md): "Float[4, 8]", as c10's operator<< of the sizes writes it.
  std::string s = c10::toString(t.scalar_type());
  s += '[';
  char digits[24];
  bool first = true;
  for (const int64_t d : t.sizes()) {
    if (!first) s += ", ";
    first = false;
    const auto end = std::to_chars(digits, digits + sizeof(digits), d).ptr;
    s.append(digits, end);
  }
  s += ']';
  if (t.device().type() != at::kCPU) {
    s += " on " + t.device().str();
  }
  return s;
}

std::string describe(const std::vector<at::Tensor>& ts) {
  if (ts.size() == 1) {
    return describe(ts[0]);
  }
  std::string s = std::to_string(ts.size()) + " tensors";
  if (!ts.empty()) {
    s += " like " + describe(ts[0]);
  }
  return s;
}

namespace {

// Whether two elements of `t` are one memory location. torch's has_internal_overlap answers
// yes only for a zero stride (an expanded view) and "too hard" for every other layout that
// is not dense, among them views whose elements overlap without a zero stride
// (as_strided({3, 2}, {1, 1})), which a recv or all_reduce wrote element by element, the
// last copy winning. Decided here: a layout whose dims, taken by stride, each step past
// the extent of the smaller ones overlaps nowhere (slices, transposes, strided views: no
// cost beyond the sort of a few dims); what is left, a layout made by hand, has every
// element's offset compared, up to kOffsetsCompared elements: past that (a 32 MiB list of
// offsets) it is taken as torch takes "too hard", as not shared.
constexpr int64_t kOffsetsCompared = int64_t{1} << 22;

bool sharesElements(const at::Tensor& t) {
  const auto overlap = at::has_internal_overlap(t);
  if (overlap != at::MemOverlap::TooHard || t.numel() == 0) {
    return overlap == at::MemOverlap::Yes;
  }
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t extent = 0;  // the offsets the dims so far reach lie in [0, extent]
  bool apart = true;
  for (const auto& [stride, size] : dims) {
    if (stride <= extent) {
      apart = false;
      break;
    }
    extent += stride * (size - 1);
  }
  if (apart || t.numel() > kOffsetsCompared) return false;
  std::vector<int64_t> offsets{0};
  offsets.reserve(static_cast<size_t>(t.numel()));
  for (const auto& [stride, size] : dims) {
    const size_t n = offsets.size();
    for (int64_t i = 1; i < size; ++i) {
      for (size_t j = 0; j < n; ++j) offsets.push_back(offsets[j] + i * stride);
    }
  }
  std::sort(offsets.begin(), offsets.end());
  return std::adjacent_find(offsets.begin(), offsets.end()) != offsets.end();
}

}  // namespace

void Checker::fail(const std::string& problem) const { throwInvalid(op, rank, problem, backend); }

DType Checker::tensor(const at::Tensor& t, const char* role) const {
  carried(t, role);
  auto dt = toDType(t.scalar_type());
  if (!dt) {
    fail(std::string(role) + " has unsupported dtype " + describe(t));
  }
  return *dt;
}

void Checker::carried(const at::Tensor& t, const char* role) const {
  if (!t.defined()) {
    fail(std::string(role) + " is undefined");
  }
  if (t.is_cuda()) {
    if (!cuda) {
      fail(std::string(role) + " " + describe(t) + " is a CUDA tensor; the " + backend +
           " backend was told to refuse CUDA tensors (UCXBACKEND_CUDA=0 or the option "
           "cuda=0): unset it, or set it to 1");
    }
    if (sawCpu_ || (device_ && *device_ != t.device())) {
      fail(std::string(role) + " " + describe(t) + " is on another device than the op's " +
           (device_ ? "other tensors (" + device_->str() + ")" : std::string("CPU tensors")) +
           "; all tensors of one op must be on one device");
    }
    device_ = t.device();
  } else if (t.device().type() != at::kCPU) {
    fail(std::string(role) + " " + describe(t) + " is on an unsupported device; the " +
         backend + " backend carries CPU and CUDA tensors");
  } else {
    if (device_) {
      fail(std::string(role) + " " + describe(t) + " is a CPU tensor but the op's other "
           "tensors are on " + device_->str() + "; all tensors of one op must be on one device");
    }
    sawCpu_ = true;
  }
  if (t.layout() != at::kStrided) {
    fail(std::string(role) + " " + describe(t) + " is sparse; only dense tensors are supported");
  }
  // The op writes into every tensor but an input (and send's): one whose elements share
  // memory (an expanded view) could only be written on the progress thread, after the
  // exchange, where torch refuses and the group fails with a message naming no op (or,
  // where torch cannot tell, keeps whichever element was copied last).
  if (std::string_view(role) != "input" && op != "send" && sharesElements(t)) {
    fail(std::string(role) + " " + describe(t) + " has elements that share memory (an " +
         "expanded or as_strided view?) and the op writes into it; pass a tensor of its own " +
         "(.clone())");
  }
}

void Checker::single(const std::vector<at::Tensor>& ts, const char* role) const {
  if (ts.size() != 1) {
    fail(std::string("expects exactly one tensor in ") + role + ", got " +
         std::to_string(ts.size()));
  }
}

void Checker::sameAs(const at::Tensor& ref, const at::Tensor& t, const char* role) const {
  if (t.scalar_type() != ref.scalar_type() || t.numel() != ref.numel()) {
    fail(std::string(role) + " " + describe(t) + " does not match " + describe(ref) +
         " (same dtype and number of elements required)");
  }
}

void Checker::rank_(int64_t r, const char* role) const {
  if (r < 0 || r >= size) {
    fail(std::string(role) + " " + std::to_string(r) + " is out of range for a group of " +
         std::to_string(size) + " ranks");
  }
}

namespace {

// The bytes a dense tensor covers, for Checker::disjoint; none for an empty or strided one.
struct Span {
  const void* storage = nullptr;
  uintptr_t begin = 0;
  uintptr_t end = 0;
  size_t index = 0;
};

std::optional<Span> spanOf(const at::Tensor& t, size_t index) {
  if (!t.defined() || t.numel() == 0 || !t.is_non_overlapping_and_dense()) return std::nullopt;
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  return Span{t.storage().unsafeGetStorageImpl(), begin, begin + t.nbytes(), index};
}

// By storage, then start: spans that can overlap end up next to each other.
bool storageOrder(const Span& a, const Span& b) {
  return a.storage != b.storage ? std::less<const void*>()(a.storage, b.storage)
                                : a.begin < b.begin;
}

}  // namespace

void Checker::disjoint(const std::vector<at::Tensor>& ts, const char* role,
                       const at::Tensor* input, int inputSlot) const {
  std::vector<Span> spans;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (auto s = spanOf(ts[i], i)) spans.push_back(*s);
  }
  // Sorted by storage and start, two spans overlap exactly when one starts before the
  // furthest end so far in its storage ends: O(n log n), not a pair-by-pair O(n^2).
  std::sort(spans.begin(), spans.end(), storageOrder);
  for (size_t i = 1, furthest = 0; i < spans.size(); ++i) {
    const Span& far = spans[furthest];
    if (spans[i].storage == far.storage && spans[i].begin < far.end) {
      const auto [a, b] = std::minmax(far.index, spans[i].index);
      fail(std::string(role) + " tensors " + std::to_string(a) + " and " + std::to_string(b) +
           " (" + describe(ts[a]) + ", " + describe(ts[b]) + ") share memory, and the op " +
           "writes a different rank's data into each; pass tensors that do not overlap");
    }
    if (spans[i].storage != far.storage || spans[i].end > far.end) furthest = i;
  }
  if (input == nullptr) return;
  const auto in = spanOf(*input, 0);
  if (!in) return;
  for (const Span& s : spans) {
    if (s.storage != in->storage || s.begin >= in->end || in->begin >= s.end) continue;
    const auto& out = ts[s.index];
    const bool inPlace = static_cast<int>(s.index) == inputSlot && s.begin == in->begin &&
                         s.end == in->end && out.strides() == input->strides();
    if (inPlace) continue;
    fail("input " + describe(*input) + " shares memory with " + role + " tensor " +
         std::to_string(s.index) + " (" + describe(out) + "), which the op overwrites with " +
         "rank " + std::to_string(s.index) + "'s data; pass an input of its own, or " + role +
         " tensor " + std::to_string(inputSlot) + " itself (in place)");
  }
}

void Checker::inputsApart(const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs, int self) const {
  std::vector<Span> outs;
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (auto s = spanOf(outputs[j], j)) outs.push_back(*s);
  }
  std::sort(outs.begin(), outs.end(), storageOrder);  // disjoint: one holds any byte
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto in = spanOf(inputs[i], i);
    if (!in) continue;
    // The outputs of the input's storage that start before its end, back from the last of
    // them while they still reach into it.
    const Span key{in->storage, in->end, 0, 0};
    auto it = std::lower_bound(outs.begin(), outs.end(), key, storageOrder);
    while (it != outs.begin()) {
      const Span& o = *--it;
      if (o.storage != in->storage || o.end <= in->begin) break;
      const auto& out = outputs[o.index];
      const bool inPlace = static_cast<int>(i) == self && static_cast<int>(o.index) == self &&
                           o.begin == in->begin && o.end == in->end &&
                           out.strides() == inputs[i].strides();
      if (inPlace) continue;
      fail("input tensor " + std::to_string(i) + " (" + describe(inputs[i]) +
           ") shares memory with output tensor " + std::to_string(o.index) + " (" +
           describe(out) + "), which the op overwrites with rank " + std::to_string(o.index) +
           "'s data while the input may still be read; pass inputs apart from the outputs " +
           "(input " + std::to_string(self) + " may be output " + std::to_string(self) +
           " itself)");
    }
  }
}

void Checker::ownBlockOrApart(const at::Tensor& input, const at::Tensor& output, int self) const {
  if (!input.is_contiguous()) return;
  const auto in = spanOf(input, 0);
  const auto out = spanOf(output, 0);
  if (!in || !out || in->storage != out->storage || in->begin >= out->end ||
      out->begin >= in->end) {
    return;
  }
  if (in->begin == out->begin + static_cast<uintptr_t>(self) * input.nbytes()) return;
  fail("input " + describe(input) + " shares memory with output " + describe(output) +
       " elsewhere than at rank " + std::to_string(self) + "'s block, which other ranks' " +
       "blocks overwrite while the input is still read; pass an input of its own, or block " +
       std::to_string(self) + " of the output itself (in place)");
}

at::ScalarType scalarTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return at::kHalf;
    case DType::kBFloat16: return at::kBFloat16;
    case DType::kFloat32: return at::kFloat;
    case DType::kFloat64: return at::kDouble;
    case DType::kInt8: return at::kChar;
    case DType::kUInt8: return at::kByte;
    case DType::kInt16: return at::kShort;
    case DType::kInt32: return at::kInt;
    case DType::kInt64: return at::kLong;
    case DType::kBool: return at::kBool;
    case DType::kComplex64: return at::kComplexFloat;
    case DType::kComplex128: return at::kComplexDouble;
  }
  return at::kByte;  // unreachable: every DType is listed
}

Reduction Checker::reduction(DType dtype, const c10d::ReduceOp& op,
                              const at::Tensor& like) const {
  ReduceKind kind;
  std::string name;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: kind = ReduceKind::kSum; break;
    case c10d::ReduceOp::PRODUCT: kind = ReduceKind::kProduct; break;
    case c10d::ReduceOp::MIN: kind = ReduceKind::kMin; break;
    case c10d::ReduceOp::MAX: kind = ReduceKind::kMax; break;
    case c10d::ReduceOp::BAND: kind = ReduceKind::kBand; break;
    case c10d::ReduceOp::BOR: kind = ReduceKind::kBor; break;
    case c10d::ReduceOp::BXOR: kind = ReduceKind::kBxor; break;
    case c10d::ReduceOp::AVG:
    case c10d::ReduceOp::PREMUL_SUM: {
      const char* which = op.op_ == c10d::ReduceOp::AVG ? "AVG" : "PREMUL_SUM";
      if (dtype == DType::kBool || (dtype >= DType::kInt8 && dtype <= DType::kInt64)) {
        fail(std::string(which) + " is not supported for integer or bool dtype " +
             dtypeName(dtype) + " (tensor " + describe(like) + "); use SUM and divide");
      }
      kind = ReduceKind::kSum;
      break;
    }
    default:
      fail("reduce op " + std::to_string(static_cast<int>(op.op_)) + " is not supported (tensor " +
           describe(like) + ")");
  }
  const Reduction red = makeReduction(dtype, kind);
  if (red.fn == nullptr) {
    fail(std::string("reduce op ") + reduceName(kind) + " is not defined for dtype " +
         dtypeName(dtype) + " (tensor " + describe(like) + ")");
  }
  return red;
}

}  // namespace ucxb
