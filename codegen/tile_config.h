// TileConfig: the tuning knobs of the generated kernels, as an immutable,
// hashable, printable value (tinygrad's "options are values"; CUTLASS's
// can_implement).
//
// One config serves every pass of a spec; each kernel reads the knobs it uses:
//   block_tokens  T   tokens per tile of the feature map, state and output passes
//   warps             warps per block (threads = 32 * warps)
//   dv_block          columns of the value dimension one block owns; the grid
//                     gets ceil(dv / dv_block) blocks along dv
//   chunk         C   causal chunk size (tokens per intra-chunk masked product)
//   state_splits      the most ranges the sequence of a (batch, head) is split
//                     into: the non-causal state passes' blocks along the
//                     sequence (partials reduced in a fixed order:
//                     deterministic) and the tensor-core causal walks'
//                     super-chunk ranges. The kernels are compiled for this
//                     maximum; the launch plan picks the count it runs, 1 ..
//                     state_splits, from the GPU's SM count (choose_splits in
//                     codegen/launch_plan.h)
//   phi_backward      backward: recompute phi from q, k, or read it saved by the
//                     forward (docs/ARCHITECTURE.md kernel plan)
//   mma               forward of a bf16/fp16 spec: the non-causal state and
//                     output passes, or the causal chunk walk (not for the
//                     causal performer), on tensor cores (mma.sync m16n8k16,
//                     templates/lunajit/linear_attention_mma.cuh) instead of
//                     the fp32 scalar loops; off by default, and printed and
//                     serialised only when on (so the existing configs keep
//                     their strings and hashes)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "codegen/arch.h"
#include "codegen/attention_spec.h"
#include "common/result.h"

namespace lunajit {

enum class PhiInBackward { recompute, save };

// The kernels generated for a spec: the feature map alone, the forward, the backward.
enum class Pass { feature_map, forward, backward };
std::string_view to_string(Pass p);
Result<Pass> parse_pass(std::string_view s);

class TileConfig {
 public:
  TileConfig() = default;
  TileConfig(int block_tokens, int warps, int dv_block, int chunk, int state_splits,
             PhiInBackward phi_backward = PhiInBackward::recompute, bool mma = false);

  int block_tokens() const { return block_tokens_; }
  int warps() const { return warps_; }
  int threads() const { return 32 * warps_; }
  int dv_block() const { return dv_block_; }
  int chunk() const { return chunk_; }
  int state_splits() const { return state_splits_; }
  PhiInBackward phi_backward() const { return phi_backward_; }
  bool mma() const { return mma_; }
  // This config with the knob `mma` set to `on`.
  TileConfig with_mma(bool on) const {
    TileConfig c = *this;
    c.mma_ = on;
    return c;
  }
  // This config with state_splits = s (the cost model counts a launch plan's
  // runtime split count with it).
  TileConfig with_state_splits(int s) const {
    TileConfig c = *this;
    c.state_splits_ = s;
    return c;
  }

  // "T64.w4.dv64.C64.s4.recompute", plus ".mma" when mma is on
  std::string to_string() const;
  nlohmann::json to_json() const;
  std::string hash() const;

  bool operator==(const TileConfig&) const = default;
  auto operator<=>(const TileConfig&) const = default;

 private:
  int block_tokens_ = 64;
  int warps_ = 4;
  int dv_block_ = 64;
  int chunk_ = 64;
  int state_splits_ = 4;
  PhiInBackward phi_backward_ = PhiInBackward::recompute;
  bool mma_ = false;
};

// Reads {"block_tokens": 64, "warps": 4, ...}; missing fields take `base`'s
// values, unknown fields are errors.
Result<TileConfig> tile_config_from_json(const nlohmann::json& j, const TileConfig& base);
Result<TileConfig> tile_config_from_string(std::string_view json_text, const TileConfig& base);

// Allowed values of each knob (the tuner's search space is a subset).
inline constexpr int kBlockTokenChoices[] = {8, 16, 32, 64, 128};
inline constexpr int kWarpChoices[] = {1, 2, 4, 8};
inline constexpr int kDvBlockChoices[] = {8, 16, 32, 64, 128, 256};
inline constexpr int kChunkChoices[] = {8, 16, 32, 64, 128};
inline constexpr int kStateSplitChoices[] = {1, 2, 4, 8, 16};

// Whether the kernels of `pass` can run `config` for `spec` on `arch`; the error
// says which limit is exceeded (shared memory, registers of the state
// accumulators, threads) or which knob value is not implemented.
Status can_implement(const AttentionSpec& spec, const TileConfig& config, const Arch& arch,
                     Pass pass = Pass::forward);

// The default config for a spec, arch and pass: a pure function (no timing), the
// largest tiles that can_implement accepts, preferring dv_block = value_dim.
TileConfig default_config(const AttentionSpec& spec, const Arch& arch, Pass pass = Pass::forward);

// default_config when it fits; otherwise an error (invalid_argument) saying no
// tile config fits the arch and what the smallest one needs.
Result<TileConfig> fitting_default_config(const AttentionSpec& spec, const Arch& arch, Pass pass = Pass::forward);

// Every config can_implement accepts for the pass, in a fixed order: the scalar
// configs (mma off), smallest tiles first, then the tensor-core ones (mma on)
// in the same order, so an evenly spaced sample ends on a tensor-core config
// wherever the spec has them.
std::vector<TileConfig> all_valid_configs(const AttentionSpec& spec, const Arch& arch, Pass pass = Pass::forward);

}  // namespace lunajit
