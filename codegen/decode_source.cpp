#include "codegen/decode_source.h"

#include <fmt/format.h>

#include "codegen/feature_map_info.h"
#include "codegen/generator.h"
#include "lunajit/kernel_args.cuh"
#include "lunajit/decode_layout.cuh"

namespace lunajit {
namespace {

// Replaces the one occurrence of `from` in `s`; false when it is not there exactly once.
bool replace_once(std::string& s, std::string_view from, std::string_view to) {
  const size_t at = s.find(from);
  if (at == std::string::npos || s.find(from, at + 1) != std::string::npos) return false;
  s.replace(at, from.size(), to);
  return true;
}

}  // namespace

Status check_decode_support(const AttentionSpec& spec) {
  if (!spec.causal)
    return Error::invalid("decode: spec.causal is false; decoding extends a causal sequence (set causal = true)");
  if (spec.family == Family::performer)
    return Error::invalid(
        "decode: not supported for family performer: its causal key stabiliser is the running max of the keys "
        "seen so far (docs/MATH.md §2), which the (S, z) state does not carry");
  if (spec.family == Family::cosformer)
    return Error::invalid(
        "decode: not supported for family cosformer: its features depend on the position and the sequence length");
  return ok_status();
}

Result<KernelSource> generate_decode(const AttentionSpec& spec, const TileConfig& config) {
  if (auto st = check_decode_support(spec); !st) return st.error();
  // The decode step is one scalar kernel whatever the forward runs: a
  // tensor-core config (the default of bf16/fp16 specs) decodes with the
  // same tiles on the scalar source.
  auto src = generate(spec, config.with_mma(false), Pass::forward);
  if (!src) return src;
  // The forward's Kernel description is exactly what the decode kernel reads;
  // only the included template, the entry and the header comment differ.
  const std::string expr = "lunajit::decode_step_kernel<lunajit_gen::Kernel>";
  std::string& c = src->code;
  const std::string old_kernels = fmt::format("//   {:<13} {}\n", "causal_chunk", "lunajit::causal_chunk_kernel<lunajit_gen::Kernel>");
  const bool ok =
      replace_once(c, "\n#include \"lunajit/linear_attention.cuh\"\n", "\n#include \"lunajit/linear_attention_decode.cuh\"\n") &&
      replace_once(c, "// pass:   forward (causal forward, fused chunks (causal_chunk_kernel))\n",
                   "// pass:   decode (one token per sequence against the carried state: decode_step_kernel)\n") &&
      replace_once(c, old_kernels, fmt::format("//   {:<13} {}\n", "decode_step", expr));
  if (!ok) return Error::failure(fmt::format("generate_decode: the forward source of {} changed shape; update "
                                             "codegen/decode_source.cpp",
                                             src->name));
  src->entries = {{"decode_step", expr}};
  const std::string_view fwd = "_forward_";
  if (size_t at = src->name.find(fwd); at != std::string::npos) src->name.replace(at, fwd.size(), "_decode_");
  return src;
}

Result<LaunchPlan> plan_decode(const AttentionSpec& spec, const TileConfig& config, const ProblemShape& shape) {
  if (auto st = check_decode_support(spec); !st) return st.error();
  if (auto st = validate(shape); !st) return st.error();
  const DecodeSmem l =
      decode_smem_layout(spec.head_dim, spec.feature_dim(), spec.value_dim, feature_map_scratch_per_row(spec));
  LaunchPlan plan;
  plan.launches.push_back({"decode_step",
                           {static_cast<unsigned>(int64_t(shape.batch) * shape.heads), 1, 1},
                           static_cast<unsigned>(config.threads()),
                           l.bytes()});
  return plan;
}

}  // namespace lunajit
