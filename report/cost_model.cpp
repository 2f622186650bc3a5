#include "report/cost_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "codegen/feature_params.h"

namespace lunajit::report {
namespace {

// FLOPs of one element-wise function as templates/lunajit/feature_maps.cuh
// writes it (special functions count 1, a division 1).
double activation_flops(Activation a) {
  switch (a) {
    case Activation::relu: return 1;  // fmaxf
    case Activation::gelu: return 5;  // 0.5 * x * (1 + erf(x c)): 3 mul, 1 add, erf
    case Activation::silu: return 4;  // x / (1 + exp(-x)): neg, exp, add, div
    case Activation::tanh: return 1;
  }
  return 1;
}
double output_activation_flops(OutputActivation a) {
  switch (a) {
    case OutputActivation::relu: return 1;
    case OutputActivation::softplus: return 3;  // compare, exp, log1p
    case OutputActivation::none: return 0;
  }
  return 0;
}
// luna bank_coef basis by l mod 8: sin, cos, tanh, sigmoid, relu, gelu, softplus, exp(-u^2/2).
constexpr double kBankBasisFlops[8] = {1, 1, 1, 3, 1, 5, 3, 3};
constexpr double kSigmoidFlops = 3;  // 1 / (1 + exp(-x)): exp, add, div

double luna_flops(const AttentionSpec& s) {
  const double d = s.head_dim, M = s.luna.projections, L = s.luna.channels, Hm = s.luna.mlp_width;
  double f = 2 * d * M;  // u_i = w_i . x
  switch (s.luna.variant) {
    case LunaVariant::neural: {
      const double act = activation_flops(s.luna.activation), out = output_activation_flops(s.luna.output_activation);
      if (s.luna.shared_channels) f += M * (2 * Hm + act * Hm + 2 * Hm * L + out * L);
      else f += M * L * (Hm * (4 + act) + out);
      break;
    }
    case LunaVariant::bank_coef:
      for (int l = 0; l < s.luna.channels; ++l) f += M * (kBankBasisFlops[l & 7] + 1);  // basis, coefficient
      break;
    case LunaVariant::rff: f += M * 2; break;  // cos, sin
  }
  f += M * L;                                      // gate * psi
  if (s.luna.envelope) f += 2 * d + 2 + kSigmoidFlops;  // sigmoid(a . x + c) / sqrt(M)
  return f;
}

// Performer's exponent omega^T x' - |x'|^2 / 2 for one row (log_features).
double performer_log_flops(const AttentionSpec& s) {
  const double d = s.head_dim, D = s.feature_dim();
  return 2 * d + 3 + D * (2 * d + 2);
}

double ceil_div(double a, double b) { return std::ceil(a / b); }

// Bytes and FLOPs of the backward kernels of templates/lunajit/linear_attention_backward.cuh
// (dstate, dq, dkv, causal_dq, causal_dkv, param_reduce); formulas in the header.
Result<KernelCost> backward_cost(const AttentionSpec& s, const TileConfig& c, std::string_view role,
                                 const ProblemShape& shape) {
  const double BH = double(shape.batch) * shape.heads, N = shape.seq;
  const double d = s.head_dim, dv = s.value_dim, D = s.feature_dim(), e = dtype_bytes(s.dtype);
  const double splits = c.state_splits(), nt = ceil_div(N, c.block_tokens());
  const bool learned = has_learned_params(s);
  const double P = double(param_layout(s).per_head_floats), Hp = s.params_per_head ? shape.heads : 1;
  const double params = 4.0 * P * Hp;
  const double stab_read = s.family == Family::performer ? 4 * BH : 0;
  const double Fq = feature_map_flops_per_token(s, true), Fk = feature_map_flops_per_token(s, false);
  // The feature map's Jacobian-transpose product (dx and the parameter partial) per row:
  // an estimate, 2F (see the header), not a count of the code.
  const double Jq = 2 * Fq, Jk = 2 * Fk;
  const double part = D * dv + D;           // floats of one split partial of (S, z) or (dS, dz)
  const double partials = 4 * BH * splits * part;
  const double norm = s.normalize ? 1 : 0;
  const double den_row = norm * (2 * D + 1);     // phi(q) . z + eps
  const double grad_row = norm * (3 * dv + 2);   // r = -(dO . o) / den, g = dO / den
  KernelCost k;
  if (role == "dstate") {
    k.bytes = BH * N * (d + 2 * dv) * e + 4 * BH * splits * D + partials + params;
    k.flops = BH * splits * splits * D + BH * N * (Fq + den_row + grad_row) + 2 * BH * N * D * dv + 2 * BH * N * D;
  } else if (role == "dq") {
    k.bytes = BH * N * (2 * d + 2 * dv) * e + partials + params + (learned ? 4 * P * BH * nt : 0);
    k.flops = nt * BH * splits * part + BH * N * (Fq + den_row + grad_row + D * (2 * dv + norm) + Jq);
  } else if (role == "dkv") {
    k.bytes = BH * N * (2 * d + 2 * dv) * e + partials + params + stab_read + (learned ? 4 * P * BH * nt : 0);
    k.flops = nt * BH * splits * part + BH * N * (Fk + 2 * D * dv /* dphi */ + 2 * dv * D /* dv */ + Jk);
  } else if (role == "causal_dq" || role == "causal_dkv") {
    const bool dq = role == "causal_dq";
    k.bytes = BH * N * (dq ? 3 * d + 3 * dv : 3 * d + 4 * dv) * e + norm * 4 * BH * N + params + stab_read +
              (learned ? 4 * P * BH : 0);
    // Per chunk of cc tokens: see the header.
    auto chunk_flops = [&](double cc) {
      const double tri = cc * (cc + 1) / 2;
      double f = cc * (Fq + Fk) + tri * 2 * D + tri * (2 * dv + 1) + cc * grad_row + 2 * D * dv * cc;
      if (dq) f += cc * den_row + norm * tri + cc * D * (2 * dv + norm) + 2 * D * tri + D * cc + cc * Jq;
      else f += cc * D * 2 * dv + 2 * D * tri + cc * dv * 2 * D + 2 * dv * tri + 2 * D * cc + cc * Jk;
      return f;
    };
    const double C = c.chunk(), full = std::floor(N / C), rest = N - full * C;
    k.flops = BH * (full * chunk_flops(C) + (rest > 0 ? chunk_flops(rest) : 0));
  } else {  // param_reduce
    if (!learned) return Error::invalid("param_reduce: this feature map learns no parameters");
    const double slots = 2 * BH * (s.causal ? 1 : nt);
    k.bytes = 4 * P * slots + 4 * P * Hp;
    k.flops = P * slots;
  }
  return k;
}

}  // namespace

double feature_map_flops_per_token(const AttentionSpec& s, bool is_query) {
  const double d = s.head_dim, D = s.feature_dim();
  switch (s.family) {
    case Family::luna: return luna_flops(s);
    case Family::performer: return performer_log_flops(s) + (is_query ? D : 0) + 4 * D;
    case Family::rff: return s.rff.features * (2 * d + 4);
    case Family::elu: return 2 * d;
    case Family::relu: return d;
    case Family::t2r: return D * (2 * d + 2);
    case Family::hedgehog: return s.hedgehog.features * (2 * d + 11) + 2;
    case Family::cosformer: return 7 * d;
    case Family::slay: {
      const double P = s.slay.anchors, R = s.slay.nodes, M = s.slay.prf_features;
      return 2 * d + 2 + P * (2 * d + 3) + R * M * (2 * d + 7) + 3 * D;
    }
  }
  return 0;
}

Result<KernelCost> kernel_cost(const AttentionSpec& s, const TileConfig& c, Pass pass, std::string_view role,
                               const ProblemShape& shape) {
  if (auto st = validate(shape); !st) return st.error();
  const bool backward_role = role == "dstate" || role == "dq" || role == "dkv" || role == "causal_dq" ||
                             role == "causal_dkv" || role == "param_reduce";
  const bool forward_only_role = role == "feature_map" || role == "output" || role == "causal_chunk";
  if (backward_role && pass != Pass::backward)
    return Error::invalid(fmt::format("{}: a backward kernel (pass = backward)", role));
  if (forward_only_role && pass == Pass::backward)
    return Error::invalid(fmt::format("backward {}: the backward pass has no such kernel", role));
  const double BH = double(shape.batch) * shape.heads, N = shape.seq;
  const double d = s.head_dim, dv = s.value_dim, D = s.feature_dim(), e = dtype_bytes(s.dtype);
  const double nd = ceil_div(dv, c.dv_block()), splits = c.state_splits();
  const double params = 4.0 * param_layout(s).per_head_floats * (s.params_per_head ? shape.heads : 1);
  const bool performer = s.family == Family::performer;
  const double stab_read = performer ? 4 * BH : 0;
  const double Fq = feature_map_flops_per_token(s, true), Fk = feature_map_flops_per_token(s, false);
  const double partials = 4 * BH * splits * (D * dv + D);
  KernelCost k;
  if (role == "feature_map") {
    k.bytes = BH * N * d * e + 4 * BH * N * D + params + stab_read;
    k.flops = BH * N * Fk;
  } else if (role == "key_stab") {
    if (!performer) return Error::invalid("key_stab: only performer has a key stabiliser kernel");
    k.bytes = BH * N * d * e + 4 * BH + params;
    k.flops = BH * N * (performer_log_flops(s) + D);
  } else if (role == "state") {
    k.bytes = BH * N * (d + dv) * e + partials + params + stab_read;
    k.flops = nd * BH * N * Fk + 2 * BH * N * D * dv + BH * N * D;
  } else if (role == "output") {
    const double nt = ceil_div(N, c.block_tokens());
    k.bytes = BH * N * (d + dv) * e + partials + params;
    k.flops = nd * BH * N * Fq + 2 * BH * N * D * dv + nt * BH * splits * (D * dv + nd * D);
    if (s.normalize) k.flops += nd * BH * N * (2 * D + 1) + BH * N * dv;
  } else if (role == "causal_chunk") {
    k.bytes = BH * N * (2 * d + 2 * dv) * e + params + stab_read;
    // Per dv block (width w) and chunk (c tokens): see the header.
    auto chunk_flops = [&](double cc, double w) {
      const double tri = cc * (cc + 1) / 2;
      double f = tri * 2 * D + w * (cc * (cc + 1) + 2 * D * cc) + 2 * D * w * cc + D * cc;
      if (s.normalize) f += cc * (2 * D + 1) + tri + w * cc;
      return f;
    };
    const double C = c.chunk(), full = std::floor(N / C), rest = N - full * C;
    double per_head = nd * N * (Fq + Fk);
    for (double b = 0; b < nd; ++b) {
      const double w = std::min<double>(c.dv_block(), dv - b * c.dv_block());
      per_head += full * chunk_flops(C, w) + (rest > 0 ? chunk_flops(rest, w) : 0);
    }
    k.flops = BH * per_head;
  } else if (backward_role) {
    return backward_cost(s, c, role, shape);
  } else {
    return Error::invalid(fmt::format("kernel = {}: no cost formula (known: feature_map, key_stab, state, output, "
                                      "causal_chunk, dstate, dq, dkv, causal_dq, causal_dkv, param_reduce)",
                                      role));
  }
  return k;
}

RooflineTime roofline_time(const KernelCost& cost, const GpuSpec& gpu) {
  RooflineTime t;
  t.memory_ms = cost.bytes / (gpu.memory_gbps * 1e9) * 1e3;
  t.compute_ms = cost.flops / (scalar_peak_tflops(gpu) * 1e12) * 1e3;
  t.time_ms = std::max(t.memory_ms, t.compute_ms);
  t.bound = t.compute_ms >= t.memory_ms ? "compute" : "memory";
  return t;
}

}  // namespace lunajit::report
