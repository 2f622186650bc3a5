// ATen composition of docs/MATH.md (see aten_attention.h). Shapes in comments:
// B batch, N seq, H heads, d head_dim, D feature dim, dv value dim.
#include "torch_binding/aten_attention.h"

#include <cmath>
#include <limits>
#include <numbers>

#include "codegen/feature_params.h"

namespace lunajit::aten {
namespace {

using torch::Tensor;
namespace F = torch::nn::functional;

Tensor activation(Activation a, const Tensor& t) {
  switch (a) {
    case Activation::relu: return torch::relu(t);
    case Activation::gelu: return torch::gelu(t);  // erf form, as the reference
    case Activation::silu: return torch::silu(t);
    case Activation::tanh: return torch::tanh(t);
  }
  return t;
}

Tensor output_activation(OutputActivation a, const Tensor& y) {
  switch (a) {
    case OutputActivation::relu: return torch::relu(y);
    case OutputActivation::softplus: return torch::softplus(y);
    case OutputActivation::none: return y;
  }
  return y;
}

// Basis l mod 8 of luna's bank_coef variant (reference/feature_map.h).
Tensor bank_basis(int l, const Tensor& u) {
  switch (l % 8) {
    case 0: return torch::sin(u);
    case 1: return torch::cos(u);
    case 2: return torch::tanh(u);
    case 3: return torch::sigmoid(u);
    case 4: return torch::relu(u);
    case 5: return torch::gelu(u);
    case 6: return torch::softplus(u);
    default: return torch::exp(-0.5 * u * u);
  }
}

// [H, ...] parameter broadcast against [B, N, H, extra...]: [1, 1, H, 1.., ...].
Tensor per_head(const Tensor& p, int inserted_after_head) {
  std::vector<int64_t> shape{1, 1, p.size(0)};
  for (int i = 0; i < inserted_after_head; ++i) shape.push_back(1);
  for (int64_t i = 1; i < p.dim(); ++i) shape.push_back(p.size(i));
  return p.reshape(shape);
}

Tensor luna_features(const Tensor& x, const Tensor& params, const AttentionSpec& spec) {
  const LunaOptions& o = spec.luna;
  const int64_t H = x.size(2), M = o.projections;
  const auto dt = x.scalar_type();
  auto p = [&](const char* name) { return param_tensor(params, spec, name, H, dt); };
  const Tensor u = torch::einsum("bnhd,hmd->bnhm", {x, p("W")});  // (B, N, H, M)
  Tensor psi;                                                     // (B, N, H, M, L)
  switch (o.variant) {
    case LunaVariant::neural: {
      if (o.shared_channels) {
        // (B, N, H, M, Hm): one scalar MLP 1 -> Hm -> L per projection value.
        const Tensor t = u.unsqueeze(-1) * per_head(p("W1"), 1) + per_head(p("b1"), 1);
        const Tensor y = torch::einsum("bnhmk,hlk->bnhml", {activation(o.activation, t), p("W2")}) + per_head(p("b2"), 1);
        psi = output_activation(o.output_activation, y);
      } else {
        // (B, N, H, M, L, Hm): L independent MLPs 1 -> Hm -> 1.
        const Tensor t = u.unsqueeze(-1).unsqueeze(-1) * per_head(p("W1"), 1) + per_head(p("b1"), 1);
        const Tensor y = (activation(o.activation, t) * per_head(p("W2"), 1)).sum(-1) + per_head(p("b2"), 1);
        psi = output_activation(o.output_activation, y);
      }
      break;
    }
    case LunaVariant::bank_coef: {
      std::vector<Tensor> basis;
      for (int l = 0; l < o.channels; ++l) basis.push_back(bank_basis(l, u));
      psi = torch::stack(basis, -1) * per_head(p("coef"), 1);
      break;
    }
    case LunaVariant::rff: psi = torch::stack({torch::cos(u), torch::sin(u)}, -1); break;
  }
  Tensor scale = torch::full({}, 1.0 / std::sqrt(double(M)), x.options());
  if (o.envelope) {
    // h(x) = sigmoid(a . x + c): (B, N, H, 1, 1)
    const Tensor z = torch::einsum("bnhd,hd->bnh", {x, p("a")}) + p("c").reshape({1, 1, H});
    scale = (torch::sigmoid(z) * scale).unsqueeze(-1).unsqueeze(-1);
  }
  const Tensor phi = psi * scale;  // i-major: index i*L + l
  return phi.reshape({x.size(0), x.size(1), H, -1});
}

// Performer exponents e = omega^T x' - |x'|^2 / 2, x' = d^{-1/4} x: (B, N, H, m).
Tensor performer_exponents(const Tensor& x, const Tensor& params, const AttentionSpec& spec) {
  const int64_t H = x.size(2), d = x.size(3);
  const Tensor xs = x * std::pow(double(d), -0.25);
  const Tensor omega = param_tensor(params, spec, "omega", H, x.scalar_type());
  return torch::einsum("bnhd,hmd->bnhm", {xs, omega}) - 0.5 * (xs * xs).sum(-1, true);
}

// `real` (keys only, may be undefined): bool (B, N, 1, 1), true for real keys.
Tensor performer_features(const Tensor& x, const Tensor& params, const AttentionSpec& spec, FeatureRole role,
                          const Tensor& real) {
  Tensor e = performer_exponents(x, params, spec);  // (B, N, H, m)
  // Stop-gradient shifts: per query row; one per (batch, head) over all (real)
  // keys (non-causal attention; causal performer maps keys per query row, below).
  Tensor stab;
  if (role == FeatureRole::query) {
    stab = std::get<0>(e.max(-1, true)).detach();
  } else if (!real.defined()) {
    stab = e.amax({1, 3}, true).detach();
  } else {
    const Tensor m = e.masked_fill(real.logical_not(), -std::numeric_limits<double>::infinity()).amax({1, 3}, true);
    stab = m.masked_fill(m.isneginf(), 0).detach();  // a (batch, head) without real keys: any finite shift
    // Pad exponents are replaced before exp: exp of a pad's e - stab may overflow,
    // and a masked inf would still make a NaN gradient. Their rows are zeroed later.
    e = torch::where(real, e, stab);
  }
  return torch::exp(e - stab) / std::sqrt(double(spec.performer.features)) + spec.performer.kernel_eps;
}

// Causal performer pieces (docs/MATH.md §2), (B, H, N, *): phi(q); the keys'
// exp parts ut_j = m^{-1/2} exp(e(k_j) - s_j) shifted by their own max s_j; s_j
// and the running max M_i = max_{j<=i} s_j (both stop-gradient). Query i sees
// key j <= i through phi_i(k_j) = exp(s_j - M_i) ut_j + kappa.
struct CausalPerformerParts {
  Tensor pq, ut, s, M;
};

CausalPerformerParts causal_performer_parts(const Tensor& q, const Tensor& k, const Tensor& params,
                                            const AttentionSpec& spec) {
  CausalPerformerParts p;
  p.pq = performer_features(q, params, spec, FeatureRole::query, {}).permute({0, 2, 1, 3});
  const Tensor e = performer_exponents(k, params, spec).permute({0, 2, 1, 3});  // (B, H, N, m)
  p.s = std::get<0>(e.max(-1, true)).detach();                                 // (B, H, N, 1)
  p.M = std::get<0>(p.s.cummax(2));
  p.ut = torch::exp(e - p.s) / std::sqrt(double(spec.performer.features));
  return p;
}

// exp(s_j - M_i) for j <= i, 0 above the diagonal (masked before exp: s_j - M_i
// may be large for j > i): (B, H, Lq, Lk) from s (B, H, Lk, 1) and M (B, H, Lq, 1),
// with query row i at position offset + i of the key block.
Tensor causal_weights(const Tensor& s, const Tensor& M) {
  const Tensor diff = s.transpose(-1, -2) - M;
  const int64_t L = M.size(2);
  const Tensor keep = torch::ones({L, L}, M.options().dtype(torch::kBool)).tril();
  return torch::exp(diff.masked_fill(keep.logical_not(), -std::numeric_limits<double>::infinity()));
}

// Causal performer attention, chunked like the kernels (performer_causal_chunk):
// the carried (E, e) sits at the running max of the last token before the chunk
// and is rescaled exactly when the max grows; kappa's share is carried unshifted.
Tensor causal_performer_attention(const Tensor& q, const Tensor& k, const Tensor& v_in, const Tensor& params,
                                  const AttentionSpec& spec, int64_t chunk) {
  const CausalPerformerParts p = causal_performer_parts(q, k, params, spec);
  const Tensor v = v_in.to(p.pq.scalar_type()).permute({0, 2, 1, 3});  // (B, H, N, dv)
  const int64_t B = v.size(0), H = v.size(1), N = v.size(2), dv = v.size(3), m = p.pq.size(3);
  const double kappa = spec.performer.kernel_eps;
  const int64_t C = std::max<int64_t>(1, std::min(chunk, N));
  const auto opts = v.options();
  Tensor E = torch::zeros({B, H, m, dv}, opts), ez = torch::zeros({B, H, m, 1}, opts);
  Tensor Vs = torch::zeros({B, H, 1, dv}, opts);
  Tensor level = torch::full({B, H, 1, 1}, -std::numeric_limits<double>::infinity(), opts);
  std::vector<Tensor> outs;
  for (int64_t t0 = 0; t0 < N; t0 += C) {
    const int64_t L = std::min(C, N - t0);
    const Tensor qc = p.pq.narrow(2, t0, L), uc = p.ut.narrow(2, t0, L), vc = v.narrow(2, t0, L);
    const Tensor sc = p.s.narrow(2, t0, L), Mc = p.M.narrow(2, t0, L);
    const Tensor Q = qc.sum(-1, true);                                          // (B, H, L, 1)
    const Tensor mask = torch::ones({L, L}, opts).tril();
    const Tensor A = causal_weights(sc, Mc) * torch::matmul(qc, uc.transpose(-1, -2)) + kappa * Q * mask;
    const Tensor back = torch::exp(level - Mc);                                 // (B, H, L, 1); 0 at the start
    Tensor num = torch::matmul(A, vc) + back * torch::matmul(qc, E) + kappa * Q * Vs;
    if (spec.normalize) {
      const Tensor den = A.sum(-1, true) + back * torch::matmul(qc, ez) + kappa * Q * double(t0) + spec.eps;
      num = num / den;
    }
    outs.push_back(num);
    const Tensor next = Mc.narrow(2, L - 1, 1);                                 // (B, H, 1, 1)
    const Tensor rescale = torch::exp(level - next);
    const Tensor w = torch::exp(sc - next) * uc;                                // (B, H, L, m)
    E = rescale * E + torch::matmul(w.transpose(-1, -2), vc);
    ez = rescale * ez + w.sum(2).unsqueeze(-1);
    Vs = Vs + vc.sum(2, true);
    level = next;
  }
  return torch::cat(outs, 2).permute({0, 2, 1, 3});  // (B, N, H, dv)
}

Tensor slay_features(const Tensor& x, const Tensor& params, const AttentionSpec& spec) {
  const auto& o = spec.slay;
  const int64_t B = x.size(0), N = x.size(1), H = x.size(2);
  const auto dt = x.scalar_type();
  auto p = [&](const char* name) { return param_tensor(params, spec, name, H, dt); };
  const Tensor u = x / x.norm(2, -1, true);                                   // (B, N, H, d)
  const Tensor adot = torch::einsum("bnhd,hpd->bnhp", {u, p("anchors")});    // (B, N, H, P)
  const Tensor anc = adot * adot / std::sqrt(double(o.anchors));
  const Tensor proj = torch::einsum("bnhd,hrjd->bnhrj", {u, p("omega")});    // (B, N, H, R, M)
  const Tensor s = per_head(p("nodes"), 0).unsqueeze(-1);                     // (1, 1, H, R, 1)
  const Tensor w = per_head(p("weights"), 0);                                 // (1, 1, H, R)
  const Tensor prf = torch::exp(torch::sqrt(2 * s) * proj - s) / std::sqrt(double(o.prf_features));
  // (B, N, H, R, P, M), index r*P*M + p*M + j
  const Tensor phi = torch::sqrt(w).unsqueeze(-1).unsqueeze(-1) * anc.unsqueeze(3).unsqueeze(-1) * prf.unsqueeze(4);
  return phi.reshape({B, N, H, -1});
}

// Applies the causal mask (keep j <= i) to the last two dims.
Tensor lower_triangle(const Tensor& a) { return torch::tril(a); }

}  // namespace

torch::ScalarType compute_dtype(torch::ScalarType input) {
  return input == torch::kDouble ? torch::kDouble : torch::kFloat;
}

torch::Tensor param_tensor(const torch::Tensor& params, const AttentionSpec& spec, const std::string& name,
                           int64_t heads, torch::ScalarType dtype) {
  const ParamLayout layout = param_layout(spec);
  const ParamTensor* t = layout.find(name);
  TORCH_CHECK(t != nullptr, "feature_params: family ", std::string(to_string(spec.family)), " has no tensor '", name,
              "'");
  const int64_t blocks = spec.params_per_head ? heads : 1;
  std::vector<int64_t> shape{blocks};
  for (int s : t->shape) shape.push_back(s);
  Tensor v = params.view({blocks, layout.per_head_floats}).narrow(1, t->offset, t->numel()).reshape(shape);
  if (!t->learned) v = v.detach();
  v = v.to(dtype);
  if (blocks != heads) {
    shape[0] = heads;
    v = v.expand(shape);
  }
  return v;
}

namespace {

Tensor features(const Tensor& x, const Tensor& params, const AttentionSpec& spec, FeatureRole role,
                const Tensor& real) {
  const int64_t H = x.size(2), d = x.size(3);
  switch (spec.family) {
    case Family::luna: return luna_features(x, params, spec);
    case Family::performer: return performer_features(x, params, spec, role, real);
    case Family::rff: {
      const Tensor w = torch::einsum("bnhd,hmd->bnhm", {x, param_tensor(params, spec, "omega", H, x.scalar_type())});
      return torch::cat({torch::cos(w), torch::sin(w)}, -1) / std::sqrt(double(spec.rff.features));
    }
    case Family::elu: return torch::elu(x) + 1;
    case Family::relu: return torch::relu(x);
    case Family::t2r:
    case Family::hedgehog: {
      const Tensor W = param_tensor(params, spec, "W", H, x.scalar_type());
      const Tensor b = param_tensor(params, spec, "b", H, x.scalar_type());
      const Tensor y = torch::einsum("bnhd,hfd->bnhf", {x, W}) + per_head(b, 0);
      if (spec.family == Family::t2r) return torch::relu(y);
      return torch::cat({torch::softmax(y, -1), torch::softmax(-y, -1)}, -1);
    }
    case Family::cosformer: {
      // Angles pi t / (2N) of the 1-based positions t = 1..N.
      const int64_t N = x.size(1);
      const Tensor t = torch::arange(1, N + 1, x.options()).reshape({1, N, 1, 1});
      const Tensor angle = t * (std::numbers::pi / (2.0 * double(N)));
      const Tensor r = torch::relu(x);
      return torch::cat({r * torch::sin(angle), r * torch::cos(angle)}, -1);
    }
    case Family::slay: return slay_features(x, params, spec);
  }
  TORCH_CHECK(false, "feature_map: unknown family");
  (void)d;
  return {};
}

}  // namespace

torch::Tensor feature_map(const torch::Tensor& x_in, const torch::Tensor& params, const AttentionSpec& spec,
                          FeatureRole role, const torch::Tensor& key_mask) {
  const Tensor x = x_in.to(compute_dtype(x_in.scalar_type()));
  if (!key_mask.defined()) return features(x, params, spec, role, {});
  TORCH_CHECK(role == FeatureRole::key, "feature_map: key_mask applies to keys only");
  TORCH_CHECK(spec.family != Family::cosformer, "feature_map: key_mask is not supported for family cosformer");
  const Tensor real = key_mask.reshape({x.size(0), x.size(1), 1, 1});
  return features(x, params, spec, role, real).masked_fill(real.logical_not(), 0);
}

torch::Tensor linear_attention_from_features(const torch::Tensor& phi_q, const torch::Tensor& phi_k,
                                             const torch::Tensor& v_in, bool causal, bool normalize, double eps,
                                             int64_t chunk) {
  const Tensor pq = phi_q.permute({0, 2, 1, 3});  // (B, H, N, D)
  const Tensor pk = phi_k.permute({0, 2, 1, 3});
  const Tensor v = v_in.to(phi_q.scalar_type()).permute({0, 2, 1, 3});  // (B, H, N, dv)
  const int64_t B = pq.size(0), H = pq.size(1), N = pq.size(2), D = pq.size(3), dv = v.size(3);
  Tensor out;
  if (!causal) {
    const Tensor S = torch::matmul(pk.transpose(-1, -2), v);  // (B, H, D, dv)
    out = torch::matmul(pq, S);                               // (B, H, N, dv)
    if (normalize) {
      const Tensor z = pk.sum(2).unsqueeze(-1);  // (B, H, D, 1)
      out = out / (torch::matmul(pq, z) + eps);
    }
  } else {
    const int64_t C = std::max<int64_t>(1, std::min(chunk, N));
    const int64_t nc = (N + C - 1) / C, pad = nc * C - N;
    // Zero rows past N contribute nothing to states; their outputs are cut off.
    auto chunks = [&](const Tensor& t) {
      const Tensor padded = pad ? torch::constant_pad_nd(t, {0, 0, 0, pad}) : t;
      return padded.reshape({B, H, nc, C, t.size(3)});
    };
    const Tensor qc = chunks(pq), kc = chunks(pk), vc = chunks(v);  // (B, H, nc, C, *)
    const Tensor A = lower_triangle(torch::matmul(qc, kc.transpose(-1, -2)));  // (B, H, nc, C, C)
    const Tensor kv = torch::matmul(kc.transpose(-1, -2), vc);                  // (B, H, nc, D, dv)
    // Exclusive prefix sum over chunks: S_<c (a shifted cumsum, no cancellation).
    auto exclusive = [&](const Tensor& t) {
      if (nc == 1) return torch::zeros_like(t);
      return torch::cat({torch::zeros_like(t.narrow(2, 0, 1)), t.cumsum(2).narrow(2, 0, nc - 1)}, 2);
    };
    Tensor num = torch::matmul(A, vc) + torch::matmul(qc, exclusive(kv));  // (B, H, nc, C, dv)
    if (normalize) {
      const Tensor z = kc.sum(3).unsqueeze(-1);  // (B, H, nc, D, 1)
      const Tensor den = A.sum(-1, true) + torch::matmul(qc, exclusive(z)) + eps;
      num = num / den;
    }
    out = num.reshape({B, H, nc * C, dv}).narrow(2, 0, N);
  }
  (void)D;
  return out.permute({0, 2, 1, 3});  // (B, N, H, dv)
}

torch::Tensor linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& params, const AttentionSpec& spec, int64_t chunk,
                               const torch::Tensor& key_mask) {
  if (spec.causal && spec.family == Family::performer) {
    TORCH_CHECK(!key_mask.defined(), "linear_attention: key_mask is not supported for causal performer");
    const auto dt = compute_dtype(q.scalar_type());
    return causal_performer_attention(q.to(dt), k.to(dt), v, params, spec, chunk);
  }
  const Tensor phi_q = feature_map(q, params, spec, FeatureRole::query);
  const Tensor phi_k = feature_map(k, params, spec, FeatureRole::key, key_mask);
  return linear_attention_from_features(phi_q, phi_k, v, spec.causal, spec.normalize, spec.eps, chunk);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> linear_attention_with_state(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v_in, const torch::Tensor& params,
    const AttentionSpec& spec, const torch::Tensor& initial_S, const torch::Tensor& initial_z, int64_t chunk) {
  const Tensor pq = feature_map(q, params, spec, FeatureRole::query).permute({0, 2, 1, 3});  // (B, H, N, D)
  const Tensor pk = feature_map(k, params, spec, FeatureRole::key).permute({0, 2, 1, 3});
  const Tensor v = v_in.to(pq.scalar_type()).permute({0, 2, 1, 3});  // (B, H, N, dv)
  const int64_t B = pq.size(0), H = pq.size(1), N = pq.size(2), D = pq.size(3), dv = v.size(3);
  const Tensor S0 = initial_S.defined() ? initial_S.to(pq.scalar_type()) : torch::zeros({B, H, D, dv}, pq.options());
  const Tensor z0 = initial_z.defined() ? initial_z.to(pq.scalar_type()) : torch::zeros({B, H, D}, pq.options());
  const int64_t C = std::max<int64_t>(1, std::min(chunk, N));
  const int64_t nc = (N + C - 1) / C, pad = nc * C - N;
  auto chunks = [&](const Tensor& t) {
    const Tensor padded = pad ? torch::constant_pad_nd(t, {0, 0, 0, pad}) : t;
    return padded.reshape({B, H, nc, C, t.size(3)});
  };
  const Tensor qc = chunks(pq), kc = chunks(pk), vc = chunks(v);              // (B, H, nc, C, *)
  const Tensor A = lower_triangle(torch::matmul(qc, kc.transpose(-1, -2)));  // (B, H, nc, C, C)
  const Tensor kv = torch::matmul(kc.transpose(-1, -2), vc);                  // (B, H, nc, D, dv)
  const Tensor kz = kc.sum(3);                                                // (B, H, nc, D)
  // S_<c = S0 + the exclusive prefix of the chunk states (MATH.md §1a).
  auto exclusive = [&](const Tensor& t, const Tensor& start) {
    const Tensor first = start.unsqueeze(2);
    if (nc == 1) return first;
    return torch::cat({first, start.unsqueeze(2) + t.cumsum(2).narrow(2, 0, nc - 1)}, 2);
  };
  Tensor num = torch::matmul(A, vc) + torch::matmul(qc, exclusive(kv, S0));  // (B, H, nc, C, dv)
  if (spec.normalize) {
    const Tensor den = A.sum(-1, true) + torch::matmul(qc, exclusive(kz, z0).unsqueeze(-1)) + spec.eps;
    num = num / den;
  }
  const Tensor o = num.reshape({B, H, nc * C, dv}).narrow(2, 0, N).permute({0, 2, 1, 3});
  return {o, S0 + kv.sum(2), z0 + kz.sum(2)};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> linear_attention_step(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v_in, const torch::Tensor& params,
    const AttentionSpec& spec, const torch::Tensor& S_in, const torch::Tensor& z_in) {
  const Tensor pq = feature_map(q, params, spec, FeatureRole::query).select(1, 0);  // (B, H, D)
  const Tensor pk = feature_map(k, params, spec, FeatureRole::key).select(1, 0);
  const Tensor v = v_in.to(pq.scalar_type()).select(1, 0);  // (B, H, dv)
  const int64_t B = pq.size(0), H = pq.size(1), D = pq.size(2), dv = v.size(2);
  const Tensor S0 = S_in.defined() ? S_in.to(pq.scalar_type()) : torch::zeros({B, H, D, dv}, pq.options());
  const Tensor z0 = z_in.defined() ? z_in.to(pq.scalar_type()) : torch::zeros({B, H, D}, pq.options());
  const Tensor S = S0 + pk.unsqueeze(-1) * v.unsqueeze(-2);  // (B, H, D, dv)
  const Tensor z = z0 + pk;
  Tensor o = torch::matmul(pq.unsqueeze(-2), S).squeeze(-2);  // (B, H, dv)
  if (spec.normalize) o = o / ((pq * z).sum(-1, true) + spec.eps);
  return {o.unsqueeze(1), S, z};
}

torch::Tensor linear_attention_weights(const torch::Tensor& phi_q, const torch::Tensor& phi_k, bool causal,
                                       bool normalize, double eps) {
  Tensor A = torch::matmul(phi_q.permute({0, 2, 1, 3}), phi_k.permute({0, 2, 3, 1}));  // (B, H, N, N)
  if (causal) A = lower_triangle(A);
  if (normalize) A = A / (A.sum(-1, true) + eps);
  return A;
}

torch::Tensor linear_attention_weights(const torch::Tensor& q_in, const torch::Tensor& k_in,
                                       const torch::Tensor& params, const AttentionSpec& spec,
                                       const torch::Tensor& key_mask) {
  if (!(spec.causal && spec.family == Family::performer))
    return linear_attention_weights(feature_map(q_in, params, spec, FeatureRole::query),
                                    feature_map(k_in, params, spec, FeatureRole::key, key_mask), spec.causal,
                                    spec.normalize, spec.eps);
  TORCH_CHECK(!key_mask.defined(), "linear_attention_weights: key_mask is not supported for causal performer");
  const auto dt = compute_dtype(q_in.scalar_type());
  const CausalPerformerParts p = causal_performer_parts(q_in.to(dt), k_in.to(dt), params, spec);
  const int64_t N = p.pq.size(2);
  const Tensor Q = p.pq.sum(-1, true);
  Tensor A = causal_weights(p.s, p.M) * torch::matmul(p.pq, p.ut.transpose(-1, -2)) +
             spec.performer.kernel_eps * Q * torch::ones({N, N}, p.pq.options()).tril();
  if (spec.normalize) A = A / (A.sum(-1, true) + spec.eps);
  return A;
}

std::string_view to_string(QuadraticKind k) {
  switch (k) {
    case QuadraticKind::softmax: return "softmax";
    case QuadraticKind::yat: return "yat";
    case QuadraticKind::spherical_yat: return "spherical_yat";
  }
  return "?";
}

std::optional<QuadraticKind> parse_quadratic_kind(std::string_view s) {
  if (s == "softmax") return QuadraticKind::softmax;
  if (s == "yat") return QuadraticKind::yat;
  if (s == "spherical_yat" || s == "spherical-yat") return QuadraticKind::spherical_yat;
  return std::nullopt;
}

torch::Tensor quadratic_weights(const torch::Tensor& q_in, const torch::Tensor& k_in, const QuadraticOptions& o,
                                const torch::Tensor& key_mask) {
  const auto dt = compute_dtype(q_in.scalar_type());
  const Tensor q = q_in.to(dt).permute({0, 2, 1, 3});  // (B, H, Nq, d)
  const Tensor k = k_in.to(dt).permute({0, 2, 1, 3});  // (B, H, Nk, d)
  const int64_t d = q.size(3), Nq = q.size(2), Nk = k.size(2);
  Tensor mask = o.causal ? torch::ones({Nq, Nk}, q.options().dtype(torch::kBool)).tril() : Tensor();
  if (key_mask.defined()) {
    const Tensor keys = key_mask.reshape({q.size(0), 1, 1, Nk});  // (B, 1, 1, Nk)
    mask = mask.defined() ? mask.logical_and(keys) : keys;
  }
  if (o.kind == QuadraticKind::softmax) {
    Tensor logits = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(d));
    if (mask.defined()) logits = logits.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
    return torch::softmax(logits, -1);
  }
  Tensor K;
  if (o.kind == QuadraticKind::yat) {
    const Tensor qk = torch::matmul(q, k.transpose(-1, -2));
    // |q - k|^2 = |q|^2 + |k|^2 - 2 q.k, clamped at 0 against rounding.
    const Tensor dist = ((q * q).sum(-1, true) + (k * k).sum(-1).unsqueeze(-2) - 2 * qk).clamp_min(0);
    K = qk * qk / (dist + o.eps);
  } else {
    const Tensor x = torch::matmul(q / q.norm(2, -1, true), (k / k.norm(2, -1, true)).transpose(-1, -2));
    K = x * x / (2.0 + o.eps_yat - 2.0 * x);
  }
  if (mask.defined()) K = K.masked_fill(mask.logical_not(), 0);
  return K / K.sum(-1, true);
}

torch::Tensor quadratic_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const QuadraticOptions& opts, const torch::Tensor& key_mask) {
  const Tensor w = quadratic_weights(q, k, opts, key_mask);  // (B, H, Nq, Nk)
  return torch::matmul(w, v.to(w.scalar_type()).permute({0, 2, 1, 3})).permute({0, 2, 1, 3});
}

}  // namespace lunajit::aten
