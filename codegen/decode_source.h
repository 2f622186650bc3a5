// The decoding kernel (templates/lunajit/linear_attention_decode.cuh): its
// generated source and its launch. One new token per sequence against the
// carried state (docs/MATH.md §3 "Decoding", §1a for the state layout).
#pragma once

#include "codegen/launch_plan.h"

namespace lunajit {

// ok when `spec` can be decoded: causal, and not performer or cosformer (the
// error names the field and why; reference::check_state_support says the same).
Status check_decode_support(const AttentionSpec& spec);

// The translation unit of decode_step_kernel for (spec, config): the forward
// pass's generated Kernel description with the decode template included and one
// entry, role "decode_step". Only config.threads() matters to the kernel.
Result<KernelSource> generate_decode(const AttentionSpec& spec, const TileConfig& config);

// Grid (batch*heads), the config's threads, the kernel's shared memory; no workspace.
Result<LaunchPlan> plan_decode(const AttentionSpec& spec, const TileConfig& config, const ProblemShape& shape);

}  // namespace lunajit
