// AttentionSpec: what a user asks lunajit to generate kernels for.
//
// A spec names the feature family (docs/MATH.md §2), the head and value
// dimensions, causality, the I/O dtype, normalization and the family's own
// options. It is read from and written to JSON (docs/ARCHITECTURE.md "Spec
// JSON"); every field has a default except `family`, and unknown fields are
// errors. The canonical JSON (every field present, keys sorted) is what the
// spec hash is taken over, so two specs that mean the same thing hash alike.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "common/input_limits.h"
#include "common/result.h"

namespace lunajit {

enum class Family { luna, performer, rff, elu, relu, t2r, hedgehog, cosformer, slay };
enum class DType { fp32, fp16, bf16 };
enum class Activation { relu, gelu, silu, tanh };
enum class OutputActivation { relu, softplus, none };
enum class LunaVariant { neural, bank_coef, rff };

std::string_view to_string(Family f);
std::string_view to_string(DType t);
std::string_view to_string(Activation a);
std::string_view to_string(OutputActivation a);
std::string_view to_string(LunaVariant v);
inline constexpr Family kAllFamilies[] = {Family::luna, Family::performer, Family::rff,
                                          Family::elu,  Family::relu,      Family::t2r,
                                          Family::hedgehog, Family::cosformer, Family::slay};
Result<Family> parse_family(std::string_view s);
Result<DType> parse_dtype(std::string_view s);
int dtype_bytes(DType t);

// Largest head_dim / value_dim the templates are instantiated for; larger dims
// would need the x tile split across passes (not implemented).
inline constexpr int kMaxHeadDim = static_cast<int>(limits::kHeadDim.hi);
// Largest feature dimension D; bounded by the shared-memory tiles of phi.
inline constexpr int kMaxFeatureDim = static_cast<int>(limits::kMaxFeatureDim);

struct LunaOptions {
  int projections = 8;   // M
  int channels = 8;      // L
  int mlp_width = 64;    // Hm
  Activation activation = Activation::relu;
  OutputActivation output_activation = OutputActivation::relu;
  bool shared_channels = true;
  bool envelope = false;
  LunaVariant variant = LunaVariant::neural;
};

struct PerformerOptions {
  int features = 64;         // m
  bool orthogonal = true;
  uint64_t seed = 0;
  double kernel_eps = 1e-4;  // added to every feature after the stabiliser shift (docs/MATH.md §2; not FAVOR+'s epsilon)
};

struct RffOptions {
  int features = 32;  // m; D = 2m
  uint64_t seed = 0;
};

struct T2rOptions {
  int features = 0;  // D; 0 in a parsed spec is replaced by head_dim
};

struct HedgehogOptions {
  int features = 0;  // f; D = 2f; 0 in a parsed spec is replaced by head_dim
};

struct SlayOptions {
  int nodes = 3;          // R, Gauss-Laguerre nodes
  int anchors = 8;        // P
  int prf_features = 16;  // M per node
  double eps_yat = 1e-3;  // C = 2 + eps_yat
  uint64_t seed = 0;
};

struct AttentionSpec {
  Family family = Family::luna;
  int head_dim = 64;   // d
  int value_dim = 64;  // dv
  bool causal = false;
  DType dtype = DType::bf16;
  bool normalize = true;
  double eps = 1e-6;
  bool params_per_head = true;

  // Only the sub-object of `family` is meaningful (and serialized).
  LunaOptions luna;
  PerformerOptions performer;
  RffOptions rff;
  T2rOptions t2r;
  HedgehogOptions hedgehog;
  SlayOptions slay;

  // Feature dimension D of phi (docs/MATH.md §2, per family).
  int feature_dim() const;

};

// Specs are equal when their canonical JSON is (unused families' options are ignored).
bool operator==(const AttentionSpec& a, const AttentionSpec& b);

// The default spec of a family (all defaults resolved: value_dim = head_dim, ...).
AttentionSpec default_spec(Family f);

// Checks every field's range; the error names the field, the value and what is allowed.
Status validate(const AttentionSpec& spec);

// JSON in: unknown fields, wrong types and out-of-range values are errors that
// name the field (e.g. "luna.projections = 0: must be in [1, 64]").
Result<AttentionSpec> spec_from_json(const nlohmann::json& j);
Result<AttentionSpec> spec_from_string(std::string_view json_text);
// Parses JSON text; a syntax error names `what`, the line, column and byte.
Result<nlohmann::json> parse_json_text(std::string_view text, std::string_view what);
// Reads a spec from a file path, or from the text itself when `arg` starts with '{'.
Result<AttentionSpec> load_spec(const std::string& arg);

// JSON out: canonical form, every field present (only the family's sub-object).
nlohmann::json to_json(const AttentionSpec& spec);
// Canonical JSON text, compact with sorted keys: the input of spec_hash.
std::string canonical_json(const AttentionSpec& spec);
// 32 hex digits identifying the spec.
std::string spec_hash(const AttentionSpec& spec);

}  // namespace lunajit
