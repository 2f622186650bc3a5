// LaunchPlan: the grid, block and dynamic shared memory of every kernel of a
// pass for one problem shape, and the workspace it needs, computed from the
// same constexpr layouts the kernels use (templates/lunajit/layout.cuh). The
// runtime executes a plan on any Backend; the tuner and the report read it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "codegen/kernel_source.h"

namespace lunajit {

struct ProblemShape {
  int batch = 1;
  int heads = 1;
  int seq = 1;
};

// Checks batch, heads and seq against common/input_limits.h; names the bad field.
Status validate(const ProblemShape& shape);

// Parses "B,H,N[;B,H,N...]" (spaces around numbers allowed), each number
// 64-bit-safe against the shape limits; errors start with `option`.
Result<std::vector<ProblemShape>> parse_shapes(std::string_view text, std::string_view option = "--shapes");

struct KernelLaunch {
  std::string role;                  // the KernelEntry role it launches
  std::array<unsigned, 3> grid{1, 1, 1};
  unsigned threads = 32;
  int64_t smem_bytes = 0;            // dynamic shared memory
};

struct LaunchPlan {
  std::vector<KernelLaunch> launches;  // in launch order
  int64_t workspace_floats = 0;        // fp32 scratch the caller allocates
  // The ranges the state passes and the super-chunk walks split each (batch,
  // head) into (ForwardArgs::splits / BackwardArgs::splits).
  int splits = 1;
};

// Whether the pass's kernels read the runtime split count: the non-causal
// state passes (forward and backward) and the tensor-core causal walks
// (causal_super_chunks, causal_backward_tiles).
bool reads_runtime_splits(const AttentionSpec& spec, const TileConfig& config, Pass pass);

// The kernels of a pass in launch order, by role: "key_stab" (performer),
// "feature_map"; forward "state", "output" | "causal_chunk"; backward "state",
// "dstate", "dq", "dkv" | "causal_dq", "causal_dkv", then "param_reduce" and
// "param_sum" (the slots summed per group, then the groups) when the family
// learns parameters.
std::vector<std::string> kernel_roles(const AttentionSpec& spec, Pass pass);
// The same for one config: a non-causal pass with state_splits > 1 runs
// "state_reduce" after "state" (and the backward "dstate_reduce" after
// "dstate"); a causal forward on tensor cores with
// state_splits > 1 (the super-chunk split) runs "state" (per-range states)
// before "causal_chunk"; the causal backward on tensor cores runs "state"
// (per-chunk states), "state_scan", "causal_dq", "dstate_scan", "causal_dkv".
std::vector<std::string> kernel_roles(const AttentionSpec& spec, Pass pass, const TileConfig& config);
// Whether a config's causal forward walks its chunks in state_splits ranges
// (mma_causal_chunk_kernel seeded with the earlier ranges' states).
bool causal_super_chunks(const AttentionSpec& spec, const TileConfig& config, Pass pass);
// Whether a config's non-causal forward or backward sums its state_splits
// partials once (state_splits > 1; the tensor-core backward always, below): "state_reduce" after "state" and, in the
// backward, "dstate_reduce" after "dstate" (reduce_state_partials in
// templates/lunajit/linear_attention.cuh); their readers read one state.
bool state_reduced(const AttentionSpec& spec, const TileConfig& config, Pass pass);
// Whether a config's non-causal backward runs on tensor cores, whose reduce
// kernels (one block per batch*head, run with one split too) also stage the
// state and its gradient as split bf16 words for the dq and dkv tiles
// (mma_reduce_and_stage in templates/lunajit/linear_attention_backward_mma.cuh).
bool backward_state_staged(const AttentionSpec& spec, const TileConfig& config, Pass pass);
// Whether a config's causal backward is the one on tensor cores: per-range
// states of state_splits super-chunk ranges, state_scan / dstate_scan, and
// chunk walks within each range, grid (ranges, batch*heads).
bool causal_backward_tiles(const AttentionSpec& spec, const TileConfig& config, Pass pass);

// The kernel template a role instantiates ("state_kernel"; the backward's
// state pass is "backward_state_kernel").
std::string kernel_template(Pass pass, std::string_view role);

// Whether any parameter tensor of the spec's family is learned (has a gradient).
bool has_learned_params(const AttentionSpec& spec);

// Dynamic shared memory of the kernel with `role` of `pass` (0 for an unknown
// role); the pass matters for "state" with mma: the backward's state pass also
// stages phi's bf16 low halves.
int64_t dynamic_smem_bytes(const AttentionSpec& spec, const TileConfig& config, Pass pass, std::string_view role);

// Whether the backward's dq and dkv kernels map dphi back through the feature
// map on tensor cores (MmaJacobianSupport in
// templates/lunajit/feature_map_backward_mma.cuh): the tensor-core backward
// (mma config, non-causal, bf16) of LUNA's neural map with shared channels,
// d and Hm multiples of 16, L of 8. Otherwise the J^T is fp32 code.
bool jacobian_on_tensor_cores(const AttentionSpec& spec, const TileConfig& config);

// The row stride (floats) of the backward kernels' fp32 phi and dphi tiles:
// D + 8 where the tensor-core backward makes phi on tensor cores
// (backward_phi_stride in templates/lunajit/feature_map_mma.cuh: conflict-free
// fragment-order stores), else D. Part of the tiles' shared-memory sizes.
int backward_phi_stride(const AttentionSpec& spec, const TileConfig& config);

// The row stride (floats) of the backward kernels' fp32 V and dO tiles: dv + 8
// in the tensor-core causal walks (BackwardMmaTraits::VS in
// templates/lunajit/linear_attention_backward_mma.cuh: conflict-free fragment
// loads of the scores' B = G V^T), else dv.
int backward_value_stride(const AttentionSpec& spec, const TileConfig& config);

// Bytes of global memory the backward needs per (batch, head) beyond q, k, v,
// o, dout and the gradients themselves (its workspace), for a sequence of `seq`.
int64_t backward_workspace_bytes_per_head(const AttentionSpec& spec, const TileConfig& config, int seq);

// splits: the ranges the split passes run (reads_runtime_splits), 1 ..
// config.state_splits(), the maximum the kernels are compiled for (the cost
// model's best_splits picks it per GPU and shape; docs/ARCHITECTURE.md
// "Runtime split count"); it sets plan.splits and with it the grids and the
// workspace; 0: config.state_splits(). Out of range: invalid_argument.
Result<LaunchPlan> plan_launches(const AttentionSpec& spec, const TileConfig& config, Pass pass,
                                 const ProblemShape& shape, int splits = 0);

}  // namespace lunajit
