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

// Checks batch, heads, seq >= 1 and seq within int range; names the bad field.
Status validate(const ProblemShape& shape);

struct KernelLaunch {
  std::string role;                  // the KernelEntry role it launches
  std::array<unsigned, 3> grid{1, 1, 1};
  unsigned threads = 32;
  int64_t smem_bytes = 0;            // dynamic shared memory
};

struct LaunchPlan {
  std::vector<KernelLaunch> launches;  // in launch order
  int64_t workspace_floats = 0;        // fp32 scratch the caller allocates
};

// Dynamic shared memory of the kernel with `role` (0 for an unknown role).
int64_t dynamic_smem_bytes(const AttentionSpec& spec, const TileConfig& config, std::string_view role);

Result<LaunchPlan> plan_launches(const AttentionSpec& spec, const TileConfig& config, Pass pass,
                                 const ProblemShape& shape);

}  // namespace lunajit
