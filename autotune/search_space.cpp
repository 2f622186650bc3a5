#include "autotune/search_space.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "codegen/generator.h"

namespace lunajit {

std::string EffectiveKnobs::to_string() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (on) s += fmt::format("{}{}", s.empty() ? "" : ", ", name);
  };
  add(block_tokens, "block_tokens");
  add(warps, "warps");
  add(dv_block, "dv_block");
  add(chunk, "chunk");
  add(state_splits, "state_splits");
  add(phi_backward, "phi_backward");
  add(mma, "mma");
  return s;
}

EffectiveKnobs effective_knobs(const AttentionSpec& spec, Pass pass) {
  EffectiveKnobs k;
  k.warps = true;
  if (pass == Pass::feature_map) {
    k.block_tokens = true;
    return k;
  }
  k.dv_block = true;
  if (spec.causal) {
    k.chunk = true;
    k.block_tokens = spec.family == Family::performer;
    // mma_causal_chunk_kernel and the tensor-core backward's chunk walks;
    // the causal performer has neither (can_implement).
    k.mma = spec.dtype != DType::fp32 && spec.family != Family::performer;
    k.state_splits = k.mma;  // the super-chunk split of the tensor-core walks (forward and backward)
    k.state_splits_mma_only = true;
  } else {
    k.block_tokens = true;
    k.state_splits = true;
    // The tensor-core backward: non-causal bf16 or fp16 (can_implement).
    k.mma = spec.dtype != DType::fp32;
  }
  k.phi_backward = pass == Pass::backward;
  return k;
}

std::string knob_signature(const TileConfig& c, const EffectiveKnobs& k) {
  std::string s;
  auto add = [&](bool on, const std::string& part) {
    if (on) s += (s.empty() ? "" : ".") + part;
  };
  add(k.block_tokens, fmt::format("T{}", c.block_tokens()));
  add(k.warps, fmt::format("w{}", c.warps()));
  add(k.dv_block, fmt::format("dv{}", c.dv_block()));
  add(k.chunk, fmt::format("C{}", c.chunk()));
  add(k.reads_state_splits(c), fmt::format("s{}", c.state_splits()));
  add(k.phi_backward, c.phi_backward() == PhiInBackward::recompute ? "recompute" : "save");
  add(k.mma && c.mma(), "mma");  // scalar configs keep their signatures
  return s;
}

std::vector<TileConfig> search_space(const AttentionSpec& spec, Pass pass, const Arch& arch) {
  const EffectiveKnobs knobs = effective_knobs(spec, pass);
  const TileConfig def = default_config(spec, arch, pass);
  // The ignored knobs of `c` are the default's: then c's source is the one the
  // default config would generate for those knobs.
  auto ignored_match_default = [&](const TileConfig& c) {
    return (knobs.block_tokens || c.block_tokens() == def.block_tokens()) &&
           (knobs.dv_block || c.dv_block() == def.dv_block()) && (knobs.chunk || c.chunk() == def.chunk()) &&
           (knobs.reads_state_splits(c) || c.state_splits() == def.state_splits()) &&
           (knobs.phi_backward || c.phi_backward() == def.phi_backward()) && (knobs.mma || c.mma() == def.mma());
  };
  std::vector<TileConfig> out;
  std::map<std::string, size_t> index;  // signature -> position in out
  for (const TileConfig& c : all_valid_configs(spec, arch, pass)) {
    const std::string sig = knob_signature(c, knobs);
    auto it = index.find(sig);
    if (it == index.end()) {
      index.emplace(sig, out.size());
      out.push_back(c);
    } else if (!ignored_match_default(out[it->second]) && ignored_match_default(c)) {
      out[it->second] = c;
    }
  }
  return out;
}

std::vector<TileConfig> sample_space(const std::vector<TileConfig>& space, size_t count,
                                     const TileConfig& must_have) {
  std::vector<TileConfig> out;
  if (count == 0 || space.size() <= count) {
    out = space;
  } else if (count == 1) {
    out.push_back(space.front());
  } else {
    for (size_t i = 0; i < count; ++i) out.push_back(space[i * (space.size() - 1) / (count - 1)]);
  }
  if (std::find(out.begin(), out.end(), must_have) == out.end()) out.push_back(must_have);
  return out;
}

std::vector<Pass> tunable_passes(const AttentionSpec& spec, const Arch& arch) {
  std::vector<Pass> out;
  for (Pass p : {Pass::forward, Pass::backward})
    if (generate(spec, default_config(spec, arch, p), p).ok()) out.push_back(p);
  return out;
}

}  // namespace lunajit
