// AttentionRunner: runs the generated kernels of one (spec, config, pass) on any
// Backend, following the pass's LaunchPlan (codegen/launch_plan.h). It owns the
// loaded module and a workspace buffer that grows to the largest shape seen.
//
// Tensors are device pointers with [batch, seq, heads, dim] strides in elements
// and unit stride in dim (templates/lunajit/kernel_args.cuh).
#pragma once

#include <memory>

#include "codegen/generator.h"
#include "codegen/launch_plan.h"
#include "lunajit/kernel_args.cuh"
#include "runtime/backend.h"

namespace lunajit {

class AttentionRunner {
 public:
  // Generates the pass's source and loads it on `backend` (compiling through the cache).
  static Result<AttentionRunner> create(Backend& backend, const AttentionSpec& spec, const TileConfig& config,
                                        Pass pass);

  // o = linear_attention(q, k, v) (Pass::forward).
  //
  // Packed variable-length batch (docs/MATH.md §3): cu_seqlens, when not 0, is a
  // device pointer to int32 [shape.batch + 1] offsets (0 = cu[0] <= ... <=
  // cu[batch] = total tokens; the caller validates them) into tensors packed as
  // [1, total, heads, dim]; shape.batch is then the number of sequences and
  // shape.seq the longest length (grid and workspace). Tokens of one sequence
  // never see another's.
  Status forward(const ProblemShape& shape, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                 const MutableTensorRef& o, DevicePtr params, DevicePtr cu_seqlens = 0);

  // dq, dk, dv and dparams from dout (Pass::backward); o is the forward's output.
  // dparams [param blocks, per-head floats] fp32 is overwritten when the family
  // learns parameters and left untouched otherwise (its gradient is zero).
  Status backward(const ProblemShape& shape, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                  const TensorRef& o, const TensorRef& dout, const MutableTensorRef& dq, const MutableTensorRef& dk,
                  const MutableTensorRef& dv, DevicePtr params, DevicePtr dparams, DevicePtr cu_seqlens = 0);

  // phi = feature_map(x) as fp32 [batch, seq, heads, D] contiguous (Pass::feature_map).
  Status feature_map(const ProblemShape& shape, const TensorRef& x, DevicePtr phi, DevicePtr params, bool is_query);

  const KernelSource& source() const { return module_->source(); }
  const AttentionSpec& spec() const { return source().spec; }
  const TileConfig& config() const { return source().config; }

 private:
  AttentionRunner(Backend& backend, std::shared_ptr<LoadedModule> module)
      : backend_(&backend), module_(std::move(module)) {}
  Result<float*> workspace(int64_t floats);
  Status launch_plan(const LaunchPlan& plan, void* args);

  Backend* backend_;
  std::shared_ptr<LoadedModule> module_;
  Buffer workspace_;
};

}  // namespace lunajit
