#include "codegen/tile_config.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "codegen/feature_map_info.h"
#include "codegen/launch_plan.h"
#include "common/hash.h"
#include "common/input_limits.h"
#include "lunajit/layout.cuh"

namespace lunajit {
namespace {

using nlohmann::json;

template <size_t N>
bool one_of(int v, const int (&choices)[N]) {
  return std::find(std::begin(choices), std::end(choices), v) != std::end(choices);
}

template <size_t N>
std::string list(const int (&choices)[N]) {
  std::string s;
  for (int c : choices) s += fmt::format("{}{}", s.empty() ? "" : ", ", c);
  return s;
}


// The tensor-core backward (templates/lunajit/linear_attention_backward_mma.cuh):
// bf16 and fp16 specs (bf16 operands either way) but the causal performer; its kernels work over the whole dv
// (dstate, dq, dkv) and over dv_block (the state pass, the forward's mma_state_block). The causal one
// walks chunks within state_splits super-chunk ranges: its token tile is the chunk.
Status can_implement_mma_backward(const AttentionSpec& spec, const TileConfig& c) {
  const std::string name = c.to_string();
  if (spec.causal && spec.family == Family::performer)
    return Error::invalid(fmt::format("{}: mma = true: the causal performer's backward (running key stabiliser, "
                                      "docs/MATH.md §2) has no tensor-core kernels; use mma = false",
                                      name));
  // Measured on an H200 (bench/gpu_check.sh, 2026-12-04): the elu causal
  // backward on tensor cores gave dq at a relative RMS error of 1.0 (bf16 and
  // fp16; seq 16, 64, 300; 1 or 16 ranges; chunk 16 or 32), and with several
  // ranges dk and dv through the dq kernel's [dS | dz] partials, while the
  // host emulator (all sanitizers) and compute-sanitizer (initcheck,
  // racecheck, synccheck) were clean and relu, cosformer, t2r, hedgehog and
  // LUNA passed through the same kernels. Until the cause is found the tuner
  // must not pick it: elu's causal backward takes the scalar kernels.
  if (spec.causal && spec.family == Family::elu)
    return Error::invalid(fmt::format("{}: mma = true: the elu causal backward on tensor cores is wrong on a GPU "
                                      "(dq, measured on an H200; the host emulator does not reproduce it); use "
                                      "mma = false",
                                      name));
  if (spec.dtype == DType::fp32)
    return Error::invalid(fmt::format("{}: mma = true: the backward runs on tensor cores for dtype bf16 or fp16 "
                                      "(fp32 keeps the exact path); dtype = {}; use mma = false",
                                      name, to_string(spec.dtype)));
  const int D = spec.feature_dim(), dv = spec.value_dim, tokens = spec.causal ? c.chunk() : c.block_tokens();
  const char* tile = spec.causal ? "chunk" : "block_tokens";
  if (D % 16 != 0 || dv % 16 != 0 || c.dv_block() % 16 != 0 || tokens % 16 != 0)
    return Error::invalid(fmt::format("{}: mma = true (backward) needs the feature dim D, value_dim, dv_block and "
                                      "{} multiples of 16; D = {}, value_dim = {}, dv_block = {}, {} = {}",
                                      name, tile, D, dv, c.dv_block(), tile, tokens));
  struct Product {
    const char* kernel;
    KernelKind kind;
    int n;
  };
  for (const Product& p : {Product{"state", KernelKind::state, c.dv_block()}, Product{"dstate", KernelKind::state, dv},
                           Product{"dq/dkv (dphi)", KernelKind::output, D}, Product{"dkv (dv)", KernelKind::output, dv}}) {
    const MmaWarpTiling w = mma_warp_tiling(p.kind, D, p.n, tokens, c.warps());
    if (!w.fits)
      return Error::invalid(fmt::format("{}: mma = true: {} warps do not tile the {} kernel's {} x {} product "
                                        "(16 x 8 tiles)",
                                        name, c.warps(), p.kernel, p.kind == KernelKind::state ? D : tokens, p.n));
    if (w.accumulators > kMaxMmaAccumulatorsPerThread)
      return Error::invalid(fmt::format("{}: mma = true: the {} kernel would hold {} fp32 accumulators per thread; "
                                        "at most {} fit in registers (use more warps)",
                                        name, p.kernel, w.accumulators, kMaxMmaAccumulatorsPerThread));
  }
  return ok_status();
}

// The tensor-core kernels (templates/lunajit/linear_attention_mma.cuh): which
// specs and tile shapes they implement.
Status can_implement_mma(const AttentionSpec& spec, const TileConfig& c, Pass pass) {
  const std::string name = c.to_string();
  if (pass == Pass::feature_map)
    return Error::invalid(fmt::format("{}: mma = true: the feature_map pass has no tensor-core kernel; use "
                                      "mma = false",
                                      name));
  if (pass == Pass::backward) return can_implement_mma_backward(spec, c);
  if (spec.causal && spec.family == Family::performer)
    return Error::invalid(fmt::format("{}: mma = true: the causal performer (running key stabiliser, "
                                      "docs/MATH.md §2) has no tensor-core kernel; use mma = false",
                                      name));
  if (spec.dtype == DType::fp32)
    return Error::invalid(fmt::format("{}: mma = true needs dtype bf16 or fp16 (fp32 specs keep the exact fp32 "
                                      "path); use mma = false",
                                      name));
  const int D = spec.feature_dim();
  if (D % 16 != 0)
    return Error::invalid(fmt::format("{}: mma = true needs the feature dim D a multiple of 16 (mma k/m tiles); "
                                      "D = {}",
                                      name, D));
  if (c.dv_block() % 16 != 0)
    return Error::invalid(fmt::format("{}: mma = true needs dv_block a multiple of 16; dv_block = {}", name,
                                      c.dv_block()));
  if (spec.causal) {
    // mma_causal_chunk_kernel: tiles over the chunk, the state in registers.
    if (c.chunk() % 16 != 0)
      return Error::invalid(fmt::format("{}: mma = true needs chunk a multiple of 16 (causal); chunk = {}", name,
                                        c.chunk()));
    for (KernelKind kind : {KernelKind::state, KernelKind::output}) {
      const MmaWarpTiling w = mma_warp_tiling(kind, D, c.dv_block(), c.chunk(), c.warps());
      if (!w.fits)
        return Error::invalid(fmt::format("{}: mma = true: {} warps do not tile the causal kernel's {} x {} "
                                          "product (16 x 8 tiles)",
                                          name, c.warps(), kind == KernelKind::state ? D : c.chunk(),
                                          c.dv_block()));
    }
    const int acc = mma_causal_accumulators(D, c.dv_block(), c.chunk(), c.warps());
    if (acc > kMaxMmaCausalAccumulatorsPerThread)
      return Error::invalid(fmt::format("{}: mma = true: the causal kernel would hold {} fp32 accumulators per "
                                        "thread (state, A strip, output); at most {} fit in registers (use more "
                                        "warps, a smaller chunk or a smaller dv_block)",
                                        name, acc, kMaxMmaCausalAccumulatorsPerThread));
    return ok_status();
  }
  if (c.block_tokens() % 16 != 0)
    return Error::invalid(fmt::format("{}: mma = true needs block_tokens a multiple of 16; block_tokens = {}", name,
                                      c.block_tokens()));
  for (KernelKind kind : {KernelKind::state, KernelKind::output}) {
    const char* role = kind == KernelKind::state ? "state" : "output";
    const MmaWarpTiling w = mma_warp_tiling(kind, D, c.dv_block(), c.block_tokens(), c.warps());
    if (!w.fits)
      return Error::invalid(fmt::format("{}: mma = true: {} warps do not tile the {} kernel's {} x {} product "
                                        "(16 x 8 tiles)",
                                        name, c.warps(), role, kind == KernelKind::state ? D : c.block_tokens(),
                                        c.dv_block()));
    if (w.accumulators > kMaxMmaAccumulatorsPerThread)
      return Error::invalid(fmt::format("{}: mma = true: the {} kernel would hold {} fp32 accumulators per thread; "
                                        "at most {} fit in registers (use more warps or a smaller dv_block)",
                                        name, role, w.accumulators, kMaxMmaAccumulatorsPerThread));
  }
  return ok_status();
}

}  // namespace

std::string_view to_string(Pass p) {
  switch (p) {
    case Pass::feature_map: return "feature_map";
    case Pass::forward: return "forward";
    case Pass::backward: return "backward";
  }
  return "?";
}

Result<Pass> parse_pass(std::string_view s) {
  for (Pass p : {Pass::feature_map, Pass::forward, Pass::backward})
    if (to_string(p) == s) return p;
  return Error::invalid(std::string("pass = \"") + std::string(s) +
                        "\": unknown; allowed: feature_map, forward, backward");
}

TileConfig::TileConfig(int block_tokens, int warps, int dv_block, int chunk, int state_splits,
                       PhiInBackward phi_backward, bool mma)
    : block_tokens_(block_tokens),
      warps_(warps),
      dv_block_(dv_block),
      chunk_(chunk),
      state_splits_(state_splits),
      phi_backward_(phi_backward),
      mma_(mma) {}

std::string TileConfig::to_string() const {
  return fmt::format("T{}.w{}.dv{}.C{}.s{}.{}{}", block_tokens_, warps_, dv_block_, chunk_, state_splits_,
                     phi_backward_ == PhiInBackward::recompute ? "recompute" : "save", mma_ ? ".mma" : "");
}

json TileConfig::to_json() const {
  json j = {{"block_tokens", block_tokens_}, {"warps", warps_},         {"dv_block", dv_block_},
            {"chunk", chunk_},               {"state_splits", state_splits_},
            {"phi_backward", phi_backward_ == PhiInBackward::recompute ? "recompute" : "save"}};
  if (mma_) j["mma"] = true;  // only when on: configs without it keep their hashes
  return j;
}

std::string TileConfig::hash() const { return content_hash(to_json().dump()); }

Result<TileConfig> tile_config_from_json(const json& j, const TileConfig& base) {
  if (!j.is_object()) return Error::invalid(fmt::format("config: expected a JSON object, got {}", j.type_name()));
  int v[5] = {base.block_tokens(), base.warps(), base.dv_block(), base.chunk(), base.state_splits()};
  const char* names[5] = {"block_tokens", "warps", "dv_block", "chunk", "state_splits"};
  PhiInBackward phi = base.phi_backward();
  bool mma = base.mma();
  std::string out_of_range[5];
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "mma") {
      if (!it->is_boolean())
        return Error::invalid(fmt::format("config.mma = {}: allowed: true, false", limits::quote(it->dump())));
      mma = it->get<bool>();
      continue;
    }
    if (key == "phi_backward") {
      if (*it == "recompute") phi = PhiInBackward::recompute;
      else if (*it == "save") phi = PhiInBackward::save;
      else return Error::invalid(fmt::format("config.phi_backward = {}: allowed: \"recompute\", \"save\"", it->dump()));
      continue;
    }
    auto pos = std::find_if(std::begin(names), std::end(names), [&](const char* n) { return key == n; });
    if (pos == std::end(names))
      return Error::invalid(fmt::format("config.{}: unknown field; allowed fields: block_tokens, warps, dv_block, "
                                        "chunk, state_splits, phi_backward, mma", key));
    if (!it->is_number_integer())
      return Error::invalid(fmt::format("config.{} = {}: expected an integer", key, limits::quote(it->dump())));
    // Read 64-bit-safe: 4294967312 must be an error, not 16. Out of int range
    // it is no allowed value of any knob; the check below names the allowed ones.
    const bool fits = it->is_number_unsigned() ? it->get<uint64_t>() <= uint64_t(INT32_MAX)
                                               : it->get<int64_t>() >= INT32_MIN && it->get<int64_t>() <= INT32_MAX;
    if (!fits) {
      v[pos - std::begin(names)] = 0;
      out_of_range[pos - std::begin(names)] = it->dump();
    } else {
      v[pos - std::begin(names)] = static_cast<int>(it->get<int64_t>());
    }
  }
  struct Check { int value; const char* name; std::string allowed; bool ok; };
  const Check checks[] = {
      {v[0], "block_tokens", list(kBlockTokenChoices), one_of(v[0], kBlockTokenChoices)},
      {v[1], "warps", list(kWarpChoices), one_of(v[1], kWarpChoices)},
      {v[2], "dv_block", list(kDvBlockChoices), one_of(v[2], kDvBlockChoices)},
      {v[3], "chunk", list(kChunkChoices), one_of(v[3], kChunkChoices)},
      {v[4], "state_splits", list(kStateSplitChoices), one_of(v[4], kStateSplitChoices)},
  };
  for (size_t i = 0; i < std::size(checks); ++i) {
    const Check& c = checks[i];
    if (!c.ok)
      return Error::invalid(fmt::format("config.{} = {}: allowed: {}", c.name,
                                        out_of_range[i].empty() ? std::to_string(c.value) : out_of_range[i],
                                        c.allowed));
  }
  return TileConfig(v[0], v[1], v[2], v[3], v[4], phi, mma);
}

Result<TileConfig> tile_config_from_string(std::string_view text, const TileConfig& base) {
  auto j = parse_json_text(text, "config");
  if (!j) return j.error();
  return tile_config_from_json(*j, base);
}

Status can_implement(const AttentionSpec& spec, const TileConfig& c, const Arch& arch, Pass pass) {
  if (c.threads() > arch.max_threads_per_block)
    return Error::invalid(fmt::format("{}: {} threads exceed {}'s {} per block", c.to_string(), c.threads(),
                                      arch.name(), arch.max_threads_per_block));
  if (c.dv_block() >= 2 * spec.value_dim && c.dv_block() > kDvBlockChoices[0])
    return Error::invalid(fmt::format("{}: dv_block {} is at least twice value_dim {} (half the block would idle); "
                                      "use dv_block < 2 * value_dim",
                                      c.to_string(), c.dv_block(), spec.value_dim));
  if (pass == Pass::backward && c.phi_backward() == PhiInBackward::save)
    return Error::invalid(fmt::format("{}: phi_backward = save is not implemented yet (the backward recomputes "
                                      "phi); allowed: recompute",
                                      c.to_string()));
  if (c.mma()) {
    // mma.sync.m16n8k16 with bf16 or f16 operands and cp.async are sm_80 and later
    // (PTX ISA); ptxas rejects them for sm_75 ("requires .target sm_80 or higher").
    if (arch.sm < 80)
      return Error::invalid(fmt::format("{}: mma = true needs sm_80 or later (mma.sync m16n8k16 on bf16/fp16); "
                                        "{} has none; use mma = false",
                                        c.to_string(), arch.name()));
    if (auto st = can_implement_mma(spec, c, pass); !st) return st;
  }
  const long long limit = arch.max_smem_per_block;
  for (const std::string& role : kernel_roles(spec, pass, c)) {
    const int64_t bytes = dynamic_smem_bytes(spec, c, pass, role);
    if (bytes > limit)
      return Error::invalid(fmt::format("{}: the {} kernel needs {} bytes of shared memory; {} allows {}",
                                        c.to_string(), role, bytes, arch.name(), limit));
  }
  // Register accumulators of the state passes: (D, dv_block) forward, (D, dv) backward.
  const int D = spec.feature_dim();
  auto registers = [&](const char* kernel, int dv) -> Status {
    const int entries = state_entries_per_thread(D, dv, c.threads());
    if (entries > kMaxStateEntriesPerThread)
      return Error::invalid(fmt::format("{}: the {} kernel would hold {} accumulators per thread (D {} x {} / {} "
                                        "threads); at most {} fit in registers",
                                        c.to_string(), kernel, entries, D, dv, c.threads(),
                                        kMaxStateEntriesPerThread));
    return ok_status();
  };
  if (!spec.causal && pass == Pass::forward && !c.mma())  // mma: checked by can_implement_mma
    if (auto st = registers("state", c.dv_block()); !st) return st;
  if (!spec.causal && pass == Pass::backward) {
    if (auto st = registers("state", c.dv_block()); !st) return st;
    if (auto st = registers("dstate", spec.value_dim); !st) return st;
  }
  return ok_status();
}

TileConfig default_config(const AttentionSpec& spec, const Arch& arch, Pass pass) {
  // Prefer one block over all of dv (phi computed once per token), then the
  // largest chunk and tile that fit: fewer, larger tiles amortize the feature
  // map's parameter reads. Splits = 4 is the most ranges; each launch runs the
  // count 1 .. 4 the cost model picks for its GPU and shape (best_splits).
  std::vector<int> dv_blocks;
  for (int dvb : kDvBlockChoices)
    if (dvb < 2 * spec.value_dim || dvb == kDvBlockChoices[0]) dv_blocks.push_back(dvb);
  std::reverse(dv_blocks.begin(), dv_blocks.end());
  // The non-causal passes of a bf16/fp16 spec on tensor cores search their
  // own tile orders first (chunk 64, 4 splits, mma on); the first that
  // can_implement accepts is the default:
  // - backward: 16-token tiles first. Its dq and dkv kernels stage a tile's
  //   phi, J^T operands and the state in shared memory (T64: 161 and 153 KB
  //   for the default LUNA spec, one block of 4 warps per SM, too few to hide
  //   the mma and ldmatrix latencies); T16 (70 and 68 KB) keeps 2 (sm_80) or
  //   3 (sm_90) blocks resident. Predicted (docs/ARCHITECTURE.md, that spec
  //   at B 8, H 12, N 16384): H100 28.2 -> 12.8 ms, A100 56.1 -> 28.5 ms.
  // - forward: the largest tiles, 8 warps first. Its output kernel (68 KB at
  //   T64) keeps 3 blocks per SM on sm_90 and 2 on sm_80, 12 or 8 warps with
  //   4 a block against 24 or 16 with 8. Predicted: H100 0.379 -> 0.337 ms,
  //   A100 1.019 -> 0.512 ms. Not the causal forward: its chunk kernel holds
  //   8 warps per SM either way (255 registers at 4 warps, 2 blocks; 211 at
  //   8, one block), and what 8 warps gain at that shape is wave
  //   quantization, which changes with batch x heads.
  // No kernel of either spills on sm_80 or sm_90 (tests/runtime_nvrtc).
  if (!spec.causal && spec.dtype != DType::fp32 && pass != Pass::feature_map) {
    const bool bwd = pass == Pass::backward;
    const std::vector<int> tokens_order = bwd ? std::vector<int>{16, 32, 64} : std::vector<int>{64, 32, 16, 8};
    const std::vector<int> warps_order = bwd ? std::vector<int>{4, 8, 2} : std::vector<int>{8, 4, 2};
    for (int dvb : dv_blocks)
      for (int tokens : tokens_order)
        for (int warps : warps_order) {
          const TileConfig c = TileConfig(tokens, warps, dvb, 64, 4).with_mma(true);
          if (can_implement(spec, c, arch, pass)) return c;
        }
  }
  // The causal backward of a bf16/fp16 spec (not the performer) runs on
  // tensor cores, each block walking the chunks of one of 16 super-chunk
  // ranges: small chunks (16 tokens: 114,096 bytes of shared memory for the
  // default LUNA spec's causal_dq, 2 blocks per SM on sm_90) and 8 warps
  // first. 16 ranges: the most the search space has, and the most a launch
  // may run; each runs the count the cost model picks for its GPU and shape
  // (best_splits: 11 on H100 at B 8, H 12, N 16384), for a workspace of up
  // to 16 fp32 states per (batch, head). Predicted (docs/ARCHITECTURE.md, B 8, H 12,
  // N 16384, H100): the scalar scans' 328 ms -> 4.48 ms (2026-12-05, the
  // walks counted as they issue, their intra-chunk scores on mma).
  if (spec.causal && pass == Pass::backward && spec.dtype != DType::fp32 && spec.family != Family::performer)
    for (int dvb : dv_blocks)
      for (int chunk : {16, 32, 64})
        for (int warps : {8, 4, 2}) {
          const TileConfig c = TileConfig(64, warps, dvb, chunk, 16).with_mma(true);
          if (can_implement(spec, c, arch, pass)) return c;
        }
  for (int dvb : dv_blocks)
    for (int chunk : {64, 32, 16, 8})
      for (int tokens : {64, 32, 16, 8})
        for (int warps : {4, 8, 2, 1}) {
          TileConfig c(tokens, warps, dvb, chunk, 4);
          if (!can_implement(spec, c, arch, pass)) continue;
          // The forward of a bf16/fp16 spec runs on tensor cores by default
          // (the same tiles with mma on, where the mma kernels implement
          // them); fp32 specs and the causal performer keep the scalar kernels.
          if (pass != Pass::feature_map && spec.dtype != DType::fp32 &&
              can_implement(spec, c.with_mma(true), arch, pass))
            return c.with_mma(true);
          return c;
        }
  return TileConfig(8, 1, 8, 8, 1);  // the smallest: fitting_default_config reports why it does not fit
}

Result<TileConfig> fitting_default_config(const AttentionSpec& spec, const Arch& arch, Pass pass) {
  TileConfig c = default_config(spec, arch, pass);
  if (auto st = can_implement(spec, c, arch, pass); !st)
    return Error::invalid(fmt::format("no tile config fits {} for the {} pass of this spec; the smallest, {}",
                                      arch.name(), to_string(pass), st.error().message));
  return c;
}

std::vector<TileConfig> all_valid_configs(const AttentionSpec& spec, const Arch& arch, Pass pass) {
  std::vector<TileConfig> out;
  for (bool mma : {false, true})
    for (int tokens : kBlockTokenChoices)
      for (int warps : kWarpChoices)
        for (int dvb : kDvBlockChoices)
          for (int chunk : kChunkChoices)
            for (int splits : kStateSplitChoices)
              for (auto phi : {PhiInBackward::recompute, PhiInBackward::save}) {
                TileConfig c(tokens, warps, dvb, chunk, splits, phi, mma);
                if (can_implement(spec, c, arch, pass)) out.push_back(c);
              }
  return out;
}

}  // namespace lunajit
