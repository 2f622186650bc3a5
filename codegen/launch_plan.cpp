#include "codegen/launch_plan.h"

#include <fmt/format.h>

#include "codegen/feature_map_info.h"
#include "lunajit/layout.cuh"

namespace lunajit {
namespace {

// Mirrors templates/lunajit/linear_attention.cuh's forward_workspace_*.
int64_t state_offset(int64_t batch_heads) { return (batch_heads + 3) / 4 * 4; }

unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace

Status validate(const ProblemShape& s) {
  auto check = [](const char* name, int v) -> Status {
    if (v < 1) return Error::invalid(fmt::format("{} = {}: must be >= 1", name, v));
    return ok_status();
  };
  if (auto st = check("batch", s.batch); !st) return st;
  if (auto st = check("heads", s.heads); !st) return st;
  if (auto st = check("seq", s.seq); !st) return st;
  if (static_cast<int64_t>(s.batch) * s.heads > 65535LL * 65535LL)
    return Error::invalid(fmt::format("batch * heads = {}: too many for the grid", int64_t(s.batch) * s.heads));
  return ok_status();
}

int64_t dynamic_smem_bytes(const AttentionSpec& spec, const TileConfig& c, std::string_view role) {
  auto dims = [&](int tokens) {
    return LayoutDims{spec.head_dim, spec.feature_dim(), feature_map_scratch_per_row(spec), c.dv_block(), tokens,
                      c.threads()};
  };
  if (role == "feature_map") return smem_layout(KernelKind::feature_map, dims(c.block_tokens())).bytes();
  if (role == "key_stab") return smem_layout(KernelKind::key_stab, dims(c.block_tokens())).bytes();
  if (role == "state") return smem_layout(KernelKind::state, dims(c.block_tokens())).bytes();
  if (role == "output") return smem_layout(KernelKind::output, dims(c.block_tokens())).bytes();
  if (role == "causal_chunk") return smem_layout(KernelKind::causal_chunk, dims(c.chunk())).bytes();
  return 0;
}

Result<LaunchPlan> plan_launches(const AttentionSpec& spec, const TileConfig& c, Pass pass,
                                 const ProblemShape& shape) {
  if (auto st = validate(shape); !st) return st.error();
  const int64_t bh = static_cast<int64_t>(shape.batch) * shape.heads;
  const unsigned dv_blocks = ceil_div(spec.value_dim, c.dv_block());
  const bool performer = spec.family == Family::performer;
  LaunchPlan plan;
  auto add = [&](std::string role, std::array<unsigned, 3> grid) {
    const int64_t smem = dynamic_smem_bytes(spec, c, role);
    plan.launches.push_back({std::move(role), grid, static_cast<unsigned>(c.threads()), smem});
  };
  switch (pass) {
    case Pass::feature_map:
      if (performer) add("key_stab", {static_cast<unsigned>(bh), 1, 1});
      add("feature_map", {ceil_div(shape.seq, c.block_tokens()), static_cast<unsigned>(bh), 1});
      plan.workspace_floats = performer ? bh : 0;
      break;
    case Pass::forward:
      if (performer) add("key_stab", {static_cast<unsigned>(bh), 1, 1});
      if (spec.causal) {
        add("causal_chunk", {static_cast<unsigned>(bh), dv_blocks, 1});
        plan.workspace_floats = state_offset(bh);
      } else {
        const int64_t D = spec.feature_dim();
        add("state", {static_cast<unsigned>(bh), static_cast<unsigned>(c.state_splits()), dv_blocks});
        add("output", {ceil_div(shape.seq, c.block_tokens()), static_cast<unsigned>(bh), dv_blocks});
        plan.workspace_floats = state_offset(bh) + bh * c.state_splits() * (D * spec.value_dim + D);
      }
      break;
    case Pass::backward:
      return Error::invalid("pass = backward: backward kernels are not generated yet");
  }
  return plan;
}

}  // namespace lunajit
