#include "codegen/launch_plan.h"

#include <algorithm>

#include "common/input_limits.h"

#include <fmt/format.h>

#include "codegen/feature_map_info.h"
#include "codegen/feature_params.h"
#include "lunajit/layout.cuh"

namespace lunajit {
namespace {

// Mirrors templates/lunajit/linear_attention.cuh's forward_workspace_*.
int64_t state_offset(int64_t batch_heads) { return (batch_heads + 3) / 4 * 4; }

unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace

Status validate(const ProblemShape& s) {
  if (auto st = limits::check("batch", s.batch, limits::kBatch); !st) return st;
  if (auto st = limits::check("heads", s.heads, limits::kHeads); !st) return st;
  if (auto st = limits::check("seq", s.seq, limits::kSeq); !st) return st;
  return ok_status();
}

Result<std::vector<ProblemShape>> parse_shapes(std::string_view text, std::string_view option) {
  std::vector<ProblemShape> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t semi = text.find(';', start);
    const std::string_view item = text.substr(start, semi == std::string_view::npos ? semi : semi - start);
    if (item.find_first_not_of(" \t") != std::string_view::npos) {
      int64_t v[3] = {0, 0, 0};
      const char* names[3] = {"batch", "heads", "seq"};
      const limits::IntRange ranges[3] = {limits::kBatch, limits::kHeads, limits::kSeq};
      size_t pos = 0;
      for (int i = 0; i < 3; ++i) {
        const size_t comma = i < 2 ? item.find(',', pos) : item.size();
        if (comma == std::string_view::npos || (i == 2 && item.find(',', pos) != std::string_view::npos))
          return Error::invalid(fmt::format("{} \"{}\": expected B,H,N (e.g. 2,8,1024)", option, limits::quote(item)));
        auto n = limits::parse_int(names[i], item.substr(pos, comma - pos), ranges[i]);
        if (!n) return Error::invalid(fmt::format("{} \"{}\": {}", option, limits::quote(item), n.error().message));
        v[i] = *n;
        pos = comma + 1;
      }
      out.push_back(ProblemShape{int(v[0]), int(v[1]), int(v[2])});
    }
    if (semi == std::string_view::npos) break;
    start = semi + 1;
  }
  if (out.empty())
    return Error::invalid(fmt::format("{}: no shape given; expected B,H,N[;B,H,N...] (e.g. 2,8,1024;1,16,4096)", option));
  return out;
}

bool has_learned_params(const AttentionSpec& spec) {
  for (const auto& t : param_layout(spec).tensors)
    if (t.learned) return true;
  return false;
}

std::vector<std::string> kernel_roles(const AttentionSpec& spec, Pass pass) {
  std::vector<std::string> roles;
  if (spec.family == Family::performer) roles.push_back("key_stab");
  switch (pass) {
    case Pass::feature_map: roles.push_back("feature_map"); break;
    case Pass::forward:
      if (spec.causal) roles.push_back("causal_chunk");
      else roles.insert(roles.end(), {"state", "output"});
      break;
    case Pass::backward:
      if (spec.causal) roles.insert(roles.end(), {"causal_dq", "causal_dkv"});
      else roles.insert(roles.end(), {"state", "dstate", "dq", "dkv"});
      if (has_learned_params(spec)) roles.insert(roles.end(), {"param_reduce", "param_sum"});
      break;
  }
  return roles;
}

bool causal_super_chunks(const AttentionSpec& spec, const TileConfig& config, Pass pass) {
  return spec.causal && pass == Pass::forward && config.mma() && config.state_splits() > 1;
}

bool causal_backward_tiles(const AttentionSpec& spec, const TileConfig& config, Pass pass) {
  return spec.causal && pass == Pass::backward && config.mma();
}

std::vector<std::string> kernel_roles(const AttentionSpec& spec, Pass pass, const TileConfig& config) {
  std::vector<std::string> roles = kernel_roles(spec, pass);
  if (causal_super_chunks(spec, config, pass))
    roles.insert(std::find(roles.begin(), roles.end(), "causal_chunk"), "state");
  if (state_reduced(spec, config, pass)) {
    // The split partials summed once (state_reduce_kernel, ...) before their readers.
    roles.insert(std::find(roles.begin(), roles.end(), "state") + 1, "state_reduce");
    if (pass == Pass::backward) roles.insert(std::find(roles.begin(), roles.end(), "dstate") + 1, "dstate_reduce");
  }
  if (causal_backward_tiles(spec, config, pass)) {
    // Per-range states, their prefix, the dq walks (+ the ranges' dS), the suffix, the dk and dv walks.
    auto at = std::find(roles.begin(), roles.end(), "causal_dq");
    at = roles.insert(at, {"state", "state_scan"}) + 3;
    roles.insert(at, "dstate_scan");
  }
  return roles;
}

bool state_reduced(const AttentionSpec& spec, const TileConfig& config, Pass pass) {
  return !spec.causal && pass != Pass::feature_map &&
         (config.state_splits() > 1 || backward_state_staged(spec, config, pass));
}

bool backward_state_staged(const AttentionSpec& spec, const TileConfig& config, Pass pass) {
  return !spec.causal && pass == Pass::backward && config.mma();
}

std::string kernel_template(Pass pass, std::string_view role) {
  if (role == "key_stab")
    return pass == Pass::feature_map ? "key_stab_kernel"
           : pass == Pass::forward   ? "forward_key_stab_kernel"
                                     : "backward_key_stab_kernel";
  if (role == "state" && pass == Pass::backward) return "backward_state_kernel";
  if (role == "state_reduce" && pass == Pass::backward) return "backward_state_reduce_kernel";
  return std::string(role) + "_kernel";
}

namespace {
// Causal performer keeps a per-row key stabiliser (docs/MATH.md §2).
int running_max(const AttentionSpec& spec) { return spec.causal && spec.family == Family::performer ? 1 : 0; }

BackwardDims backward_dims(const AttentionSpec& spec, const TileConfig& c) {
  return BackwardDims{spec.head_dim,
                      spec.feature_dim(),
                      spec.value_dim,
                      feature_map_scratch_per_row(spec),
                      feature_map_backward_scratch_per_row(spec),
                      spec.causal ? c.chunk() : c.block_tokens(),
                      c.threads(),
                      has_learned_params(spec) ? static_cast<int>(param_layout(spec).per_head_floats) : 0,
                      running_max(spec),
                      /*jt_stage=*/0,
                      // The tensor-core backward stages fp16 V as bf16 hi + lo.
                      c.mma() && spec.dtype == DType::fp16 ? 1 : 0,
                      // The tensor-core causal kernels pad the scores' rows by up to eight
                      // floats (CausalRangeBlock::CS).
                      c.mma() && spec.causal ? 8 : 0,
                      // The non-causal tensor-core dq / dkv copy the staged state: no fp32 state tile.
                      c.mma() && !spec.causal ? 1 : 0,
                      backward_phi_stride(spec, c),
                      backward_value_stride(spec, c)};
}
}  // namespace

int backward_phi_stride(const AttentionSpec& spec, const TileConfig& c) {
  // MmaPhiSupport: the J^T's conditions (jacobian_on_tensor_cores) and x's bf16 copy fits in phi's tile.
  const bool padded = jacobian_on_tensor_cores(spec, c) && spec.head_dim + 8 <= 2 * spec.feature_dim();
  return spec.feature_dim() + (padded ? 8 : 0);
}

int backward_value_stride(const AttentionSpec& spec, const TileConfig& c) {
  return spec.value_dim + (causal_backward_tiles(spec, c, Pass::backward) ? 8 : 0);
}

int64_t backward_workspace_bytes_per_head(const AttentionSpec& spec, const TileConfig& c, int seq) {
  const BackwardDims p = backward_dims(spec, c);
  const BackwardWorkspace w = backward_workspace(1, seq, c.state_splits(), p.D, p.dv, spec.causal, p.tokens,
                                                 p.param_floats, p.running_max, spec.causal && c.mma(),
                                                 !spec.causal && c.mma());
  return 4 * w.total;
}

bool jacobian_on_tensor_cores(const AttentionSpec& spec, const TileConfig& c) {
  const LunaOptions& o = spec.luna;
  return c.mma() && spec.dtype == DType::bf16 && spec.family == Family::luna &&
         o.variant == LunaVariant::neural && o.shared_channels && spec.head_dim % 16 == 0 && o.mlp_width % 16 == 0 &&
         o.channels % 8 == 0;
}

int64_t dynamic_smem_bytes(const AttentionSpec& spec, const TileConfig& c, Pass pass, std::string_view role) {
  // The tensor-core backward (can_implement): the scalar tiles plus 16-bit operand tiles.
  if (role == "state_reduce" || role == "dstate_reduce")  // the staging's max: one float per warp
    return backward_state_staged(spec, c, pass) ? 4LL * (c.threads() / 32) : 0;
  if (c.mma() && pass == Pass::backward) {
    BackwardDims p = backward_dims(spec, c);
    if (jacobian_on_tensor_cores(spec, c))
      p.jt_stage =
          luna_jt_stage_floats(p.tokens, p.d, p.D, spec.luna.mlp_width, spec.luna.channels, p.threads / 32);
    if (role == "dstate") return backward_mma_smem_layout(BackwardKind::dstate, p).bytes();
    if (role == "dq") return backward_mma_smem_layout(BackwardKind::dq, p).bytes();
    if (role == "dkv") return backward_mma_smem_layout(BackwardKind::dkv, p).bytes();
    if (role == "causal_dq") return backward_mma_smem_layout(BackwardKind::causal_dq, p).bytes();
    if (role == "causal_dkv") return backward_mma_smem_layout(BackwardKind::causal_dkv, p).bytes();
  }
  if (role == "state_scan" || role == "dstate_scan") return 0;
  if (role == "dstate") return backward_smem_layout(BackwardKind::dstate, backward_dims(spec, c)).bytes();
  if (role == "dq") return backward_smem_layout(BackwardKind::dq, backward_dims(spec, c)).bytes();
  if (role == "dkv") return backward_smem_layout(BackwardKind::dkv, backward_dims(spec, c)).bytes();
  if (role == "causal_dq") return backward_smem_layout(BackwardKind::causal_dq, backward_dims(spec, c)).bytes();
  if (role == "causal_dkv") return backward_smem_layout(BackwardKind::causal_dkv, backward_dims(spec, c)).bytes();
  if (role == "param_reduce" || role == "param_sum") return 4LL * c.threads();  // one partial per thread
  auto dims = [&](int tokens) {
    return LayoutDims{spec.head_dim, spec.feature_dim(), feature_map_scratch_per_row(spec), c.dv_block(), tokens,
                      c.threads(), running_max(spec)};
  };
  if (role == "feature_map") return smem_layout(KernelKind::feature_map, dims(c.block_tokens())).bytes();
  if (role == "key_stab") return smem_layout(KernelKind::key_stab, dims(c.block_tokens())).bytes();
  // mma: the tensor-core state/output/causal_chunk kernels (the backward's
  // "state" role with mma is the same mma_state_block).
  // The causal walk's per-range state pass tiles by chunk (super-chunk split).
  if (role == "state" && c.mma()) {
    const bool split_phi = pass == Pass::backward, split_v = split_phi && spec.dtype == DType::fp16;
    return mma_smem_layout(KernelKind::state, dims(spec.causal ? c.chunk() : c.block_tokens()), split_phi, split_v,
                           mma_state_pipelined(spec.head_dim, split_phi))
        .bytes();
  }
  if (role == "output" && c.mma()) return mma_smem_layout(KernelKind::output, dims(c.block_tokens())).bytes();
  if (role == "state") return smem_layout(KernelKind::state, dims(c.block_tokens())).bytes();
  if (role == "output") return smem_layout(KernelKind::output, dims(c.block_tokens())).bytes();
  if (role == "causal_chunk" && c.mma()) return mma_smem_layout(KernelKind::causal_chunk, dims(c.chunk())).bytes();
  if (role == "causal_chunk") return smem_layout(KernelKind::causal_chunk, dims(c.chunk())).bytes();
  return 0;
}

bool reads_runtime_splits(const AttentionSpec& spec, const TileConfig& c, Pass pass) {
  return (pass != Pass::feature_map && !spec.causal) || causal_super_chunks(spec, c, pass) ||
         causal_backward_tiles(spec, c, pass);
}

Result<LaunchPlan> plan_launches(const AttentionSpec& spec, const TileConfig& c, Pass pass,
                                 const ProblemShape& shape, int splits_in) {
  if (auto st = validate(shape); !st) return st.error();
  if (splits_in < 0 || splits_in > c.state_splits())
    return Error::invalid(fmt::format("launch plan: splits = {} is out of range: 0 (the compiled {}) or 1 .. {} "
                                      "(the config's state_splits)",
                                      splits_in, c.state_splits(), c.state_splits()));
  const int64_t bh = static_cast<int64_t>(shape.batch) * shape.heads;
  const unsigned dv_blocks = ceil_div(spec.value_dim, c.dv_block());
  const bool performer = spec.family == Family::performer;
  LaunchPlan plan;
  // The runtime split count of the passes that read it (reads_runtime_splits);
  // elsewhere no kernel reads it: the compiled value.
  plan.splits = splits_in > 0 && reads_runtime_splits(spec, c, pass) ? splits_in : c.state_splits();
  const int splits = plan.splits;
  const auto usplits = static_cast<unsigned>(splits);
  // A reduce of one partial is the identity: skipped (not the tensor-core
  // backward's, which also stages the state).
  const bool reduce = state_reduced(spec, c, pass) && (splits > 1 || backward_state_staged(spec, c, pass));
  // The reduce kernels: one thread per entry of a (D*dv + D) state.
  // The tensor-core backward's (which also stage the state): one block per (batch, head).
  auto reduce_blocks = [&](int64_t D) {
    return backward_state_staged(spec, c, pass) ? 1u : ceil_div(D * spec.value_dim + D, c.threads());
  };
  auto add = [&](std::string role, std::array<unsigned, 3> grid) {
    const int64_t smem = dynamic_smem_bytes(spec, c, pass, role);
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
      if (causal_super_chunks(spec, c, pass)) {
        // Per-range states (chunk tiles), then every range's walk seeded with
        // the ranges before it.
        // One range: no earlier ranges to seed from, so no state pass.
        const int64_t D = spec.feature_dim();
        if (splits > 1) add("state", {static_cast<unsigned>(bh), usplits, dv_blocks});
        add("causal_chunk", {static_cast<unsigned>(bh), dv_blocks, usplits});
        plan.workspace_floats = state_offset(bh) + bh * c.state_splits() * (D * spec.value_dim + D);
      } else if (spec.causal) {
        add("causal_chunk", {static_cast<unsigned>(bh), dv_blocks, 1});
        plan.workspace_floats = state_offset(bh);
      } else {
        const int64_t D = spec.feature_dim();
        add("state", {static_cast<unsigned>(bh), usplits, dv_blocks});
        if (reduce) add("state_reduce", {static_cast<unsigned>(bh), reduce_blocks(D), 1});
        add("output", {ceil_div(shape.seq, c.block_tokens()), static_cast<unsigned>(bh), dv_blocks});
        plan.workspace_floats = state_offset(bh) + bh * c.state_splits() * (D * spec.value_dim + D);
      }
      break;
    case Pass::backward: {
      if (performer) add("key_stab", {static_cast<unsigned>(bh), 1, 1});
      const BackwardDims p = backward_dims(spec, c);
      const unsigned tiles = ceil_div(shape.seq, c.block_tokens());
      if (causal_backward_tiles(spec, c, pass)) {
        // Super-chunk walks on tensor cores (linear_attention_backward_mma.cuh):
        // per-range states, their prefix, the dq walks (+ the ranges' dS), the
        // suffix, the dk and dv walks.
        const unsigned ranges = usplits;
        const unsigned entries = ceil_div(int64_t(p.D) * p.dv + p.D, c.threads());
        add("state", {static_cast<unsigned>(bh), ranges, dv_blocks});
        add("state_scan", {static_cast<unsigned>(bh), entries, 1});
        add("causal_dq", {ranges, static_cast<unsigned>(bh), 1});
        add("dstate_scan", {static_cast<unsigned>(bh), entries, 1});
        add("causal_dkv", {ranges, static_cast<unsigned>(bh), 1});
      } else if (spec.causal) {
        add("causal_dq", {static_cast<unsigned>(bh), 1, 1});
        add("causal_dkv", {static_cast<unsigned>(bh), 1, 1});
      } else {
        add("state", {static_cast<unsigned>(bh), usplits, dv_blocks});
        if (reduce) add("state_reduce", {static_cast<unsigned>(bh), reduce_blocks(p.D), 1});
        // dq before dstate: dq writes each token's r (from its fp32 products), dstate reads it.
        add("dq", {tiles, static_cast<unsigned>(bh), 1});
        add("dstate", {static_cast<unsigned>(bh), usplits, 1});
        if (reduce) add("dstate_reduce", {static_cast<unsigned>(bh), reduce_blocks(p.D), 1});
        add("dkv", {tiles, static_cast<unsigned>(bh), 1});
      }
      if (p.param_floats > 0) {
        // 32 parameters a block; param_reduce cuts each head block's slots into groups, param_sum adds those.
        const unsigned blocks = spec.params_per_head ? static_cast<unsigned>(shape.heads) : 1u;
        const long long slots = backward_slots(static_cast<int>(bh), shape.seq, spec.causal, p.tokens,
                                               causal_backward_tiles(spec, c, pass), splits) /
                                blocks;
        const auto groups = static_cast<unsigned>(param_reduce_groups(slots, c.threads() / 32));
        add("param_reduce", {ceil_div(p.param_floats, 32), groups, blocks});
        add("param_sum", {ceil_div(p.param_floats, 32), blocks, 1});
      }
      plan.workspace_floats =
          // Sized for the compiled maximum (BackwardTraits::workspace): a launch of
          // `splits` ranges uses the first ones of each region.
          backward_workspace(static_cast<int>(bh), shape.seq, c.state_splits(), p.D, p.dv, spec.causal, p.tokens,
                             p.param_floats, p.running_max, causal_backward_tiles(spec, c, pass),
                             backward_state_staged(spec, c, pass))
              .total;
      break;
    }
  }
  return plan;
}

}  // namespace lunajit
