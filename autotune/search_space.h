// The tuner's search space: for each (spec, pass), the valid tile configs
// (codegen/tile_config.h all_valid_configs, which prunes by can_implement
// against the arch's shared memory, registers and threads), deduplicated by
// the knobs that pass's kernels actually read. Two configs that differ only in
// a knob the pass ignores generate different source text but identical
// kernels: compiling and timing both would only add noise and time.
//
// Effective knobs (templates/lunajit/linear_attention*.cuh):
//   forward, non-causal   block_tokens, warps, dv_block, state_splits
//                         (state and output kernels; key_stab reads block_tokens)
//                         + mma for bf16/fp16 (tensor-core state/output kernels)
//   forward, causal       chunk, warps, dv_block; + block_tokens for performer
//                         (its key_stab pre-pass tiles by block_tokens);
//                         + mma for bf16/fp16 except performer (the tensor-core
//                         causal chunk kernel), and with it state_splits (its
//                         super-chunk split; mma configs only)
//   backward              as the forward of the same causality, + phi_backward
//   feature_map           block_tokens, warps
#pragma once

#include <string>
#include <vector>

#include "codegen/tile_config.h"

namespace lunajit {

struct EffectiveKnobs {
  bool block_tokens = false;
  bool warps = false;
  bool dv_block = false;
  bool chunk = false;
  bool state_splits = false;
  bool phi_backward = false;
  bool mma = false;
  // state_splits counts only for mma configs (causal: the super-chunk split
  // of the tensor-core chunk walk; the scalar causal kernel has none).
  bool state_splits_mma_only = false;

  // Whether config c's kernels read its state_splits.
  bool reads_state_splits(const TileConfig& c) const { return state_splits && (!state_splits_mma_only || c.mma()); }

  // "block_tokens, warps, dv_block, state_splits"
  std::string to_string() const;
  bool operator==(const EffectiveKnobs&) const = default;
};

// The knobs the kernels of `pass` read for `spec` (the table above).
EffectiveKnobs effective_knobs(const AttentionSpec& spec, Pass pass);

// The config's values of the effective knobs only, e.g. "T64.w4.dv64.s4":
// equal signatures mean equal kernels.
std::string knob_signature(const TileConfig& config, const EffectiveKnobs& knobs);

// The deduplicated search space, in all_valid_configs order. Of configs with
// equal signatures the first one whose ignored knobs equal the default
// config's is kept (else the first one), so the default config is itself a
// candidate.
std::vector<TileConfig> search_space(const AttentionSpec& spec, Pass pass, const Arch& arch);

// `count` configs of `space` evenly spaced (first and last included), plus
// `must_have` if it is not among them: the reduced spaces of the demo and
// of the reduced test sweeps.
std::vector<TileConfig> sample_space(const std::vector<TileConfig>& space, size_t count, const TileConfig& must_have);

// The passes the tuner tunes for `spec`: forward, and backward once the
// generator accepts it (the feature-map pass is a diagnostic, not tuned).
std::vector<Pass> tunable_passes(const AttentionSpec& spec, const Arch& arch);

}  // namespace lunajit
