#include "codegen/generator.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "codegen/feature_map_info.h"
#include "codegen/feature_params.h"
#include "codegen/launch_plan.h"

namespace lunajit {
namespace {

std::string_view element_type(DType t) {
  switch (t) {
    case DType::fp32: return "float";
    case DType::fp16: return "__half";
    case DType::bf16: return "__nv_bfloat16";
  }
  return "float";
}

std::string_view pass_summary(const AttentionSpec& s, const TileConfig& c, Pass p) {
  switch (p) {
    case Pass::feature_map: return "feature map alone: phi(x) written as fp32";
    case Pass::forward:
      if (s.causal) return "causal forward, fused chunks (causal_chunk_kernel)";
      return c.state_splits() > 1 ? "non-causal forward, state pass, its partials reduced, output pass"
                                  : "non-causal forward, state pass + output pass";
    case Pass::backward:
      if (s.causal && c.mma())
        return "causal backward, super-chunk walks: range states and their prefix, dq walks, suffix, dk and dv walks";
      if (s.causal) return "causal backward: forward scan for dq, reverse scan for dk, dv";
      return c.state_splits() > 1 || c.mma() ? "non-causal backward: state, dq, dstate and dkv passes, the state partials reduced"
                                  : "non-causal backward: state, dq, dstate and dkv passes";
  }
  return "";
}

// The tensor-core variants (config.mma()) of the forward's state, output and
// causal_chunk roles (templates/lunajit/linear_attention_mma.cuh) and of the
// non-causal backward's state, dstate, dq and dkv roles
// (templates/lunajit/linear_attention_backward_mma.cuh).
bool uses_mma(const TileConfig& c, Pass p) { return c.mma() && p != Pass::feature_map; }

bool mma_role(Pass p, std::string_view role) {
  if (p == Pass::forward) return role == "state" || role == "output" || role == "causal_chunk";
  return role == "state" || role == "dstate" || role == "dq" || role == "dkv" || role == "causal_dq" ||
         role == "causal_dkv" || role == "state_reduce" || role == "dstate_reduce";
}

std::vector<KernelEntry> entries_for(const AttentionSpec& s, const TileConfig& c, Pass p) {
  std::vector<KernelEntry> e;
  for (const std::string& role : kernel_roles(s, p, c)) {
    const bool mma = uses_mma(c, p) && mma_role(p, role);
    e.push_back({role, fmt::format("lunajit::{}{}<lunajit_gen::Kernel>", mma ? "mma_" : "", kernel_template(p, role))});
  }
  return e;
}

}  // namespace

Result<KernelSource> generate(const AttentionSpec& spec, const TileConfig& config, Pass pass) {
  if (auto st = validate(spec); !st) return st.error();
  if (config.mma() && pass == Pass::forward &&
      (spec.dtype == DType::fp32 || (spec.causal && spec.family == Family::performer)))
    return Error::invalid(fmt::format("config {}: mma = true needs a bf16 or fp16 spec other than the causal "
                                      "performer (the fp32 forward and the causal performer's running key "
                                      "stabiliser have no tensor-core kernels)",
                                      config.to_string()));
  if (config.mma() && pass == Pass::backward &&
      (spec.dtype == DType::fp32 || (spec.causal && spec.family == Family::performer)))
    return Error::invalid(fmt::format("config {}: mma = true in the backward needs a bf16 or fp16 spec other than "
                                      "the causal performer (the fp32 backward and the causal performer's running "
                                      "key stabiliser have no tensor-core kernels)",
                                      config.to_string()));

  const std::string hash = spec_hash(spec);
  KernelSource src;
  src.spec = spec;
  src.config = config;
  src.pass = pass;
  src.name = fmt::format("{}_{}_{}{}_{}_{}", to_string(spec.family), to_string(pass),
                         spec.causal ? "causal" : "noncausal", "", to_string(spec.dtype), hash.substr(0, 8));
  src.entries = entries_for(spec, config, pass);

  const ParamLayout params = param_layout(spec);
  std::string& c = src.code;
  c += "// lunajit generated kernel source: do not edit; regenerate with `lunajit emit`.\n";
  c += fmt::format("// pass:   {} ({})\n", to_string(pass), pass_summary(spec, config, pass));
  c += fmt::format("// spec:   {}\n", canonical_json(spec));
  c += fmt::format("// config: {} {}\n", config.to_string(), config.to_json().dump());
  c += "// kernels (NVRTC name expressions):\n";
  for (const auto& e : src.entries) c += fmt::format("//   {:<13} {}\n", e.role, e.name_expression);
  c += pass == Pass::backward ? (uses_mma(config, pass) ? "\n#include \"lunajit/linear_attention_backward_mma.cuh\"\n"
                                                         : "\n#include \"lunajit/linear_attention_backward.cuh\"\n")
         : uses_mma(config, pass) ? "\n#include \"lunajit/linear_attention_mma.cuh\"\n"
                                  : "\n#include \"lunajit/linear_attention.cuh\"\n";
  c += "\nnamespace lunajit_gen {\n\n";
  c += "struct FeatureOptions {\n" + feature_options_body(spec) + "};\n\n";
  c += "struct Kernel {\n";
  c += fmt::format("  using T = {};\n", element_type(spec.dtype));
  c += fmt::format("  using FeatureMap = {}<FeatureOptions>;\n", feature_map_template(spec.family));
  c += fmt::format("  static constexpr int d = {};\n", spec.head_dim);
  c += fmt::format("  static constexpr int dv = {};\n", spec.value_dim);
  c += fmt::format("  static constexpr int D = {};\n", spec.feature_dim());
  c += fmt::format("  static constexpr int threads = {};\n", config.threads());
  c += fmt::format("  static constexpr int block_tokens = {};\n", config.block_tokens());
  c += fmt::format("  static constexpr int dv_block = {};\n", config.dv_block());
  c += fmt::format("  static constexpr int chunk = {};\n", config.chunk());
  c += fmt::format("  static constexpr int state_splits = {};\n", config.state_splits());
  c += fmt::format("  static constexpr bool causal = {};\n", spec.causal);
  c += fmt::format("  static constexpr bool mma = {};\n", uses_mma(config, pass));
  c += fmt::format("  static constexpr bool normalize = {};\n", spec.normalize);
  c += fmt::format("  static constexpr float eps = {};\n", float_literal(spec.eps));
  c += fmt::format("  static constexpr bool params_per_head = {};\n", spec.params_per_head);
  c += fmt::format("  static constexpr int param_floats = {};\n", params.per_head_floats);
  c += fmt::format("  static constexpr bool performer = {};\n", spec.family == Family::performer);
  c += "};\n\n";
  c += fmt::format(
      "static_assert(Kernel::FeatureMap::kScratchPerRow == {},\n"
      "              \"host (codegen/feature_map_info.cpp) and device disagree on the feature map's scratch\");\n",
      feature_map_scratch_per_row(spec));
  if (pass == Pass::backward) {
    c += fmt::format(
        "static_assert(lunajit::FeatureMapBackward<Kernel::FeatureMap>::kScratchPerRow == {},\n"
        "              \"host and device disagree on the feature map backward's scratch\");\n",
        feature_map_backward_scratch_per_row(spec));
    c += fmt::format(
        "static_assert(lunajit::FeatureMapBackward<Kernel::FeatureMap>::kLearned == {},\n"
        "              \"host and device disagree on whether the feature map learns parameters\");\n",
        has_learned_params(spec));
  }
  c += "\n}  // namespace lunajit_gen\n";
  return src;
}

}  // namespace lunajit
