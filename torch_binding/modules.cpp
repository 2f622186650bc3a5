// Modules of torch_binding/modules.h.
#include "torch_binding/modules.h"

#include <cstring>

#include <nlohmann/json.hpp>

#include "codegen/feature_params.h"
#include "io/safetensors.h"

namespace lunajit::nn {
namespace {

using torch::Tensor;

AttentionSpec spec_or_throw(Result<AttentionSpec> r, const char* what) {
  TORCH_CHECK(r.ok(), what, ": ", r.ok() ? "" : r.error().message);
  return std::move(r).value();
}

AttentionSpec family_spec(Family family, int64_t head_dim, bool params_per_head, const nlohmann::json& sub) {
  nlohmann::json j{{"family", std::string(to_string(family))}, {"head_dim", head_dim}, {"value_dim", head_dim},
                   {"dtype", "fp32"}, {"params_per_head", params_per_head}};
  if (!sub.is_null()) j[std::string(to_string(family))] = sub;
  return spec_or_throw(spec_from_json(j), "feature map spec");
}

}  // namespace

// ---- FeatureMap ------------------------------------------------------------

FeatureMapImpl::FeatureMapImpl(const AttentionSpec& spec, int64_t heads, uint64_t seed)
    : spec_(spec), heads_(heads) {
  const Status valid = validate(spec);
  TORCH_CHECK(valid.ok(), "FeatureMap: spec: ", valid.ok() ? "" : valid.error().message);
  TORCH_CHECK(heads >= 1, "FeatureMap: heads must be >= 1, got ", heads);
  const ParamLayout layout = param_layout(spec);
  for (const auto& t : layout.tensors) learned_ = learned_ || t.learned;
  Tensor init = init_feature_params(spec, heads, seed);
  if (init.numel() == 0) return;
  params = learned_ ? register_parameter("params", init) : register_buffer("params", init);
}

Tensor FeatureMapImpl::forward(const Tensor& x, aten::FeatureRole role) {
  TORCH_CHECK(x.dim() == 4 && x.size(2) == heads_, "FeatureMap: x must be [batch, seq, ", heads_, ", ",
              spec_.head_dim, "], got ", x.sizes());
  return lunajit::feature_map(x, params, spec_, role);
}

Tensor FeatureMapImpl::tensor(const std::string& name) const {
  TORCH_CHECK(params.defined(), "FeatureMap: family ", std::string(to_string(spec_.family)), " has no parameters");
  return aten::param_tensor(params, spec_, name, heads_, params.scalar_type());
}

FeatureMap luna_feature_map(int64_t head_dim, int64_t heads, const LunaOptions& o, bool params_per_head,
                            uint64_t seed) {
  const nlohmann::json sub{{"projections", o.projections}, {"channels", o.channels}, {"mlp_width", o.mlp_width},
                           {"activation", std::string(to_string(o.activation))},
                           {"output_activation", std::string(to_string(o.output_activation))},
                           {"shared_channels", o.shared_channels}, {"envelope", o.envelope},
                           {"variant", std::string(to_string(o.variant))}};
  return FeatureMap(family_spec(Family::luna, head_dim, params_per_head, sub), heads, seed);
}

FeatureMap t2r_feature_map(int64_t head_dim, int64_t heads, int64_t features, bool params_per_head, uint64_t seed) {
  const nlohmann::json sub = features ? nlohmann::json{{"features", features}} : nlohmann::json();
  return FeatureMap(family_spec(Family::t2r, head_dim, params_per_head, sub), heads, seed);
}

FeatureMap hedgehog_feature_map(int64_t head_dim, int64_t heads, int64_t features, bool params_per_head,
                                uint64_t seed) {
  const nlohmann::json sub = features ? nlohmann::json{{"features", features}} : nlohmann::json();
  return FeatureMap(family_spec(Family::hedgehog, head_dim, params_per_head, sub), heads, seed);
}

// ---- cores -----------------------------------------------------------------

LinearAttentionImpl::LinearAttentionImpl(const AttentionSpec& spec, int64_t heads, LinearAttentionOptions options,
                                         uint64_t seed)
    : feature_map(register_module("feature_map", FeatureMap(spec, heads, seed))), spec_(spec), options_(options) {}

namespace {

// A module moved to fp16/bf16 (module->to(torch::kBFloat16)) keeps working: the
// op reads fp32 (or fp64) parameters; the cast is differentiable.
Tensor op_params(const Tensor& p) {
  if (p.defined() && p.scalar_type() != torch::kFloat && p.scalar_type() != torch::kDouble) return p.to(torch::kFloat);
  return p;
}

}  // namespace

Tensor LinearAttentionImpl::forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask) {
  const Tensor p = op_params(feature_map->params);
  if (!key_mask.defined()) return linear_attention(q, k, v, p, spec_, options_);
  LinearAttentionOptions o = options_;
  o.key_mask = key_mask;
  return linear_attention(q, k, v, p, spec_, o);
}

LinearAttentionStateOutput LinearAttentionImpl::forward_with_state(const Tensor& q, const Tensor& k, const Tensor& v,
                                                                   const LinearAttentionState& state) {
  return linear_attention_with_state(q, k, v, op_params(feature_map->params), spec_, state, true, options_);
}

LinearAttentionStepOutput LinearAttentionImpl::step(const Tensor& q, const Tensor& k, const Tensor& v,
                                                    const LinearAttentionState& state) {
  return linear_attention_step(q, k, v, op_params(feature_map->params), spec_, state, options_);
}

Tensor LinearAttentionImpl::weights(const Tensor& q, const Tensor& k, const Tensor& key_mask) {
  // The op's checks, with a stand-in v (as lunajit::feature_map does).
  const Tensor v_like = k.new_empty({1, 1, 1, spec_.value_dim}).expand({k.size(0), k.size(1), k.size(2),
                                                                        spec_.value_dim});
  const Tensor p = op_params(feature_map->params);
  check_linear_attention_inputs(q, k, v_like, p, spec_, AttentionPath::aten, false, key_mask);
  TORCH_CHECK(!key_mask.defined() ||
                  !(spec_.family == Family::cosformer || (spec_.causal && spec_.family == Family::performer)),
              "LinearAttention::weights: key_mask is not supported for cosformer and causal performer (their "
              "features depend on the positions the mask removes; the forward packs instead); call it per "
              "sequence on the real tokens");
  // (Causal performer maps each query's keys with its own running stabiliser, docs/MATH.md §2.)
  return aten::linear_attention_weights(q, repeat_kv_heads(k, q.size(2)), p.defined() ? p : torch::empty({0}, q.options()),
                                        spec_, key_mask);
}

QuadraticAttentionImpl::QuadraticAttentionImpl(aten::QuadraticOptions options) : options_(options) {}

namespace {

void check_quadratic(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "QuadraticAttention: q, k, v must be 4-D [batch, seq, "
              "heads, dim]");
  TORCH_CHECK(q.size(3) == k.size(3), "QuadraticAttention: q and k must have the same head dim");
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2),
              "QuadraticAttention: k and v must be [", q.size(0), ", seq_k, heads_kv, *] alike, got ", k.sizes(),
              " and ", v.sizes());
  TORCH_CHECK(q.size(2) % k.size(2) == 0, "QuadraticAttention: k and v have ", k.size(2),
              " heads, which does not divide q's ", q.size(2), " heads");
  TORCH_CHECK(!causal || q.size(1) == k.size(1), "QuadraticAttention: causal attention needs seq_q == seq_k, got ",
              q.size(1), " and ", k.size(1));
  TORCH_CHECK(!key_mask.defined() || (key_mask.scalar_type() == torch::kBool && key_mask.dim() == 2 &&
                                      key_mask.size(0) == k.size(0) && key_mask.size(1) == k.size(1)),
              "QuadraticAttention: key_mask must be bool [batch, seq_k] = [", k.size(0), ", ", k.size(1), "]");
}

}  // namespace

Tensor QuadraticAttentionImpl::forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_mask) {
  check_quadratic(q, k, v, key_mask, options_.causal);
  return aten::quadratic_attention(q, repeat_kv_heads(k, q.size(2)), repeat_kv_heads(v, q.size(2)), options_,
                                   key_mask)
      .to(q.scalar_type());
}

Tensor QuadraticAttentionImpl::weights(const Tensor& q, const Tensor& k, const Tensor& key_mask) {
  check_quadratic(q, k, k, key_mask, options_.causal);
  return aten::quadratic_weights(q, repeat_kv_heads(k, q.size(2)), options_, key_mask);
}

// ---- multi-head ------------------------------------------------------------

MultiheadAttentionBaseImpl::MultiheadAttentionBaseImpl(const MultiheadOptions& o,
                                                       std::shared_ptr<AttentionCoreImpl> core)
    : options_(o), core_(std::move(core)) {
  TORCH_CHECK(o.num_heads >= 1 && o.embed_dim % o.num_heads == 0, "MultiheadAttention: embed_dim (", o.embed_dim,
              ") must be a multiple of num_heads (", o.num_heads, ")");
  const int64_t kv_heads = o.num_kv_heads == 0 ? o.num_heads : o.num_kv_heads;
  TORCH_CHECK(kv_heads >= 1 && o.num_heads % kv_heads == 0, "MultiheadAttention: num_kv_heads (", o.num_kv_heads,
              ") must divide num_heads (", o.num_heads, "), or be 0 for num_heads");
  const int64_t kv_dim = kv_heads * (o.embed_dim / o.num_heads);
  const auto linear = [&](const char* name, int64_t out) {
    return register_module(name, torch::nn::Linear(torch::nn::LinearOptions(o.embed_dim, out).bias(o.bias)));
  };
  q_proj = linear("q_proj", o.embed_dim);
  k_proj = linear("k_proj", kv_dim);
  v_proj = linear("v_proj", kv_dim);
  out_proj = linear("out_proj", o.embed_dim);
  if (o.dwc) {
    TORCH_CHECK(o.dwc_kernel >= 1, "MultiheadAttention: dwc_kernel must be >= 1");
    TORCH_CHECK(kv_heads == o.num_heads, "MultiheadAttention: dwc needs num_kv_heads == num_heads (the convolution "
                "of V is added to every query head), got num_kv_heads = ", o.num_kv_heads);
    dwc = register_module("dwc", torch::nn::Conv1d(torch::nn::Conv1dOptions(o.embed_dim, o.embed_dim, o.dwc_kernel)
                                                       .groups(o.embed_dim)
                                                       .bias(false)));
  }
  register_module("core", core_);
}

std::tuple<Tensor, Tensor> MultiheadAttentionBaseImpl::forward(const Tensor& query, const Tensor& key,
                                                               const Tensor& value, const Tensor& key_padding_mask,
                                                               bool need_weights, const Tensor& attn_mask,
                                                               bool average_attn_weights) {
  const auto& o = options_;
  TORCH_CHECK(!attn_mask.defined(), "MultiheadAttention: attn_mask is not supported; causality is the core's "
              "causal flag (spec.causal)");
  for (const auto* t : {&query, &key, &value})
    TORCH_CHECK(t->dim() == 3 && t->size(2) == o.embed_dim, "MultiheadAttention: query, key and value must be [",
                o.batch_first ? "batch, seq" : "seq, batch", ", ", o.embed_dim, "], got ", t->sizes());
  const int bd = o.batch_first ? 0 : 1, sd = 1 - bd;
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(bd) == query.size(bd),
              "MultiheadAttention: key and value must have the same shape, with query's batch, got query ",
              query.sizes(), ", key ", key.sizes(), ", value ", value.sizes());
  TORCH_CHECK(!(core_->causal() && key.size(sd) != query.size(sd)), "MultiheadAttention: a causal core needs key "
              "and value as long as query (seq ", query.size(sd), "), got seq_k = ", key.size(sd),
              "; cross-attention of different lengths is non-causal only");
  TORCH_CHECK(!(dwc && key.size(sd) != query.size(sd)), "MultiheadAttention: dwc needs key and value as long as "
              "query (seq ", query.size(sd), "), got seq_k = ", key.size(sd));
  const int64_t B = query.size(bd), N = query.size(sd), Nk = key.size(sd);
  Tensor keep;  // bool (B, Nk), true for real keys: the op's key_mask
  if (key_padding_mask.defined()) {
    TORCH_CHECK(key_padding_mask.scalar_type() == torch::kBool, "MultiheadAttention: key_padding_mask must be bool "
                "(true = padding), got ", key_padding_mask.scalar_type(), "; additive float masks are not supported");
    TORCH_CHECK(key_padding_mask.dim() == 2 && key_padding_mask.size(0) == B && key_padding_mask.size(1) == Nk,
                "MultiheadAttention: key_padding_mask must be [batch, seq_k] = [", B, ", ", Nk, "], got ",
                key_padding_mask.sizes());
    keep = key_padding_mask.logical_not();
  }
  const int64_t H = o.num_heads, hd = o.embed_dim / H, Hkv = o.num_kv_heads == 0 ? H : o.num_kv_heads;
  // (B, N, E): the op's [batch, seq, heads, dim] is a view of it.
  auto batch_major = [&](const Tensor& t) { return o.batch_first ? t : t.transpose(0, 1); };
  const Tensor qp = batch_major(q_proj->forward(query));
  const Tensor kp = batch_major(k_proj->forward(key));
  Tensor vp = batch_major(v_proj->forward(value));
  const Tensor qh = qp.reshape({B, N, H, hd}), kh = kp.reshape({B, Nk, Hkv, hd});
  Tensor attn = core_->forward(qh, kh, vp.reshape({B, Nk, Hkv, hd}), keep).reshape({B, N, o.embed_dim});
  if (dwc) {
    // Depthwise conv over the sequence of each V channel; causal pads on the left
    // only. Pad positions hold zero, as the zero padding past an unpadded sequence.
    if (keep.defined()) vp = vp.masked_fill(keep.logical_not().unsqueeze(-1), 0);
    const int64_t kw = o.dwc_kernel;
    const Tensor vc = vp.transpose(1, 2);  // (B, E, N)
    const Tensor padded = core_->causal() ? torch::constant_pad_nd(vc, {kw - 1, 0})
                                          : torch::constant_pad_nd(vc, {(kw - 1) / 2, kw / 2});
    attn = attn + dwc->forward(padded).transpose(1, 2);
  }
  Tensor out = out_proj->forward(attn);
  if (!o.batch_first) out = out.transpose(0, 1);
  Tensor w;
  if (need_weights) {
    w = core_->weights(qh, kh, keep);  // (B, H, N, Nk)
    if (average_attn_weights) w = w.mean(1);
  }
  return {out, w};
}

MultiheadLinearAttentionImpl::MultiheadLinearAttentionImpl(const MultiheadOptions& options, const AttentionSpec& spec,
                                                           LinearAttentionOptions op_options, uint64_t seed)
    : MultiheadAttentionBaseImpl(options, std::make_shared<LinearAttentionImpl>(spec, options.num_heads, op_options,
                                                                                seed)) {
  TORCH_CHECK(options.num_heads >= 1 && spec.head_dim * options.num_heads == options.embed_dim &&
                  spec.value_dim == spec.head_dim,
              "MultiheadLinearAttention: spec head_dim (", spec.head_dim, ") and value_dim (", spec.value_dim,
              ") must both be embed_dim / num_heads = ", options.embed_dim, " / ", options.num_heads);
  linear_ = LinearAttention(std::static_pointer_cast<LinearAttentionImpl>(core()));
}

std::tuple<Tensor, IncrementalState> MultiheadLinearAttentionImpl::forward_incremental(const Tensor& x,
                                                                                      const IncrementalState& state) {
  const MultiheadOptions& o = options();
  TORCH_CHECK(linear_->causal(), "MultiheadLinearAttention::forward_incremental: the core is not causal "
              "(spec.causal = false); incremental generation needs a causal spec");
  TORCH_CHECK(x.dim() == 3 && x.size(2) == o.embed_dim, "MultiheadLinearAttention::forward_incremental: x must be [",
              o.batch_first ? "batch, seq" : "seq, batch", ", ", o.embed_dim, "], got ", x.sizes());
  const Tensor xb = o.batch_first ? x : x.transpose(0, 1);  // (B, N, E)
  const int64_t B = xb.size(0), N = xb.size(1), H = o.num_heads, hd = o.embed_dim / H;
  const int64_t Hkv = o.num_kv_heads == 0 ? H : o.num_kv_heads;
  TORCH_CHECK(N >= 1, "MultiheadLinearAttention::forward_incremental: x has no tokens");
  const Tensor qh = q_proj->forward(xb).reshape({B, N, H, hd});
  const Tensor kh = k_proj->forward(xb).reshape({B, N, Hkv, hd});
  const Tensor vp = v_proj->forward(xb);  // (B, N, E)
  const Tensor vh = vp.reshape({B, N, Hkv, hd});
  IncrementalState next;
  next.tokens = state.tokens + N;
  Tensor attn;
  if (N == 1) {
    LinearAttentionStepOutput r = linear_->step(qh, kh, vh, state.attention);
    attn = r.out;
    next.attention = r.state;
  } else {
    LinearAttentionStateOutput r = linear_->forward_with_state(qh, kh, vh, state.attention);
    attn = r.out;
    next.attention = r.final_state;
  }
  attn = attn.reshape({B, N, o.embed_dim});
  if (dwc) {
    // The causal depthwise conv of forward() (left padding of kw - 1 zeros),
    // with the previous tokens' values in place of the padding.
    const int64_t kw = o.dwc_kernel;
    const Tensor vc = vp.transpose(1, 2);  // (B, E, N)
    Tensor window = state.dwc_window.defined() ? state.dwc_window : torch::zeros({B, o.embed_dim, kw - 1}, vc.options());
    TORCH_CHECK(window.dim() == 3 && window.size(0) == B && window.size(1) == o.embed_dim && window.size(2) == kw - 1,
                "MultiheadLinearAttention::forward_incremental: state.dwc_window must be [batch, embed_dim, "
                "dwc_kernel - 1] = [", B, ", ", o.embed_dim, ", ", kw - 1, "], got ", window.sizes());
    const Tensor full = torch::cat({window.to(vc.scalar_type()), vc}, 2);  // (B, E, kw - 1 + N)
    attn = attn + dwc->forward(full).transpose(1, 2);
    next.dwc_window = full.narrow(2, full.size(2) - (kw - 1), kw - 1);
  }
  Tensor out = out_proj->forward(attn);
  if (!o.batch_first) out = out.transpose(0, 1);
  return {out, next};
}

MultiheadQuadraticAttentionImpl::MultiheadQuadraticAttentionImpl(const MultiheadOptions& options,
                                                                 aten::QuadraticOptions quadratic)
    : MultiheadAttentionBaseImpl(options, std::make_shared<QuadraticAttentionImpl>(quadratic)) {}

std::shared_ptr<MultiheadAttentionBaseImpl> make_multihead_attention(const AttentionSpec& spec,
                                                                     const MultiheadOptions& options,
                                                                     LinearAttentionOptions op_options,
                                                                     uint64_t seed) {
  return std::make_shared<MultiheadLinearAttentionImpl>(options, spec, op_options, seed);
}

std::shared_ptr<MultiheadAttentionBaseImpl> make_multihead_attention(const std::string& kind,
                                                                     const MultiheadOptions& options, bool causal,
                                                                     LinearAttentionOptions op_options,
                                                                     uint64_t seed) {
  if (auto q = aten::parse_quadratic_kind(kind)) {
    aten::QuadraticOptions qo;
    qo.kind = *q;
    qo.causal = causal;
    return std::make_shared<MultiheadQuadraticAttentionImpl>(options, qo);
  }
  AttentionSpec spec;
  if (parse_family(kind).ok()) {
    TORCH_CHECK(options.num_heads >= 1 && options.embed_dim % options.num_heads == 0,
                "make_multihead_attention: embed_dim must be a multiple of num_heads");
    const int64_t hd = options.embed_dim / options.num_heads;
    spec = spec_or_throw(spec_from_json(nlohmann::json{{"family", kind}, {"head_dim", hd}, {"value_dim", hd},
                                                        {"causal", causal}, {"dtype", "fp32"}}),
                         "make_multihead_attention");
  } else {
    spec = spec_or_throw(load_spec(kind), "make_multihead_attention: not softmax/yat/spherical_yat, a family "
                                          "name, nor a readable spec");
  }
  return make_multihead_attention(spec, options, op_options, seed);
}

// ---- safetensors checkpoints ------------------------------------------------

namespace {

StDType st_dtype_of(const Tensor& t, const std::string& name) {
  switch (t.scalar_type()) {
    case torch::kDouble: return StDType::F64;
    case torch::kFloat: return StDType::F32;
    case torch::kHalf: return StDType::F16;
    case torch::kBFloat16: return StDType::BF16;
    case torch::kLong: return StDType::I64;
    case torch::kInt: return StDType::I32;
    case torch::kShort: return StDType::I16;
    case torch::kChar: return StDType::I8;
    case torch::kByte: return StDType::U8;
    case torch::kBool: return StDType::BOOL;
    default: TORCH_CHECK(false, "save_safetensors: tensor ", name, " has dtype ", t.scalar_type(),
                         ", which safetensors cannot hold here");
  }
  return StDType::F32;
}

torch::ScalarType torch_dtype_of(StDType t) {
  switch (t) {
    case StDType::F64: return torch::kDouble;
    case StDType::F32: return torch::kFloat;
    case StDType::F16: return torch::kHalf;
    case StDType::BF16: return torch::kBFloat16;
    case StDType::I64: return torch::kLong;
    case StDType::I32: return torch::kInt;
    case StDType::I16: return torch::kShort;
    case StDType::I8: return torch::kChar;
    case StDType::U8: return torch::kByte;
    case StDType::BOOL: return torch::kBool;
  }
  return torch::kFloat;
}

// name -> tensor for every parameter and buffer (recursively).
std::vector<std::pair<std::string, Tensor>> module_tensors(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& p : module.named_parameters(true)) out.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers(true)) out.emplace_back(b.key(), b.value());
  return out;
}

// "lunajit.spec:<path>" -> canonical spec JSON of every FeatureMap.
std::map<std::string, std::string> feature_map_specs(const torch::nn::Module& module) {
  std::map<std::string, std::string> out;
  for (const auto& m : module.named_modules("", true))
    if (const auto* fm = dynamic_cast<const FeatureMapImpl*>(m.value().get()))
      out["lunajit.spec:" + m.key()] = canonical_json(fm->spec());
  return out;
}

}  // namespace

void save_safetensors(const torch::nn::Module& module, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  Safetensors st;
  st.metadata = metadata;
  for (const auto& [k, v] : feature_map_specs(module)) st.metadata[k] = v;
  for (const auto& [name, t] : module_tensors(module)) {
    const Tensor c = t.detach().to(torch::kCPU).contiguous();
    StTensor s{name, st_dtype_of(c, name), std::vector<int64_t>(c.sizes().begin(), c.sizes().end()), {}};
    s.data.resize(size_t(c.numel() * c.element_size()));
    if (!s.data.empty()) std::memcpy(s.data.data(), c.data_ptr(), s.data.size());
    st.tensors.push_back(std::move(s));
  }
  const Status w = write_safetensors(path, st);
  TORCH_CHECK(w.ok(), "save_safetensors: ", w.ok() ? std::string() : w.error().message);
}

void load_safetensors(torch::nn::Module& module, const std::string& path) {
  auto st = read_safetensors(path);
  TORCH_CHECK(st.ok(), "load_safetensors: ", st.ok() ? std::string() : st.error().message);
  for (const auto& [key, spec] : feature_map_specs(module)) {
    const std::string where = key.substr(std::string("lunajit.spec:").size());
    const auto it = st->metadata.find(key);
    TORCH_CHECK(it != st->metadata.end(), "load_safetensors: ", path, " has no spec for the feature map at '", where,
                "' (metadata ", key, "); it was not written by lunajit's save_safetensors for this module");
    TORCH_CHECK(it->second == spec, "load_safetensors: ", path, " was saved with spec ", it->second,
                " for the feature map at '", where, "', but the module has spec ", spec);
  }
  const auto tensors = module_tensors(module);
  for (const auto& t : st->tensors) {
    bool known = false;
    for (const auto& [name, _] : tensors) known = known || name == t.name;
    TORCH_CHECK(known, "load_safetensors: ", path, " holds tensor '", t.name, "', which the module does not have");
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, dst] : tensors) {
    const StTensor* t = st->find(name);
    TORCH_CHECK(t, "load_safetensors: ", path, " has no tensor '", name, "'");
    TORCH_CHECK(dst.sizes() == torch::IntArrayRef(t->shape), "load_safetensors: tensor '", name, "' has shape ",
                torch::IntArrayRef(t->shape), " in ", path, " but ", dst.sizes(), " in the module");
    const Tensor src = torch::from_blob(const_cast<std::byte*>(t->data.data()), t->shape,
                                        torch::TensorOptions().dtype(torch_dtype_of(t->dtype)));
    dst.copy_(src);
  }
}

}  // namespace lunajit::nn
