// The collectives of TransportBackend. Each op validates on the caller's thread, then queues a
// body that stages tensors (contiguous copies only where the user's tensor is not contiguous),
// calls its one algorithm entry point, and writes results back into the user's tensors.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "csrc/collectives/algorithms.h"
#include "csrc/transport_backend.hpp"

namespace ucxb {

namespace {

// A tensor the body made for the op (a packed buffer, a copy), which it frees when it returns
// or throws: held by the Comm past the op's requests (Comm::keep), since one the op gave up
// may still write into it (UCX cannot stop a receive matched to an eager message whose last
// fragments are still arriving).
at::Tensor kept(Comm& comm, at::Tensor t) {
  comm.keep(std::make_shared<at::Tensor>(t));
  return t;
}

// A contiguous tensor holding `user`'s values; copyBack() writes results into `user` when
// they are not the same memory. A copy is the op's own (kept).
struct Staged {
  at::Tensor user;
  at::Tensor flat;
  Staged(Comm& comm, const at::Tensor& t)
      : user(t), flat(t.is_contiguous() ? t : kept(comm, t.contiguous())) {}
  void* data() const { return flat.numel() == 0 ? nullptr : flat.data_ptr(); }
  size_t bytes() const { return flat.nbytes(); }
  void copyBack() const {
    if (!flat.is_same(user)) user.copy_(flat);
  }
};

uint8_t* bytePtr(const at::Tensor& t) { return static_cast<uint8_t*>(t.data_ptr()); }

// Whether Staged makes a copy of none of `ts` (each is its own flat buffer). Asked only for
// CUDA ops: an op whose body copies, packs or clones allocates on the progress thread
// (DeviceNeeds), and so is never held at the gate.
bool allContiguous(const std::vector<at::Tensor>& ts) {
  return std::all_of(ts.begin(), ts.end(), [](const at::Tensor& t) { return t.is_contiguous(); });
}

// PREMUL_SUM by a tensor factor moves the factor to the op's device (preScale): an allocation.
bool scalesByTensor(const c10d::ReduceOp& op) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return false;
  const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  return s == nullptr || s->tensor_factor.defined();
}

// A contiguous tensor's memory as a flat byte tensor (a view).
at::Tensor bytesOf(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), {static_cast<int64_t>(t.nbytes())},
                       t.options().dtype(at::kByte));
}


// All tensors flattened end to end in one new contiguous buffer.
at::Tensor pack(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  flat.reserve(ts.size());
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

// Inverse of pack: buffer slices written back into each tensor.
void unpack(const at::Tensor& buf, const std::vector<at::Tensor>& ts) {
  int64_t at = 0;
  for (const auto& t : ts) {
    t.copy_(buf.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
}

// Both scale in place: no allocation, except a tensor factor moved to the op's device
// (scalesByTensor: such an op counts as allocating).
void preScale(at::Tensor& t, const c10d::ReduceOp& op) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return;
  // NCCLPreMulSumSupplement: the name every torch since 1.13 has (2.13 renamed the struct and
  // kept this alias; 2.11, on the GPU machines, has only this one).
  const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  // Runs in the op's body: errors.cpp's toDistError gives it the op's context.
  if (s == nullptr) throw std::invalid_argument("PREMUL_SUM without a factor");
  if (s->tensor_factor.defined()) {
    t.mul_(s->tensor_factor.to(t.device()));
  } else {
    t.mul_(s->double_factor);
  }
}

void postScale(at::Tensor& t, const c10d::ReduceOp& op, int size) {
  if (op.op_ == c10d::ReduceOp::AVG) t.div_(size);
}

struct ReductionSpec {
  algo::Reduction red;
  DType dtype;
};

// `role` "input" for tensors the op only reads (reduce_scatter's), which may then be
// expanded views; else the op writes its result into them.
ReductionSpec reductionFor(const Checker& c, const std::vector<at::Tensor>& ts,
                           const c10d::ReduceOp& op, const char* role = "tensor") {
  if (ts.empty()) c.fail("expects at least one tensor");
  const DType dt = c.tensor(ts[0], role);
  for (const auto& t : ts) {
    c.tensor(t, role);
    if (t.scalar_type() != ts[0].scalar_type()) {
      c.fail("all tensors must have the same dtype, got " + describe(ts[0]) + " and " +
             describe(t));
    }
  }
  return {c.reduction(dt, op, ts[0]), dt};
}

int rootOf(const Checker& c, int64_t root) {
  c.rank_(root, "root rank");
  return static_cast<int>(root);
}

// gather's outputs / scatter's inputs: at the root one list of size() tensors shaped like
// `like`; elsewhere nothing.
std::vector<at::Tensor> rootList(const Checker& c, int root,
                                 const std::vector<std::vector<at::Tensor>>& lists,
                                 const at::Tensor& like, const char* role) {
  if (c.rank != root) {
    if (!lists.empty() && !lists[0].empty()) {
      c.fail("only the root (rank " + std::to_string(root) + ") may pass " + role + " tensors");
    }
    return {};
  }
  if (lists.size() != 1 || lists[0].size() != static_cast<size_t>(c.size)) {
    c.fail("the root needs one " + std::string(role) + " list of " + std::to_string(c.size) +
           " tensors");
  }
  for (const auto& t : lists[0]) {
    c.tensor(t, role);
    c.sameAs(like, t, role);
  }
  return lists[0];
}

}  // namespace

// --- all_reduce --------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> TransportBackend::allreduceFlat(
    const char* op, c10d::OpType type, const std::vector<at::Tensor>& tensors,
    const c10d::ReduceOp& reduceOp, std::chrono::milliseconds timeout, bool callerWaits) {
  const auto c = checker(op);
  const auto spec = reductionFor(c, tensors, reduceOp);
  const int size = getSize();
  // One exchange (algo::allreducePostable) of a tensor that needs no staging copy: it may run
  // on this thread. Both closures run within enqueue, so they take this frame by reference.
  const at::Tensor& first = tensors[0];
  const bool postable =
      tensors.size() == 1 && first.is_contiguous() && first.numel() > 0 &&
      inlineWanted(first.nbytes()) &&
      algo::allreducePostable(tuning_, static_cast<size_t>(first.numel()), spec.red.elementSize,
                              size, engine_->staging());
  const auto inlineBody = [&first, &spec, &reduceOp, size, callerWaits](Comm& comm) -> Posted {
    at::Tensor buf = first;
    preScale(buf, reduceOp);
    Posted posted{algo::postAllreduce(comm, buf.data_ptr(), static_cast<size_t>(buf.numel()),
                                      spec.red),
                  nullptr, callerWaits};
    // Only AVG scales afterwards: a SUM's op allocates no closure for it.
    if (reduceOp.op_ == c10d::ReduceOp::AVG) {
      posted.after = [buf, reduceOp, size]() mutable { postScale(buf, reduceOp, size); };
    }
    return posted;
  };
  // The queued op's body owns what it reads: it runs later, on the progress thread.
  const auto queuedBody = [&tensors, &spec, &reduceOp, size]() -> Body {
    return [tensors, spec = spec, reduceOp = reduceOp, size](Comm& comm) {
      // One tensor is reduced in place (staged if strided); several are packed.
      const bool single = tensors.size() == 1;
      const Staged staged(comm, single ? tensors[0] : kept(comm, pack(tensors)));
      at::Tensor buf = staged.flat;
      preScale(buf, reduceOp);
      algo::allreduce(comm, staged.data(), static_cast<size_t>(buf.numel()), spec.red);
      postScale(buf, reduceOp, size);
      if (single) {
        staged.copyBack();
      } else {
        unpack(buf, tensors);
      }
    };
  };
  // A CUDA op: its scratch, sized now; it packs several tensors or stages a strided one.
  DeviceNeeds needs;
  if (c.device()) {
    size_t count = 0;
    for (const auto& t : tensors) count += static_cast<size_t>(t.numel());
    needs = reducingNeeds(algo::Op::kAllreduce, count, spec.red.elementSize,
                          tensors.size() != 1 || !first.is_contiguous() || scalesByTensor(reduceOp));
  }
  return enqueue(op, type, c.device(), tensors, OpInputs(tensors).agreeing(reduceOp.op_, -1),
                 timeout, QueuedBody::deferred(queuedBody),
                 postable ? PostBody(inlineBody) : PostBody(), nullptr, needs);
}

c10::intrusive_ptr<c10d::Work> TransportBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  checker("allreduce").single(tensors);
  if (opts.sparseIndices.has_value()) {
    checker("allreduce").fail("sparse all_reduce is not supported");
  }
  // torch sets asyncOp from async_op: false means it calls wait() on the Work at once.
  return allreduceFlat("allreduce", c10d::OpType::ALLREDUCE, tensors, opts.reduceOp,
                       timeoutFor(opts.timeout), !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> TransportBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return allreduceFlat("allreduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors,
                       opts.reduceOp, timeoutFor(opts.timeout), !opts.asyncOp);
}

// --- reduce / broadcast ------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> TransportBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const auto c = checker("reduce");
  c.single(tensors);
  const auto spec = reductionFor(c, tensors, opts.reduceOp);
  const int root = rootOf(c, opts.rootRank);
  const bool isRoot = root == getRank();
  const auto reduceOp = opts.reduceOp;
  const int size = getSize();
  at::Tensor t = tensors[0];
  // A CUDA op: its scratch; a strided tensor is staged, PREMUL_SUM scales a copy off the root.
  const DeviceNeeds needs =
      c.device() ? reducingNeeds(algo::Op::kReduce, static_cast<size_t>(t.numel()),
                                 spec.red.elementSize,
                                 !t.is_contiguous() || reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM)
                 : DeviceNeeds{};
  return enqueue("reduce", c10d::OpType::REDUCE, c.device(), tensors,
                 OpInputs(t).agreeing(reduceOp.op_, root), timeoutFor(opts.timeout),
                 [t, spec, reduceOp, root, isRoot, size](Comm& comm) {
                   // Only the root's tensor receives the result. The algorithm never writes
                   // the other ranks' inputs, so they are sent as they are, except under
                   // PREMUL_SUM, which must scale a copy.
                   const bool scaled = reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM;
                   const Staged staged(comm, t);
                   at::Tensor buf = staged.flat;
                   if (scaled && !isRoot && buf.is_same(t)) buf = kept(comm, buf.clone());
                   preScale(buf, reduceOp);
                   void* data = buf.numel() ? buf.data_ptr() : nullptr;
                   algo::reduce(comm, data, data, static_cast<size_t>(buf.numel()), spec.red,
                                root);
                   if (isRoot) {
                     postScale(buf, reduceOp, size);
                     staged.copyBack();
                   }
                 },
                 nullptr, nullptr, needs);
}

c10::intrusive_ptr<c10d::Work> TransportBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const auto c = checker("broadcast");
  c.single(tensors);
  c.tensor(tensors[0]);
  const int root = rootOf(c, opts.rootRank);
  at::Tensor t = tensors[0];
  return enqueue("broadcast", c10d::OpType::BROADCAST, c.device(), tensors,
                 OpInputs(t).agreeing(-1, root),
                 timeoutFor(opts.timeout), [t, root](Comm& comm) {
                   Staged s(comm, t);
                   algo::broadcast(comm, s.data(), s.bytes(), root);
                   if (comm.rank() != root) s.copyBack();
                 },
                 nullptr, nullptr, c.device() ? movingNeeds(!t.is_contiguous()) : DeviceNeeds{});
}

// --- all_gather family -------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> TransportBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const auto c = checker("allgather");
  c.single(inputs, "inputs");
  if (outputs.size() != 1) c.fail("expects one output list, got " + std::to_string(outputs.size()));
  const at::Tensor in = inputs[0];
  c.tensor(in, "input");
  const auto outs = outputs[0];
  if (outs.size() != static_cast<size_t>(getSize())) {
    c.fail("output list has " + std::to_string(outs.size()) + " tensors for a group of " +
           std::to_string(getSize()) + " ranks");
  }
  for (const auto& o : outs) {
    c.tensor(o, "output");
    c.sameAs(in, o, "output");
  }
  c.disjoint(outs, "output", &in, getRank());
  return enqueue("allgather", c10d::OpType::ALLGATHER, c.device(), outs, in,
                 timeoutFor(opts.timeout), [in, outs](Comm& comm) {
                   Staged src(comm, in);
                   std::vector<Staged> dst;
                   std::vector<void*> ptrs;
                   for (const auto& o : outs) {
                     dst.emplace_back(comm, o);
                     ptrs.push_back(dst.back().data());
                   }
                   algo::allgather(comm, src.data(), ptrs, src.bytes());
                   for (auto& d : dst) d.copyBack();
                 },
                 nullptr, nullptr,
                 c.device() ? movingNeeds(!in.is_contiguous() || !allContiguous(outs))
                            : DeviceNeeds{});
}

// outputs[i] holds size() copies of inputs[i]'s shape, rank-major. One algorithm call for all
// pairs: inputs are packed into one block per rank, gathered, then split back.
c10::intrusive_ptr<c10d::Work> TransportBackend::allgatherFlat(
    const char* op, std::vector<at::Tensor> outputs, std::vector<at::Tensor> inputs,
    std::chrono::milliseconds timeout, const std::function<void()>& alsoIssue) {
  const auto c = checker(op);
  if (inputs.empty() || inputs.size() != outputs.size()) {
    c.fail("expects as many outputs as inputs (and at least one), got " +
           std::to_string(outputs.size()) + " and " + std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.tensor(inputs[i], "input");
    c.tensor(outputs[i], "output");
    if (outputs[i].scalar_type() != inputs[i].scalar_type() ||
        outputs[i].numel() != inputs[i].numel() * getSize()) {
      c.fail("output " + describe(outputs[i]) + " must have the input's dtype and " +
             std::to_string(getSize()) + "x its " + std::to_string(inputs[i].numel()) +
             " elements (input " + describe(inputs[i]) + ")");
    }
  }
  // The zero-copy path below gathers straight into the output.
  if (inputs.size() == 1 && outputs[0].is_contiguous()) {
    c.ownBlockOrApart(inputs[0], outputs[0], getRank());
  }
  return enqueue(op, c10d::OpType::_ALLGATHER_BASE, c.device(), outputs, inputs, timeout,
                 [outputs, inputs](Comm& comm) {
                   const int n = comm.size();
                   if (inputs.size() == 1 && outputs[0].is_contiguous()) {
                     // Zero-copy: receive straight into the output.
                     Staged src(comm, inputs[0]);
                     std::vector<void*> ptrs;
                     for (int r = 0; r < n; ++r) {
                       ptrs.push_back(src.bytes() ? bytePtr(outputs[0]) + r * src.bytes()
                                                  : nullptr);
                     }
                     algo::allgather(comm, src.data(), ptrs, src.bytes());
                     return;
                   }
                   // Pack every input into one block per rank, gather, then unpack.
                   std::vector<Staged> src;
                   size_t block = 0;
                   for (const auto& t : inputs) {
                     src.emplace_back(comm, t);
                     block += src.back().bytes();
                   }
                   // In the inputs' memory (host or device), as byte tensors.
                   const auto byteOpts = inputs[0].options().dtype(at::kByte);
                   at::Tensor send = kept(comm, at::empty({static_cast<int64_t>(block)}, byteOpts));
                   at::Tensor recv =
                       kept(comm, at::empty({static_cast<int64_t>(block * n)}, byteOpts));
                   size_t at = 0;
                   for (const auto& st : src) {
                     if (st.bytes()) send.narrow(0, at, st.bytes()).copy_(bytesOf(st.flat));
                     at += st.bytes();
                   }
                   std::vector<void*> ptrs;
                   for (int r = 0; r < n; ++r) {
                     ptrs.push_back(block ? bytePtr(recv) + r * block : nullptr);
                   }
                   algo::allgather(comm, block ? send.data_ptr() : nullptr, ptrs, block);
                   at = 0;
                   for (size_t i = 0; i < inputs.size(); ++i) {
                     Staged dst(comm, outputs[i]);
                     const size_t len = src[i].bytes();
                     at::Tensor out = len ? bytesOf(dst.flat) : at::Tensor();
                     for (int r = 0; r < n && len > 0; ++r) {
                       out.narrow(0, r * len, len).copy_(recv.narrow(0, r * block + at, len));
                     }
                     dst.copyBack();
                     at += len;
                   }
                 },
                 nullptr, alsoIssue,
                 // Only the zero-copy path of one contiguous input allocates nothing.
                 c.device() ? movingNeeds(inputs.size() != 1 || !outputs[0].is_contiguous() ||
                                          !inputs[0].is_contiguous())
                            : DeviceNeeds{});
}

c10::intrusive_ptr<c10d::Work> TransportBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return allgatherFlat("_allgather_base", {output}, {input}, timeoutFor(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> TransportBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return allgatherFlat("allgather_into_tensor_coalesced", outputs, inputs,
                       timeoutFor(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> TransportBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // outputLists[r][i] receives rank r's inputs[i]: gather into one flat output per input.
  const auto c = checker("allgather_coalesced");
  if (outputLists.size() != static_cast<size_t>(getSize())) {
    c.fail("expects one output list per rank (" + std::to_string(getSize()) + "), got " +
           std::to_string(outputLists.size()));
  }
  std::vector<at::Tensor> flatOutputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.tensor(inputs[i], "input");
    for (const auto& list : outputLists) {
      if (list.size() != inputs.size()) {
        c.fail("each output list needs " + std::to_string(inputs.size()) + " tensors, got " +
               std::to_string(list.size()));
      }
      // Checked as every op's tensors are: the copies into them run in the Future's
      // callback, on the inputs' device and stream, so one on another device (or a CUDA one
      // without the opt-in, beside CPU inputs) would be written outside the op's ordering.
      c.tensor(list[i], "output");
      c.sameAs(inputs[i], list[i], "output");
    }
    flatOutputs.push_back(at::empty({inputs[i].numel() * getSize()}, inputs[i].options()));
  }
  // The Work handed back, which scatters the flat results into the user's lists once
  // gathered, is made under issueMu_ with the gather's (enqueue): both take their numbers
  // there, one after the other. Made after it returned, another thread's op could take a
  // number between them on one rank and not on another, and ops pair by number across ranks.
  c10::intrusive_ptr<TransportWork> work;
  auto inner = allgatherFlat("allgather_coalesced", flatOutputs, inputs, timeoutFor(opts.timeout),
                             [&] {
                               work = makeWork("allgather_coalesced",
                                               c10d::OpType::ALLGATHER_COALESCED, c.device(), {},
                                               inputs, timeoutFor(opts.timeout));
                             });
  std::vector<std::vector<at::Tensor>> lists = outputLists;
  inner->getFuture()->addCallback([work, lists, flatOutputs, device = c.device(),
                                   timeout = timeoutFor(opts.timeout)](c10::ivalue::Future& f) {
    if (f.hasError()) {
      work->finishError(f.exception_ptr());
      return;
    }
    try {
      at::NoGradGuard g;
      for (size_t i = 0; i < flatOutputs.size(); ++i) {
        for (size_t r = 0; r < lists.size(); ++r) {
          const auto n = lists[r][i].numel();
          lists[r][i].copy_(flatOutputs[i].narrow(0, r * n, n).view(lists[r][i].sizes()));
        }
      }
      // A CUDA future runs its callbacks with streams that wait for the inner op; the copies
      // above are final before the Work completes, as every op's outputs are.
      if (device) {
        drainStream(currentStream(*device), Clock::now() + timeout, "the copies into the output lists");
      }
    } catch (...) {
      work->finishError(std::current_exception());
      return;
    }
    work->finishOk();
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> TransportBackend::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  const auto c = checker("gather");
  c.single(inputs, "inputs");
  const at::Tensor in = inputs[0];
  c.tensor(in, "input");
  const int root = rootOf(c, opts.rootRank);
  const std::vector<at::Tensor> outs = rootList(c, root, outputs, in, "output");
  c.disjoint(outs, "output", &in, root);
  return enqueue("gather", c10d::OpType::GATHER, c.device(), outs,
                 OpInputs(in).agreeing(-1, root), timeoutFor(opts.timeout),
                 [in, outs, root](Comm& comm) {
                   Staged src(comm, in);
                   std::vector<Staged> dst;
                   std::vector<void*> ptrs;
                   for (const auto& o : outs) {
                     dst.emplace_back(comm, o);
                     ptrs.push_back(dst.back().data());
                   }
                   algo::gather(comm, src.data(), ptrs, src.bytes(), root);
                   for (auto& d : dst) d.copyBack();
                 },
                 nullptr, nullptr,
                 c.device() ? movingNeeds(!in.is_contiguous() || !allContiguous(outs))
                            : DeviceNeeds{});
}

c10::intrusive_ptr<c10d::Work> TransportBackend::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  const auto c = checker("scatter");
  c.single(outputs, "outputs");
  const at::Tensor out = outputs[0];
  c.tensor(out, "output");
  const int root = rootOf(c, opts.rootRank);
  const std::vector<at::Tensor> ins = rootList(c, root, inputs, out, "input");
  if (!ins.empty()) {
    // At the root, an input for another rank that shares memory with the output is sent
    // while the root's own block is copied over it: that rank got the old data, the new, or
    // (a large message on ucx) some of each. Its own input may be the output (in place).
    std::vector<at::Tensor> outs(ins.size());  // none but the root's own block: no allocation
    outs[root] = out;
    c.inputsApart(ins, outs, root);
  }
  return enqueue("scatter", c10d::OpType::SCATTER, c.device(), outputs,
                 OpInputs(out).agreeing(-1, root),
                 timeoutFor(opts.timeout), [out, ins, root](Comm& comm) {
                   std::vector<Staged> src;
                   std::vector<const void*> ptrs;
                   for (const auto& i : ins) {
                     src.emplace_back(comm, i);
                     ptrs.push_back(src.back().data());
                   }
                   Staged dst(comm, out);
                   algo::scatter(comm, ptrs, dst.data(), dst.bytes(), root);
                   dst.copyBack();
                 },
                 nullptr, nullptr,
                 c.device() ? movingNeeds(!out.is_contiguous() || !allContiguous(ins))
                            : DeviceNeeds{});
}

// --- reduce_scatter family ---------------------------------------------------------------------

// Input i is the concatenation of inputs[i] (one tensor, or reduce_scatter's list of one
// block per rank) and holds size() blocks of outputs[i]'s shape. A single pair is reduced
// straight from the user's input blocks into the output (the algorithm never writes its
// inputs). Several pairs, or PREMUL_SUM (which scales the inputs first), are packed into one
// buffer whose row r holds rank r's block of every input, so one reduce-scatter serves all.
c10::intrusive_ptr<c10d::Work> TransportBackend::reduceScatterFlat(
    const char* op, std::vector<at::Tensor> outputs, std::vector<std::vector<at::Tensor>> inputs,
    const c10d::ReduceOp& reduceOp, std::chrono::milliseconds timeout) {
  const auto c = checker(op);
  if (inputs.empty() || inputs.size() != outputs.size()) {
    c.fail("expects as many outputs as inputs (and at least one)");
  }
  std::vector<at::Tensor> all;
  for (size_t i = 0; i < inputs.size(); ++i) {
    c.tensor(outputs[i], "output");
    int64_t numel = 0;
    for (const auto& part : inputs[i]) {
      all.push_back(part);
      numel += part.numel();
      if (part.scalar_type() != outputs[i].scalar_type()) {
        c.fail("input " + describe(part) + " must have the output's dtype (output " +
               describe(outputs[i]) + ")");
      }
    }
    if (numel != outputs[i].numel() * getSize()) {
      c.fail("input " + describe(inputs[i]) + " must have " + std::to_string(getSize()) +
             "x the elements of output " + describe(outputs[i]));
    }
  }
  // Read, never written (the result goes to the outputs): an expanded input is fine.
  const auto spec = reductionFor(c, all, reduceOp, "input");
  const int size = getSize();
  // The ring receives into the output while it still reads the inputs: an output that is
  // (part of) an input, as in NCCL-style in-place reduce_scatter, goes the packed way.
  const bool aliased =
      std::any_of(all.begin(), all.end(), [&](const at::Tensor& t) {
        return std::any_of(outputs.begin(), outputs.end(),
                           [&](const at::Tensor& o) { return t.is_alias_of(o); });
      });
  const bool direct = !aliased && inputs.size() == 1 &&
                      reduceOp.op_ != c10d::ReduceOp::PREMUL_SUM &&
                      (inputs[0].size() == 1 ||
                       (inputs[0].size() == static_cast<size_t>(size) &&
                        std::all_of(inputs[0].begin(), inputs[0].end(), [&](const at::Tensor& t) {
                          return t.numel() == outputs[0].numel();
                        })));
  if (direct) {
    return enqueue(op, c10d::OpType::_REDUCE_SCATTER_BASE, c.device(), outputs,
                 OpInputs(all).agreeing(reduceOp.op_, -1), timeout,
                   [output = outputs[0], parts = inputs[0], spec, reduceOp, size](Comm& comm) {
                     const int n = comm.size();
                     const size_t blockBytes = output.nbytes();
                     std::vector<Staged> src;
                     for (const auto& part : parts) src.emplace_back(comm, part);
                     std::vector<const void*> blocks;
                     for (int r = 0; r < n; ++r) {
                       const Staged& from = src.size() == 1 ? src[0] : src[r];
                       const size_t at = src.size() == 1 ? r * blockBytes : 0;
                       blocks.push_back(blockBytes ? static_cast<uint8_t*>(from.data()) + at
                                                   : nullptr);
                     }
                     Staged dst(comm, output);
                     algo::reduceScatter(comm, blocks, dst.data(),
                                         static_cast<size_t>(output.numel()), spec.red);
                     postScale(dst.flat, reduceOp, size);
                     dst.copyBack();
                   },
                   nullptr, nullptr,
                   c.device() ? reducingNeeds(algo::Op::kReduceScatter,
                                              static_cast<size_t>(outputs[0].numel()) * size,
                                              spec.red.elementSize,
                                              !outputs[0].is_contiguous() ||
                                                  !allContiguous(inputs[0]))
                              : DeviceNeeds{});
  }
  // Packed: every output's block of each rank in one buffer (allocating, on the progress thread).
  DeviceNeeds packedNeeds;
  if (c.device()) {
    size_t count = 0;
    for (const auto& o : outputs) count += static_cast<size_t>(o.numel()) * size;
    packedNeeds = reducingNeeds(algo::Op::kReduceScatter, count, spec.red.elementSize, true);
  }
  return enqueue(op, c10d::OpType::_REDUCE_SCATTER_BASE, c.device(), outputs,
                 OpInputs(all).agreeing(reduceOp.op_, -1), timeout,
                 [outputs, inputs, spec, reduceOp, size](Comm& comm) {
                   const int n = comm.size();
                   std::vector<at::Tensor> rows;  // input i as [n, block_i] views
                   for (const auto& parts : inputs) {
                     std::vector<at::Tensor> flat;
                     int64_t numel = 0;
                     for (const auto& part : parts) {
                       flat.push_back(part.reshape({-1}));
                       numel += part.numel();
                     }
                     rows.push_back(at::cat(flat).view({n, numel / n}));
                   }
                   at::Tensor work = kept(comm, at::cat(rows, 1).contiguous());
                   preScale(work, reduceOp);
                   const int64_t blockElems = work.numel() / n;
                   std::vector<const void*> blocks;
                   for (int r = 0; r < n; ++r) {
                     blocks.push_back(blockElems ? bytePtr(work) + r * blockElems *
                                                                       work.element_size()
                                                 : nullptr);
                   }
                   at::Tensor mine = kept(comm, at::empty({blockElems}, work.options()));
                   algo::reduceScatter(comm, blocks, blockElems ? mine.data_ptr() : nullptr,
                                       static_cast<size_t>(blockElems), spec.red);
                   postScale(mine, reduceOp, size);
                   unpack(mine, outputs);
                 },
                 nullptr, nullptr, c.device() ? packedNeeds : DeviceNeeds{});
}

c10::intrusive_ptr<c10d::Work> TransportBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const auto c = checker("reduce_scatter");
  c.single(outputs, "outputs");
  if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(getSize())) {
    c.fail("expects one input list of " + std::to_string(getSize()) + " tensors");
  }
  for (const auto& i : inputs[0]) {
    c.tensor(i, "input");
    c.sameAs(outputs[0], i, "input");
  }
  return reduceScatterFlat("reduce_scatter", outputs, {inputs[0]}, opts.reduceOp,
                           timeoutFor(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> TransportBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return reduceScatterFlat("_reduce_scatter_base", {output}, {{input}}, opts.reduceOp,
                           timeoutFor(opts.timeout));
}

c10::intrusive_ptr<c10d::Work> TransportBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  std::vector<std::vector<at::Tensor>> parts;
  for (const auto& t : inputs) parts.push_back({t});
  return reduceScatterFlat("reduce_scatter_tensor_coalesced", outputs, parts, opts.reduceOp,
                           timeoutFor(opts.timeout));
}

// --- all_to_all --------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> TransportBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& opts) {
  const auto c = checker("alltoall_base");
  c.tensor(input, "input");
  c.tensor(output, "output");
  if (input.scalar_type() != output.scalar_type()) {
    c.fail("input " + describe(input) + " and output " + describe(output) + " differ in dtype");
  }
  const int n = getSize();
  // Splits count rows of dim 0; a row is the product of the other dims.
  auto rowBytes = [](const at::Tensor& t) -> size_t {
    int64_t elems = 1;
    for (int64_t d = 1; d < t.dim(); ++d) elems *= t.size(d);
    return static_cast<size_t>(elems) * t.element_size();
  };
  auto layout = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* role) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    std::vector<int64_t> s = splits;
    if (s.empty()) {
      if (rows % n != 0) {
        c.fail(std::string(role) + " " + describe(t) + ": dim 0 is not divisible by the " +
               std::to_string(n) + " ranks; pass explicit split sizes");
      }
      s.assign(n, rows / n);
    }
    if (s.size() != static_cast<size_t>(n)) {
      c.fail(std::string(role) + " split sizes need " + std::to_string(n) + " entries, got " +
             std::to_string(s.size()));
    }
    int64_t sum = 0;
    for (int64_t v : s) {
      if (v < 0) c.fail(std::string(role) + " split sizes must be >= 0");
      sum += v;
    }
    if (sum != rows) {
      c.fail(std::string(role) + " split sizes add up to " + std::to_string(sum) + " but " +
             describe(t) + " has " + std::to_string(rows) + " rows");
    }
    return s;
  };
  const auto inSplits = layout(input, inputSplits, "input");
  const auto outSplits = layout(output, outputSplits, "output");
  const size_t inRow = rowBytes(input);
  const size_t outRow = rowBytes(output);
  const int me = getRank();
  if (inSplits[me] * inRow != outSplits[me] * outRow) {
    c.fail("this rank sends itself " + std::to_string(inSplits[me] * inRow) +
           " bytes but expects " + std::to_string(outSplits[me] * outRow) + " from itself");
  }
  return enqueue("alltoall_base", c10d::OpType::ALLTOALL_BASE, c.device(), {output}, input,
                 timeoutFor(opts.timeout),
                 [input, output, inSplits, outSplits, inRow, outRow](Comm& comm) {
                   // In place (input is output): send from a copy, as receives overwrite it.
                   Staged src(comm, input.is_alias_of(output) ? kept(comm, input.clone()) : input);
                   Staged dst(comm, output);
                   std::vector<const void*> sends;
                   std::vector<void*> recvs;
                   std::vector<size_t> sendBytes;
                   std::vector<size_t> recvBytes;
                   size_t inAt = 0;
                   size_t outAt = 0;
                   for (int p = 0; p < comm.size(); ++p) {
                     sendBytes.push_back(inSplits[p] * inRow);
                     recvBytes.push_back(outSplits[p] * outRow);
                     sends.push_back(src.bytes() ? static_cast<uint8_t*>(src.data()) + inAt : nullptr);
                     recvs.push_back(dst.bytes() ? static_cast<uint8_t*>(dst.data()) + outAt : nullptr);
                     inAt += sendBytes.back();
                     outAt += recvBytes.back();
                   }
                   algo::alltoall(comm, sends, sendBytes, recvs, recvBytes);
                   dst.copyBack();
                 },
                 nullptr, nullptr,
                 c.device() ? movingNeeds(input.is_alias_of(output) || !input.is_contiguous() ||
                                          !output.is_contiguous())
                            : DeviceNeeds{});
}

c10::intrusive_ptr<c10d::Work> TransportBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  const auto c = checker("alltoall");
  const size_t n = static_cast<size_t>(getSize());
  if (inputs.size() != n || outputs.size() != n) {
    c.fail("expects " + std::to_string(n) + " input and output tensors, got " +
           std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
  }
  for (size_t i = 0; i < n; ++i) {
    c.tensor(inputs[i], "input");
    c.tensor(outputs[i], "output");
    if (inputs[i].scalar_type() != inputs[0].scalar_type() ||
        outputs[i].scalar_type() != inputs[0].scalar_type()) {
      c.fail("all tensors must have the same dtype");
    }
  }
  const size_t me = static_cast<size_t>(getRank());
  if (inputs[me].nbytes() != outputs[me].nbytes()) {
    c.fail("input " + describe(inputs[me]) + " that this rank sends itself does not match output " +
           describe(outputs[me]));
  }
  c.disjoint(outputs, "output");
  c.inputsApart(inputs, outputs, getRank());
  return enqueue("alltoall", c10d::OpType::ALLTOALL, c.device(), outputs, inputs,
                 timeoutFor(opts.timeout), [inputs, outputs](Comm& comm) {
                   std::vector<Staged> src;
                   std::vector<Staged> dst;
                   std::vector<const void*> sends;
                   std::vector<void*> recvs;
                   std::vector<size_t> sendBytes;
                   std::vector<size_t> recvBytes;
                   for (size_t p = 0; p < inputs.size(); ++p) {
                     src.emplace_back(comm, inputs[p]);
                     dst.emplace_back(comm, outputs[p]);
                     sends.push_back(src.back().data());
                     recvs.push_back(dst.back().data());
                     sendBytes.push_back(src.back().bytes());
                     recvBytes.push_back(dst.back().bytes());
                   }
                   algo::alltoall(comm, sends, sendBytes, recvs, recvBytes);
                   for (auto& d : dst) d.copyBack();
                 },
                 nullptr, nullptr,
                 c.device() ? movingNeeds(!allContiguous(inputs) || !allContiguous(outputs))
                            : DeviceNeeds{});
}

}  // namespace ucxb
