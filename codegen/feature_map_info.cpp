#include "codegen/feature_map_info.h"

#include <fmt/format.h>

namespace lunajit {
namespace {

std::string int_member(const char* name, long long v) {
  return fmt::format("  static constexpr int {} = {};\n", name, v);
}
std::string bool_member(const char* name, bool v) {
  return fmt::format("  static constexpr bool {} = {};\n", name, v ? "true" : "false");
}

}  // namespace

// Floats printed so that they read back to the same fp32 value in any compiler.
std::string float_literal(double v) { return fmt::format("{:.9e}f", v); }

int feature_map_scratch_per_row(const AttentionSpec& s) {
  switch (s.family) {
    case Family::luna:
    case Family::performer: return 1;
    case Family::slay: return 1 + s.slay.anchors + s.slay.nodes * s.slay.prf_features;
    default: return 0;
  }
}

int feature_map_backward_scratch_per_row(const AttentionSpec& s) {
  switch (s.family) {
    case Family::luna: return 1 + 2 * s.luna.projections;
    case Family::performer: return 1;
    case Family::slay: return s.slay.anchors + s.slay.nodes * s.slay.prf_features;
    default: return 0;
  }
}

std::string feature_map_template(Family f) {
  switch (f) {
    case Family::luna: return "lunajit::LunaFeatureMap";
    case Family::performer: return "lunajit::PerformerFeatureMap";
    case Family::rff: return "lunajit::RffFeatureMap";
    case Family::elu: return "lunajit::EluFeatureMap";
    case Family::relu: return "lunajit::ReluFeatureMap";
    case Family::t2r: return "lunajit::T2rFeatureMap";
    case Family::hedgehog: return "lunajit::HedgehogFeatureMap";
    case Family::cosformer: return "lunajit::CosformerFeatureMap";
    case Family::slay: return "lunajit::SlayFeatureMap";
  }
  return {};
}

std::string feature_options_body(const AttentionSpec& s) {
  std::string b = int_member("d", s.head_dim);
  switch (s.family) {
    case Family::luna:
      b += int_member("projections", s.luna.projections);
      b += int_member("channels", s.luna.channels);
      b += int_member("mlp_width", s.luna.mlp_width);
      b += fmt::format("  static constexpr lunajit::fm::Act activation = lunajit::fm::Act::{};\n",
                       to_string(s.luna.activation));
      b += fmt::format("  static constexpr lunajit::fm::OutAct output_activation = lunajit::fm::OutAct::{};\n",
                       to_string(s.luna.output_activation));
      b += bool_member("shared_channels", s.luna.shared_channels);
      b += bool_member("envelope", s.luna.envelope);
      b += fmt::format("  static constexpr lunajit::fm::LunaVariant variant = lunajit::fm::LunaVariant::{};\n",
                       to_string(s.luna.variant));
      break;
    case Family::performer:
      b += int_member("features", s.performer.features);
      b += fmt::format("  static constexpr float kernel_eps = {};\n", float_literal(s.performer.kernel_eps));
      break;
    case Family::rff: b += int_member("features", s.rff.features); break;
    case Family::t2r: b += int_member("features", s.t2r.features); break;
    case Family::hedgehog: b += int_member("features", s.hedgehog.features); break;
    case Family::slay:
      b += int_member("nodes", s.slay.nodes);
      b += int_member("anchors", s.slay.anchors);
      b += int_member("prf_features", s.slay.prf_features);
      break;
    default: break;
  }
  return b;
}

}  // namespace lunajit
