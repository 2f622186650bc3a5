// The code generator: (spec, config, pass) -> one CUDA translation unit.
//
// The unit is small: a header comment naming the spec and config, the include
// of the kernel templates, a generated `FeatureOptions` and `Kernel` struct of
// static constexpr values, and static_asserts tying host and device layouts
// together. Kernels are instantiated by NVRTC name expressions
// ("lunajit::state_kernel<lunajit_gen::Kernel>"), never by pasting code.
// Output is deterministic: the same inputs give byte-identical source.
#pragma once

#include "codegen/kernel_source.h"

namespace lunajit {

// Generates the pass's translation unit. Fails with the reason when the spec is
// invalid or the pass is not generated yet.
Result<KernelSource> generate(const AttentionSpec& spec, const TileConfig& config, Pass pass);

}  // namespace lunajit
