// What the generator and the host side need to know about a family's device
// feature map (templates/lunajit/feature_maps.cuh) without compiling it.
#pragma once

#include <string>

#include "codegen/attention_spec.h"

namespace lunajit {

// FeatureMap::kScratchPerRow of the family's template (asserted in the generated source).
int feature_map_scratch_per_row(const AttentionSpec& spec);

// FeatureMapBackward<FM>::kScratchPerRow (templates/lunajit/feature_map_backward.cuh).
int feature_map_backward_scratch_per_row(const AttentionSpec& spec);

// The template's name, e.g. "lunajit::LunaFeatureMap".
std::string feature_map_template(Family family);

// Body of the generated `struct FeatureOptions { ... };` (static constexpr members).
std::string feature_options_body(const AttentionSpec& spec);

// A C++ float literal that reads back to the same fp32 value: "1.000000000e-06f".
std::string float_literal(double v);

}  // namespace lunajit
