// AttentionRunner: runs the generated kernels of one (spec, config, pass) on any
// Backend, following the pass's LaunchPlan (codegen/launch_plan.h). It owns the
// loaded module and a workspace buffer that grows to the largest shape seen.
//
// Tensors are device pointers with [batch, seq, heads, dim] strides in elements
// and unit stride in dim (templates/lunajit/kernel_args.cuh).
#pragma once

#include <array>
#include <map>
#include <memory>

#include "codegen/generator.h"
#include "codegen/launch_plan.h"
#include "lunajit/kernel_args.cuh"
#include "runtime/backend.h"

namespace lunajit {

// Carried state of a causal call (docs/MATH.md §1a): device pointers to fp32
// contiguous S [batch, heads, D, dv] and z [batch, heads, D]; 0 = absent
// (initial: the zero state; final or gradient outputs: not written).
struct StateRefs {
  DevicePtr initial_S = 0, initial_z = 0;
  DevicePtr final_S = 0, final_z = 0;
};
struct StateGradRefs {
  DevicePtr initial_S = 0, initial_z = 0;    // the forward's initial state
  DevicePtr dfinal_S = 0, dfinal_z = 0;      // upstream gradient of the final state
  DevicePtr dinitial_S = 0, dinitial_z = 0;  // gradient of the initial state (written)
};

class AttentionRunner {
 public:
  // Generates the pass's source and loads it on `backend` (compiling through the cache).
  static Result<AttentionRunner> create(Backend& backend, const AttentionSpec& spec, const TileConfig& config,
                                        Pass pass);

  // The decoding kernel of spec (codegen/decode_source.h); use decode() on it.
  static Result<AttentionRunner> create_decode(Backend& backend, const AttentionSpec& spec, const TileConfig& config);

  // o = linear_attention(q, k, v) (Pass::forward); `state` (causal specs only,
  // not performer or cosformer) seeds the scan and receives its final state.
  //
  // Packed variable-length batch (docs/MATH.md §3): cu_seqlens, when not 0, is a
  // device pointer to int32 [shape.batch + 1] offsets (0 = cu[0] <= ... <=
  // cu[batch] = total tokens; the caller validates them) into tensors packed as
  // [1, total, heads, dim]; shape.batch is then the number of sequences and
  // shape.seq the longest length (grid and workspace). Tokens of one sequence
  // never see another's. With cu_seqlens, a state is per sequence
  // ([shape.batch, heads, ...]); the binding does not offer that combination yet.
  Status forward(const ProblemShape& shape, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                 const MutableTensorRef& o, DevicePtr params, const StateRefs& state = {},
                 DevicePtr cu_seqlens = 0);

  // One decoding step (a create_decode runner): q, k, v, o one token per
  // sequence (shape.seq must be 1); state_S, state_z updated in place.
  Status decode(const ProblemShape& shape, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                const MutableTensorRef& o, DevicePtr params, DevicePtr state_S, DevicePtr state_z);

  // dq, dk, dv and dparams from dout (Pass::backward); o is the forward's output.
  // dparams [param blocks, per-head floats] fp32 is overwritten when the family
  // learns parameters and left untouched otherwise (its gradient is zero).
  Status backward(const ProblemShape& shape, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                  const TensorRef& o, const TensorRef& dout, const MutableTensorRef& dq, const MutableTensorRef& dk,
                  const MutableTensorRef& dv, DevicePtr params, DevicePtr dparams, const StateGradRefs& state = {},
                  DevicePtr cu_seqlens = 0);

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
  // The backend's split count for `shape` (Backend::plan_splits), remembered
  // per shape: the CUDA backend's choice predicts the pass at every count
  // (about 0.1-0.7 ms of host time for the default backward), once per shape
  // rather than once per call.
  int splits_for(const ProblemShape& shape);

  Backend* backend_;
  std::shared_ptr<LoadedModule> module_;
  Buffer workspace_;
  std::map<std::array<int, 3>, int> splits_;
};

}  // namespace lunajit
