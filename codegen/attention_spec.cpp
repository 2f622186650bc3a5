#include "codegen/attention_spec.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "common/input_limits.h"
#include "common/read_file.h"

namespace lunajit {
namespace {

using nlohmann::json;

template <class E, size_t N>
Result<E> parse_enum(std::string_view field, std::string_view s, const std::pair<std::string_view, E> (&table)[N]) {
  std::string allowed;
  for (const auto& [name, value] : table) {
    if (name == s) return value;
    allowed += allowed.empty() ? "" : ", ";
    allowed += name;
  }
  return Error::invalid(fmt::format("{} = \"{}\": unknown value; allowed: {}", field, limits::quote(s), allowed));
}

constexpr std::pair<std::string_view, Family> kFamilies[] = {
    {"luna", Family::luna}, {"performer", Family::performer}, {"rff", Family::rff},
    {"elu", Family::elu},   {"relu", Family::relu},           {"t2r", Family::t2r},
    {"hedgehog", Family::hedgehog}, {"cosformer", Family::cosformer}, {"slay", Family::slay}};
constexpr std::pair<std::string_view, DType> kDTypes[] = {
    {"fp32", DType::fp32}, {"fp16", DType::fp16}, {"bf16", DType::bf16}};
constexpr std::pair<std::string_view, Activation> kActivations[] = {
    {"relu", Activation::relu}, {"gelu", Activation::gelu}, {"silu", Activation::silu}, {"tanh", Activation::tanh}};
constexpr std::pair<std::string_view, OutputActivation> kOutputActivations[] = {
    {"relu", OutputActivation::relu}, {"softplus", OutputActivation::softplus}, {"none", OutputActivation::none}};
constexpr std::pair<std::string_view, LunaVariant> kVariants[] = {
    {"neural", LunaVariant::neural}, {"bank_coef", LunaVariant::bank_coef}, {"rff", LunaVariant::rff}};

template <class E, size_t N>
std::string_view enum_name(E e, const std::pair<std::string_view, E> (&table)[N]) {
  for (const auto& [name, value] : table)
    if (value == e) return name;
  return "?";
}

// Reads the fields of one JSON object, rejecting any field it was not asked for.
class ObjectReader {
 public:
  ObjectReader(const json& j, std::string prefix) : j_(j), prefix_(std::move(prefix)) {}

  Status require_object() const {
    if (!j_.is_object())
      return Error::invalid(fmt::format("{}: expected a JSON object, got {}", where(), j_.type_name()));
    return ok_status();
  }

  template <class T>
  Status read(const char* key, T& out) {
    seen_.push_back(key);
    auto it = j_.find(key);
    if (it == j_.end()) return ok_status();
    const std::string field = prefix_ + key;
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) return type_error(field, *it, "true or false");
      out = it->template get<bool>();
    } else if constexpr (std::is_same_v<T, uint64_t>) {
      // Seeds: any unsigned 64-bit value; negative values are errors, not wrapped.
      if (!it->is_number_integer()) return type_error(field, *it, "an integer");
      if (!it->is_number_unsigned())
        return Error::invalid(fmt::format("{} = {}: must be in [0, {}]", field, it->dump(), limits::kMaxSeed));
      out = it->template get<uint64_t>();
    } else if constexpr (std::is_integral_v<T>) {
      static_assert(sizeof(T) == 0, "int fields are read with read_int (they need a range)");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!it->is_number()) return type_error(field, *it, "a number");
      out = it->template get<T>();
    } else {
      if (!it->is_string()) return type_error(field, *it, "a string");
      out = it->template get<std::string>();
    }
    return ok_status();
  }

  // An integer field in `range`, read 64-bit-safe: values beyond the range
  // (including beyond 64 bits) are errors, never wrapped into `out`.
  Status read_int(const char* key, int& out, limits::IntRange range) {
    seen_.push_back(key);
    auto it = j_.find(key);
    if (it == j_.end()) return ok_status();
    const std::string field = prefix_ + key;
    if (!it->is_number_integer()) return type_error(field, *it, fmt::format("an integer in [{}, {}]", range.lo, range.hi).c_str());
    if (it->is_number_unsigned() && it->template get<uint64_t>() > uint64_t(INT64_MAX))
      return Error::invalid(fmt::format("{} = {}: must be in [{}, {}]", field, it->dump(), range.lo, range.hi));
    const int64_t v = it->template get<int64_t>();
    if (auto st = limits::check(field, v, range); !st) return st;
    out = static_cast<int>(v);
    return ok_status();
  }

  // A real field in `range` (also checked again by validate()).
  Status read_real(const char* key, double& out, limits::RealRange range) {
    if (auto st = read(key, out); !st) return st;
    if (j_.contains(key)) return limits::check(prefix_ + key, out, range);
    return ok_status();
  }

  void mark_known(const char* key) { seen_.push_back(key); }

  template <class E, size_t N>
  Status read_enum(const char* key, E& out, const std::pair<std::string_view, E> (&table)[N]) {
    std::string s(enum_name(out, table));
    if (auto st = read(key, s); !st) return st;
    auto r = parse_enum(prefix_ + key, s, table);
    if (!r) return r.error();
    out = *r;
    return ok_status();
  }

  // Every field present must have been read.
  Status no_unknown_fields() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::find(seen_.begin(), seen_.end(), it.key()) == seen_.end()) {
        std::string allowed;
        for (const auto& s : seen_) allowed += (allowed.empty() ? "" : ", ") + s;
        return Error::invalid(fmt::format("{}{}: unknown field; allowed fields{}: {}", prefix_, it.key(),
                                          prefix_.empty() ? "" : " of " + prefix_.substr(0, prefix_.size() - 1),
                                          allowed));
      }
    }
    return ok_status();
  }

 private:
  static Status type_error(const std::string& field, const json& v, const char* expected) {
    return Error::invalid(fmt::format("{} = {}: expected {}", field, limits::quote(v.dump()), expected));
  }
  std::string where() const { return prefix_.empty() ? "spec" : prefix_.substr(0, prefix_.size() - 1); }

  const json& j_;
  std::string prefix_;
  std::vector<std::string> seen_;
};

#define LUNAJIT_TRY(expr)              \
  do {                                 \
    if (auto st_ = (expr); !st_) return st_.error(); \
  } while (0)

}  // namespace

std::string_view to_string(Family f) { return enum_name(f, kFamilies); }
std::string_view to_string(DType t) { return enum_name(t, kDTypes); }
std::string_view to_string(Activation a) { return enum_name(a, kActivations); }
std::string_view to_string(OutputActivation a) { return enum_name(a, kOutputActivations); }
std::string_view to_string(LunaVariant v) { return enum_name(v, kVariants); }
Result<Family> parse_family(std::string_view s) { return parse_enum("family", s, kFamilies); }
Result<DType> parse_dtype(std::string_view s) { return parse_enum("dtype", s, kDTypes); }

int dtype_bytes(DType t) { return t == DType::fp32 ? 4 : 2; }

int AttentionSpec::feature_dim() const {
  switch (family) {
    case Family::luna: return luna.projections * (luna.variant == LunaVariant::rff ? 2 : luna.channels);
    case Family::performer: return performer.features;
    case Family::rff: return 2 * rff.features;
    case Family::elu:
    case Family::relu: return head_dim;
    case Family::t2r: return t2r.features;
    case Family::hedgehog: return 2 * hedgehog.features;
    case Family::cosformer: return 2 * head_dim;
    case Family::slay: return slay.nodes * slay.anchors * slay.prf_features;
  }
  return 0;
}

AttentionSpec default_spec(Family f) {
  AttentionSpec s;
  s.family = f;
  s.t2r.features = s.head_dim;
  s.hedgehog.features = s.head_dim;
  s.normalize = f != Family::rff;
  return s;
}

Status validate(const AttentionSpec& s) {
  LUNAJIT_TRY(limits::check("head_dim", s.head_dim, limits::kHeadDim));
  LUNAJIT_TRY(limits::check("value_dim", s.value_dim, limits::kValueDim));
  LUNAJIT_TRY(limits::check("eps", s.eps, limits::kEps));
  switch (s.family) {
    case Family::luna: {
      const auto& o = s.luna;
      LUNAJIT_TRY(limits::check("luna.projections", o.projections, limits::kLunaProjections));
      LUNAJIT_TRY(limits::check("luna.channels", o.channels, limits::kLunaChannels));
      LUNAJIT_TRY(limits::check("luna.mlp_width", o.mlp_width, limits::kLunaMlpWidth));
      if (o.variant == LunaVariant::rff && o.channels != 2)
        return Error::invalid(fmt::format(
            "luna.channels = {}: variant \"rff\" has exactly 2 channels (cos, sin); set luna.channels to 2",
            o.channels));
      break;
    }
    case Family::performer:
      LUNAJIT_TRY(limits::check("performer.features", s.performer.features, limits::kPerformerFeatures));
      LUNAJIT_TRY(limits::check("performer.kernel_eps", s.performer.kernel_eps, limits::kPerformerKernelEps));
      break;
    case Family::rff: LUNAJIT_TRY(limits::check("rff.features", s.rff.features, limits::kRffFeatures)); break;
    case Family::t2r: LUNAJIT_TRY(limits::check("t2r.features", s.t2r.features, limits::kT2rFeatures)); break;
    case Family::hedgehog:
      LUNAJIT_TRY(limits::check("hedgehog.features", s.hedgehog.features, limits::kHedgehogFeatures));
      break;
    case Family::slay:
      LUNAJIT_TRY(limits::check("slay.nodes", s.slay.nodes, limits::kSlayNodes));
      LUNAJIT_TRY(limits::check("slay.anchors", s.slay.anchors, limits::kSlayAnchors));
      LUNAJIT_TRY(limits::check("slay.prf_features", s.slay.prf_features, limits::kSlayPrfFeatures));
      LUNAJIT_TRY(limits::check("slay.eps_yat", s.slay.eps_yat, limits::kSlayEpsYat));
      break;
    case Family::elu:
    case Family::relu:
    case Family::cosformer: break;
  }
  const int D = s.feature_dim();
  if (D > kMaxFeatureDim)
    return Error::invalid(fmt::format("feature dimension D = {} (from {} options): must be <= {}", D,
                                      to_string(s.family), kMaxFeatureDim));
  return ok_status();
}

Result<AttentionSpec> spec_from_json(const json& j) {
  ObjectReader top(j, "");
  LUNAJIT_TRY(top.require_object());
  if (!j.contains("family"))
    return Error::invalid("family: missing; every spec names its family (luna, performer, rff, elu, relu, t2r, "
                          "hedgehog, cosformer, slay)");
  std::string family_name;
  LUNAJIT_TRY(top.read("family", family_name));
  auto family = parse_family(family_name);
  if (!family) return family.error();
  AttentionSpec s;
  s.family = *family;
  LUNAJIT_TRY(top.read_int("head_dim", s.head_dim, limits::kHeadDim));
  s.value_dim = s.head_dim;
  LUNAJIT_TRY(top.read_int("value_dim", s.value_dim, limits::kValueDim));
  LUNAJIT_TRY(top.read("causal", s.causal));
  LUNAJIT_TRY(top.read_enum("dtype", s.dtype, kDTypes));
  LUNAJIT_TRY(top.read_real("eps", s.eps, limits::kEps));
  LUNAJIT_TRY(top.read("params_per_head", s.params_per_head));
  s.t2r.features = s.head_dim;
  s.hedgehog.features = s.head_dim;
  // rff features take both signs, so den = phi(q).z can cross zero: unnormalized
  // by default (docs/MATH.md §2); an explicit "normalize" still wins.
  if (s.family == Family::rff) s.normalize = false;
  LUNAJIT_TRY(top.read("normalize", s.normalize));

  // Only the family's own sub-object is allowed.
  const char* sub = nullptr;
  switch (s.family) {
    case Family::luna: sub = "luna"; break;
    case Family::performer: sub = "performer"; break;
    case Family::rff: sub = "rff"; break;
    case Family::t2r: sub = "t2r"; break;
    case Family::hedgehog: sub = "hedgehog"; break;
    case Family::slay: sub = "slay"; break;
    default: break;
  }
  // Listed among the allowed fields even when absent, so an error names it.
  if (sub) top.mark_known(sub);
  if (sub && j.contains(sub)) {
    const json& o = j.at(sub);
    ObjectReader r(o, std::string(sub) + ".");
    LUNAJIT_TRY(r.require_object());
    switch (s.family) {
      case Family::luna:
        LUNAJIT_TRY(r.read_int("projections", s.luna.projections, limits::kLunaProjections));
        LUNAJIT_TRY(r.read_int("channels", s.luna.channels, limits::kLunaChannels));
        LUNAJIT_TRY(r.read_int("mlp_width", s.luna.mlp_width, limits::kLunaMlpWidth));
        LUNAJIT_TRY(r.read_enum("activation", s.luna.activation, kActivations));
        LUNAJIT_TRY(r.read_enum("output_activation", s.luna.output_activation, kOutputActivations));
        LUNAJIT_TRY(r.read("shared_channels", s.luna.shared_channels));
        LUNAJIT_TRY(r.read("envelope", s.luna.envelope));
        LUNAJIT_TRY(r.read_enum("variant", s.luna.variant, kVariants));
        break;
      case Family::performer:
        LUNAJIT_TRY(r.read_int("features", s.performer.features, limits::kPerformerFeatures));
        LUNAJIT_TRY(r.read("orthogonal", s.performer.orthogonal));
        LUNAJIT_TRY(r.read("seed", s.performer.seed));
        LUNAJIT_TRY(r.read_real("kernel_eps", s.performer.kernel_eps, limits::kPerformerKernelEps));
        break;
      case Family::rff:
        LUNAJIT_TRY(r.read_int("features", s.rff.features, limits::kRffFeatures));
        LUNAJIT_TRY(r.read("seed", s.rff.seed));
        break;
      case Family::t2r: LUNAJIT_TRY(r.read_int("features", s.t2r.features, limits::kT2rFeatures)); break;
      case Family::hedgehog: LUNAJIT_TRY(r.read_int("features", s.hedgehog.features, limits::kHedgehogFeatures)); break;
      case Family::slay:
        LUNAJIT_TRY(r.read_int("nodes", s.slay.nodes, limits::kSlayNodes));
        LUNAJIT_TRY(r.read_int("anchors", s.slay.anchors, limits::kSlayAnchors));
        LUNAJIT_TRY(r.read_int("prf_features", s.slay.prf_features, limits::kSlayPrfFeatures));
        LUNAJIT_TRY(r.read_real("eps_yat", s.slay.eps_yat, limits::kSlayEpsYat));
        LUNAJIT_TRY(r.read("seed", s.slay.seed));
        break;
      default: break;
    }
    LUNAJIT_TRY(r.no_unknown_fields());
  }
  LUNAJIT_TRY(top.no_unknown_fields());
  LUNAJIT_TRY(validate(s));
  return s;
}

Result<json> parse_json_text(std::string_view text, std::string_view what) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // e.byte is 1-based; say where, with the line and column a text editor shows.
    const size_t at = e.byte == 0 ? 0 : std::min<size_t>(e.byte - 1, text.size());
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at; ++i) {
      if (text[i] == '\n') ++line, col = 1;
      else ++col;
    }
    std::string reason = e.what();
    if (auto p = reason.find("syntax error"); p != std::string::npos) reason = reason.substr(p);
    return Error::invalid(fmt::format("{}: not valid JSON at line {}, column {} (byte {}): {}", what, line, col,
                                      at, limits::quote(reason)));
  } catch (const json::exception& e) {
    // Not a syntax error but still no document: a number beyond double range
    // (1e400: out_of_range.406; found by tests/fuzz/spec_parser_fuzzer).
    return Error::invalid(fmt::format("{}: not valid JSON: {}", what, limits::quote(e.what())));
  }
}

Result<AttentionSpec> spec_from_string(std::string_view text) {
  auto j = parse_json_text(text, "spec");
  if (!j) return j.error();
  return spec_from_json(*j);
}

Result<AttentionSpec> load_spec(const std::string& arg) {
  // Inline JSON when it starts like a JSON value that cannot be a path ({ [ "),
  // or when no file of that name exists and it parses as JSON (5, null, true).
  const size_t first = arg.find_first_not_of(" \t\n\r");
  const bool inline_json = first != std::string::npos && (arg[first] == '{' || arg[first] == '[' || arg[first] == '"');
  std::error_code ec;
  if (inline_json || (!std::filesystem::exists(arg, ec) && json::accept(arg))) return spec_from_string(arg);
  if (arg.empty()) return Error::invalid("spec: empty; expected a JSON file or inline JSON such as '{\"family\": \"luna\"}'");
  auto text = read_file_bounded(arg, limits::kMaxSpecFileBytes, "spec file");
  if (!text) {
    if (!std::filesystem::exists(arg, ec))
      return Error::invalid(fmt::format("spec file '{}': no such file; SPEC is a JSON file or inline JSON text such "
                                        "as '{{\"family\": \"luna\"}}'",
                                        limits::quote(arg)));
    return text.error();
  }
  auto r = spec_from_string(*text);
  if (!r) return Error::invalid(fmt::format("{} (in {})", r.error().message, arg));
  return r;
}

json to_json(const AttentionSpec& s) {
  json j = {{"family", to_string(s.family)},   {"head_dim", s.head_dim}, {"value_dim", s.value_dim},
            {"causal", s.causal},              {"dtype", to_string(s.dtype)},
            {"normalize", s.normalize},        {"eps", s.eps},
            {"params_per_head", s.params_per_head}};
  switch (s.family) {
    case Family::luna:
      j["luna"] = {{"projections", s.luna.projections},
                   {"channels", s.luna.channels},
                   {"mlp_width", s.luna.mlp_width},
                   {"activation", to_string(s.luna.activation)},
                   {"output_activation", to_string(s.luna.output_activation)},
                   {"shared_channels", s.luna.shared_channels},
                   {"envelope", s.luna.envelope},
                   {"variant", to_string(s.luna.variant)}};
      break;
    case Family::performer:
      j["performer"] = {{"features", s.performer.features}, {"orthogonal", s.performer.orthogonal},
                        {"seed", s.performer.seed}, {"kernel_eps", s.performer.kernel_eps}};
      break;
    case Family::rff: j["rff"] = {{"features", s.rff.features}, {"seed", s.rff.seed}}; break;
    case Family::t2r: j["t2r"] = {{"features", s.t2r.features}}; break;
    case Family::hedgehog: j["hedgehog"] = {{"features", s.hedgehog.features}}; break;
    case Family::slay:
      j["slay"] = {{"nodes", s.slay.nodes},           {"anchors", s.slay.anchors},
                   {"prf_features", s.slay.prf_features}, {"eps_yat", s.slay.eps_yat},
                   {"seed", s.slay.seed}};
      break;
    default: break;
  }
  return j;
}

std::string canonical_json(const AttentionSpec& s) { return to_json(s).dump(); }

bool operator==(const AttentionSpec& a, const AttentionSpec& b) { return canonical_json(a) == canonical_json(b); }

std::string spec_hash(const AttentionSpec& s) { return content_hash(canonical_json(s)); }

}  // namespace lunajit
