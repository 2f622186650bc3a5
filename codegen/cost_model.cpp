#include "codegen/cost_model.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "codegen/feature_params.h"
#include "codegen/occupancy.h"
#include "lunajit/layout.cuh"

namespace lunajit {
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

// SFU results of phi for one row (the conventions in the header).
double activation_sfu(Activation a) {
  switch (a) {
    case Activation::relu: return 0;
    case Activation::gelu: return 1;
    case Activation::silu: return 2;
    case Activation::tanh: return 1;
  }
  return 0;
}
double feature_map_sfu_per_token(const AttentionSpec& s) {
  const double d = s.head_dim, D = s.feature_dim();
  switch (s.family) {
    case Family::luna: {
      const double M = s.luna.projections, L = s.luna.channels, Hm = s.luna.mlp_width;
      const double out = s.luna.output_activation == OutputActivation::softplus ? 2 : 0;
      double f = 0;
      switch (s.luna.variant) {
        case LunaVariant::neural:
          f = (s.luna.shared_channels ? M * Hm : M * L * Hm) * activation_sfu(s.luna.activation) + M * L * out;
          break;
        case LunaVariant::bank_coef: f = M * L; break;
        case LunaVariant::rff: f = 2 * M; break;
      }
      return f + (s.luna.envelope ? 2 : 0);
    }
    case Family::performer: return D;
    case Family::rff: return 2.0 * s.rff.features;
    case Family::hedgehog: return s.hedgehog.features;
    case Family::slay: return double(s.slay.nodes) * s.slay.prf_features + s.slay.anchors;
    case Family::cosformer: return 2 * d;
    case Family::elu: return d;
    case Family::relu: return 0;
    case Family::t2r: return 0;
  }
  return 0;
}

// L1 wavefronts of phi's parameter (or operand) loads for one row: the header's
// "lines" rule.
double feature_map_wavefronts_per_token(const AttentionSpec& s, double F) {
  const double d = s.head_dim, D = s.feature_dim();
  switch (s.family) {
    case Family::luna: {
      const double M = s.luna.projections, proj = 2 * d * M;
      return (proj / 2 * std::min(M, 32.0) + std::max(0.0, F - proj) / 2) / 32;
    }
    case Family::elu:
    case Family::relu:
    case Family::cosformer: return F / 2 / 32;
    default: return F / 2 * std::min(D, 32.0) / 32;
  }
}

// LUNA's phi on tensor cores, per row (the header's formulas).
struct TensorCorePhi {
  double tc_flops = 0;    // executed on mma (the W split counts twice)
  double gemm_in_F = 0;   // the part of luna_flops those mmas replace
  double wavefronts = 0;  // shared / L1
};
// split: the backward's map (mma_phi_split_tile), psi in three split terms,
// phi stored as fp32 (or as the state pass's hi + lo tiles, counted alike):
// 4 D bytes a row in conflict-free 64-bit fragment stores, the fp32 tile's
// rows padded to D + 8 floats (backward_phi_stride; D apart, a fragment's 8
// rows shared banks: D / 8 wavefronts a row, measured by the bank profile).
TensorCorePhi tensor_core_phi(const AttentionSpec& s, bool split) {
  const double d = s.head_dim, M = s.luna.projections, L = s.luna.channels, Hm = s.luna.mlp_width;
  const double M8 = std::ceil(M / 8) * 8, D = s.feature_dim();
  const double psi_terms = split ? 3 : 1, phi_stores = split ? D / 32 : D / 64;
  return {2 * 2 * d * M8 + psi_terms * 2 * M * Hm * L, 2 * d * M + 2 * M * Hm * L,
          M * Hm / 32 + 2 * d / 64 + phi_stores};
}

// The feature map's Jacobian-transpose (dx and the parameter partial) of one
// row, as the dq and dkv kernels run it (the header's formulas): counted for
// LUNA's neural map with shared channels, fp32 (feature_map_backward.cuh) or
// on tensor cores (feature_map_backward_mma.cuh); otherwise the 2F estimate.
struct Jacobian {
  double flops = 0;       // all, tensor-core ones as executed (three split terms)
  double tc_flops = 0;    // of which on mma
  double wavefronts = 0;  // shared / L1 (0: the feature map's rule applies to flops)
  double sfu = 0;
  bool counted = false;
};
double activation_grad_flops(Activation a) {
  switch (a) {
    case Activation::relu: return 1;  // compare
    case Activation::gelu: return 9;  // cdf (erf, 3) + pdf (exp, 3) + x pdf + add
    case Activation::silu: return 6;  // s = 1 / (1 + exp(-x)) (3), s (1 + x (1 - s)) (3)
    case Activation::tanh: return 3;  // tanh, 1 - t t
  }
  return 1;
}
double activation_grad_sfu(Activation a) {
  switch (a) {
    case Activation::relu: return 0;
    case Activation::gelu: return 2;
    case Activation::silu: return 2;
    case Activation::tanh: return 1;
  }
  return 0;
}
Jacobian jacobian_per_row(const AttentionSpec& s, bool tensor_cores, double F) {
  const LunaOptions& o = s.luna;
  Jacobian j;
  if (s.family != Family::luna || o.variant != LunaVariant::neural || !o.shared_channels) {
    j.flops = 2 * F;
    return j;
  }
  const double d = s.head_dim, M = o.projections, L = o.channels, Hm = o.mlp_width, D = s.feature_dim();
  const double act = activation_flops(o.activation), actg = activation_grad_flops(o.activation);
  const double out = output_activation_flops(o.output_activation);
  const double sfu_h = activation_sfu(o.activation), sfu_g = activation_grad_sfu(o.activation);
  const double soft = o.output_activation == OutputActivation::softplus ? 1 : 0;
  const double env = o.envelope ? 2 * D + 2 + 4 * d + 1 : 0;  // denv dot, dx and (a, c) terms
  const double tail = 4 * d * M;                           // dx = du W, dW += du^T x
  j.counted = true;
  if (tensor_cores) {
    // dpre (D (2 + out')), db2 (D); per item and hidden unit a, act, act', da, du, dW1, db1
    // (8 + act + act'). On mma: u = X W^T with W split in two (2 * 2 d M8, as the
    // forward's tensor-core map), dh = dpre W2 and dW2^T += H^T dpre (2 M L Hm each, three
    // split terms), and the tail: dx = dU W (2 d M8, three split terms) and dW^T += X^T dU
    // (2 d M8, two: x exact).
    const double M8 = std::ceil(M / 8) * 8, KM = M8 / 8;
    j.tc_flops = 2 * 2 * d * M8 + 2 * 3 * 2 * M * L * Hm + 5 * 2 * d * M8;
    j.flops = D * (3 + out) + M * Hm * (8 + act + actg) + env + j.tc_flops;
    // Per 16 items: ldmatrix of dpre (A and B, x4 each, per 8 channels), hidden tiles stored
    // (2 rows x hi, lo per 8 units) and read back (.trans x4, hi and lo, per 16 units), W1 and b1
    // (2 loads each per 8 units), u read and du written (2 each); per row dpre's fp32 passes (dphi,
    // phi read, dpre written, db2 read: 16 D bytes) and its hi + lo tiles (4 D bytes), x's bf16
    // copy and its ldmatrix (2 d / 64), u's stores (M8 / 8: 4-way at bs's 2M + 1 stride); the tail, per 16 rows: dx per
    // 8-column n-tile 4 dU loads and 8 W wavefronts per k-step, 16 for its two 64-bit stores
    // (a fragment's rows share banks); dW per 16-column m-tile and k-step an ldmatrix.x4 (4)
    // and 4 dU loads at about 2 wavefronts each.
    const double per16 = 8 * (L / 8) + 4 * (Hm / 8) + 8 * (Hm / 16) + 4 * (Hm / 8) + 4;
    // The dU loads read bs's rows 2M + 1 floats apart: a fragment's lanes meet 4 to a bank
    // (4 wavefronts each, the bank profile's count at the default); dx's, once per warp
    // and m-tile, are in jacobian_per_tile.
    const double tail_wave = (d / 8) * (8 * KM + 16) / 16 + (d / 16) * KM * 20 / 16;
    j.wavefronts = M / 16 * per16 + 20 * D / 128 + 2 * d / 64 + M8 / 8 + tail_wave;
    j.sfu = M * Hm * (sfu_h + sfu_g) + soft * 2 * D;
    return j;
  }
  // fp32 code (jacobian_per_tile adds nothing for it), per item: u (2d); the MLP again (Hm (2 + act) + 2 Hm L); dpre (L (2 + out'));
  // dh and du (Hm (2 L + 5 + act')); dW1, db1 recompute dh (Hm (2 L + 6 + act')); dW2 recomputes
  // h per channel (L Hm (4 + act)); db2 (L).
  const double item = 2 * d + Hm * (2 + act) + 2 * Hm * L + L * (2 + out) + Hm * (2 * L + 5 + actg) +
                      Hm * (2 * L + 6 + actg) + L * Hm * (4 + act) + L;
  j.flops = M * item + tail + env;
  j.sfu = M * (Hm * (sfu_h + 2 * sfu_g) + L * Hm * sfu_h + 2 * soft * L);
  return j;
}

// Shared wavefronts of one call of the tensor-core J^T on a tile of `rows`
// tokens by `warps` warps, beyond its per-row terms: the parameter-gradient
// partials' reductions (the header's formula).
double jacobian_per_tile(const AttentionSpec& s, double rows, double warps) {
  const LunaOptions& o = s.luna;
  const double d = s.head_dim, M = o.projections, L = o.channels, Hm = o.mlp_width;
  const double KM = std::ceil(M / 8), with_items = std::min(warps, std::ceil(rows / 16) * M);
  const double stores = 4 * std::ceil(Hm / 64) + 4 * (Hm / 16) * (L / 8);  // a warp's dW1, db1 pairs; dW2^T
  const double sums = std::ceil((2 * Hm + L * Hm) / 32) * (with_items + 2);  // warp partials read; dparams RMW
  const double dw = 16 * (d / 16) * KM;  // dW's read-modify-write, 2-way
  // dx's dU A fragments: 4 loads of 4 wavefronts per k-step, once per (m-tile, slot) unit.
  const double dx_du = std::ceil(rows / 16) * std::min(warps, d / 8) * KM * 16;
  return with_items * stores + sums + dw + dx_du;
}

// Where a kernel's FLOPs go, for the wavefront and tensor-core split.
struct Split {
  double fm = 0;          // phi (and its J^T): CUDA cores, parameter loads through L1
  double product = 0;     // GEMM-shaped products (shared operands)
  double conflicted = 0;  // of which on the 8-way conflicted causal tiles
  double sfu = 0;         // SFU results
  double tc_terms = 1;    // tensor cores: mmas per useful product (the backward's bf16 hi/lo split: 2 or 3)
  double jt_tc = 0;       // a counted J^T on tensor cores: its mma FLOPs (executed)
  double jt_wave = 0;     // a counted J^T on tensor cores: its wavefronts
  double scores_tc = 0;   // the causal walks' intra-chunk scores on mma (executed FLOPs; their
                          // fragment loads are in fp32_tiles)
  double fp32_tiles = 0;  // tensor-core kernels: fp32 products on conflict-free shared tiles beside the mmas
};

void finish(KernelCounts& k, const Split& sp, const AttentionSpec& s, bool tensor, double fm_rows_F, double F,
            bool tc_phi = false, bool split_phi = false) {
  // fm_rows_F: feature-map FLOPs (the wavefront rule is per F FLOPs of phi).
  const double rows = F > 0 ? fm_rows_F / F : 0;
  double fm_wave = rows * feature_map_wavefronts_per_token(s, F);
  if (tensor) {
    const double e = dtype_bytes(s.dtype);
    // Executed tensor-core FLOPs: a split product runs tc_terms mmas (counted
    // like the feature map's W split); the extra ones are added to flops.
    k.tc_flops = sp.product * sp.tc_terms;
    k.flops += sp.product * (sp.tc_terms - 1);
    if (tc_phi) {
      const TensorCorePhi p = tensor_core_phi(s, split_phi);
      k.flops += rows * (p.tc_flops - p.gemm_in_F);
      k.tc_flops += rows * p.tc_flops;
      fm_wave = rows * p.wavefronts;
    }
    k.tc_dtype = s.dtype;
    k.tc_flops += sp.jt_tc + sp.scores_tc;
    k.cuda_flops = k.flops - k.tc_flops;
    // (sp.fp32_tiles: fp32 work beside the mma products, the causal
    // backward's intra-chunk terms and its walks' state updates: two
    // operands per FMA, one wavefront per 32 FLOPs as the scalar rule below.)
    k.smem_wavefronts = fm_wave + sp.jt_wave + sp.product * sp.tc_terms * e * 64 / (2 * 32 * 32) / 128 +
                        sp.fp32_tiles / 32;
  } else {
    k.tc_flops = 0;
    k.cuda_flops = k.flops;
    const double plain = sp.product - sp.conflicted;
    k.smem_wavefronts = fm_wave + plain / 32 + sp.conflicted * 8 / 32;
  }
  k.sfu_ops = sp.sfu;
}

// Bytes and FLOPs of the backward kernels of templates/lunajit/linear_attention_backward.cuh
// (dstate, dq, dkv, causal_dq, causal_dkv, param_reduce, param_sum); formulas in the header.
Result<KernelCounts> backward_counts(const AttentionSpec& s, const TileConfig& c, std::string_view role,
                                     const ProblemShape& shape, bool tensor) {
  const double BH = double(shape.batch) * shape.heads, N = shape.seq;
  const double d = s.head_dim, dv = s.value_dim, D = s.feature_dim(), e = dtype_bytes(s.dtype);
  const bool tiles = causal_backward_tiles(s, c, Pass::backward);  // causal walks on tensor cores
  const double splits = c.state_splits(), nt = ceil_div(N, tiles ? c.chunk() : c.block_tokens());
  // The causal walks' ranges: split_range's ceil(nt / R) chunks each, so only
  // ceil(nt / ceil(nt / R)) of the R ranges hold chunks (the rest are empty).
  const double per_range = tiles ? std::ceil(nt / splits) : 0;
  const double live_ranges = tiles ? std::ceil(nt / per_range) : 0;
  const bool learned = has_learned_params(s);
  const double P = double(param_layout(s).per_head_floats), Hp = s.params_per_head ? shape.heads : 1;
  const double params = 4.0 * P * Hp;
  const double stab_read = s.family == Family::performer ? 4 * BH : 0;
  const double Fq = feature_map_flops_per_token(s, true), Fk = feature_map_flops_per_token(s, false);
  const double sfu_row = feature_map_sfu_per_token(s);
  // The feature map's Jacobian-transpose product (dx and the parameter partial) per row:
  // counted for LUNA's neural map, else the 2F estimate (see the header).
  const bool jt_tc = tensor && jacobian_on_tensor_cores(s, c);
  const Jacobian JQ = jacobian_per_row(s, jt_tc, Fq), JK = jacobian_per_row(s, jt_tc, Fk);
  const double Jq = JQ.flops, Jk = JK.flops;
  const double jsfu = JQ.counted ? JQ.sfu : 2 * sfu_row;  // queries and keys alike
  const double part = D * dv + D;           // floats of one split partial of (S, z) or (dS, dz)
  const double partials = 4 * BH * splits * part;
  // The non-causal readers' state: partial 0, summed once by the reduce kernels.
  const double state_read = 4 * BH * part;
  const double norm = s.normalize ? 1 : 0;
  const double den_row = norm * (2 * D + 1);     // phi(q) . z + eps
  // g = dO / den and r = -(phi(q) . p) / den from the dq kernels' own fp32
  // product p (query_r; docs/MATH.md §1): not the forward's o, which only the
  // causal performer still reads. r goes through the workspace (4 bytes a row).
  const double grad_row = norm * (dv + 2 * D + 2);
  const double o_row = s.family == Family::performer && s.causal ? dv : 0;  // o read (causal performer)
  KernelCounts k;
  k.role = std::string(role);
  Split sp;
  if (role == "dstate") {
    k.bytes = BH * N * ((d + dv) * e + 4 * norm) + 4 * BH * D + partials + params;  // q, dO, r; z; (dS, dz)
    k.flops = BH * N * (Fq + den_row + grad_row) + 2 * BH * N * D * dv + 2 * BH * N * D;
    sp.fm = BH * N * Fq;
    // mma: Phi_q^T [G | r] (three split terms); den on CUDA cores.
    sp.product = BH * N * ((tensor ? 0 : den_row) + 2 * D * dv + 2 * D);
    sp.tc_terms = 3;
    sp.sfu = BH * N * (sfu_row + norm * (dv + 1));
  } else if (role == "dq") {
    k.bytes = BH * N * ((2 * d + dv) * e + 4 * norm) + state_read + params + (learned ? 4 * P * BH * nt : 0);
    k.flops = BH * N * (Fq + den_row + grad_row + D * (2 * dv + norm) + Jq);
    sp.fm = BH * N * (Fq + (jt_tc ? 0 : Jq));
    sp.jt_tc = jt_tc ? BH * N * JQ.tc_flops : 0;
    sp.jt_wave = jt_tc ? BH * N * JQ.wavefronts + BH * nt * jacobian_per_tile(s, c.block_tokens(), c.warps()) : 0;
    // mma: G S^T (three split terms); den and the rank-one r z^T on CUDA cores.
    sp.product = BH * N * (tensor ? 2 * D * dv : den_row + D * (2 * dv + norm));
    sp.tc_terms = 3;
    sp.sfu = BH * N * (sfu_row + jsfu + norm * (dv + 1));
  } else if (role == "dkv") {
    k.bytes = BH * N * (2 * d + 2 * dv) * e + state_read + params + stab_read + (learned ? 4 * P * BH * nt : 0);
    k.flops = BH * N * (Fk + 2 * D * dv /* dphi */ + 2 * dv * D /* dv */ + Jk);
    sp.fm = BH * N * (Fk + (jt_tc ? 0 : Jk));
    sp.jt_tc = jt_tc ? BH * N * JK.tc_flops : 0;
    sp.jt_wave = jt_tc ? BH * N * JK.wavefronts + BH * nt * jacobian_per_tile(s, c.block_tokens(), c.warps()) : 0;
    sp.product = BH * N * 4 * D * dv;
    // mma: Phi_k dS three split terms; V dS^T two (bf16 V exact), three for
    // fp16 I/O (V split into bf16 hi + lo).
    sp.tc_terms = s.dtype == DType::fp16 ? 3 : 2.5;
    sp.sfu = BH * N * (sfu_row + jsfu);
  } else if (role == "dstate_reduce") {
    // As state_reduce (kernel_counts): the (dS, dz) partials read, their sum
    // written; on tensor cores dS also staged as bf16 hi + lo words.
    const bool staged = backward_state_staged(s, c, Pass::backward);
    k.bytes = (splits > 1 ? partials + state_read : state_read) + (staged ? 4 * BH * D * dv : 0);
    k.flops = BH * splits * part + (staged ? 4 * BH * D * dv : 0);
  } else if (role == "state_scan" || role == "dstate_scan") {
    // Each thread walks one entry of (S, z) or (dS, dz) through the range
    // partials (read and written once), loads 8 ranges ahead.
    k.bytes = 2 * 4 * BH * splits * part + 4 * BH * part * (role == "dstate_scan" ? 2 : 1);
    k.flops = BH * splits * part;
    sp.product = 0;
    k.serial_steps = std::ceil(splits / 8);
  } else if (tiles && (role == "causal_dq" || role == "causal_dkv")) {
    // Super-chunk walks on tensor cores: a block walks its range's chunks of
    // cc tokens with the fp32 state in shared memory. Per chunk, on mma: dq
    // G S^T and Phi_q^T [G | r] (three split terms each) and the update
    // S += Phi_k^T [V | 1] (two, three for fp16 I/O); dkv V dS^T (two or
    // three) and Phi_k dS (three) and the update dS += Phi_q^T [G | r]
    // (three); the intra-chunk scores A and B (three split terms, fragments
    // from the fp32 tiles). The rest of the intra-chunk terms fp32 on CUDA
    // cores over the row-major fp32 tiles (counted as issued, below); the
    // updates' adds and the restaged hi + lo tiles (dq also adds the range's
    // dS) as shared words, one wavefront per 32.
    const bool dq = role == "causal_dq";
    const bool fp16 = s.dtype == DType::fp16;
    // k, v, q, dO (+ dq) or q, dO, k, v (+ dk, dv); den and r written / read;
    // the range's prefix read and its (dS, dz) written, or its suffix read.
    k.bytes = BH * N * (dq ? 3 * d + 2 * dv : 3 * d + 3 * dv) * e + norm * 8 * BH * N + params +
              4 * BH * splits * part * (dq ? 2 : 1) + (learned ? 4 * P * BH * splits : 0);
    const double C = c.chunk(), cc = std::min(C, N), tri_all = nt * cc * (cc + 1) / 2;  // rows x kept columns
    // The scores A = Phi_q Phi_k^T and B = G V^T (+ r in dkv) on mma (masked_scores): the
    // (m-tile, n-tile) items holding kept entries, mt (mt + 1) for mt = ceil(cc / 16) m-tiles,
    // each K / 16 k16 steps of three split products; the rest of the intra-chunk terms fp32.
    const double mt = std::ceil(cc / 16), items = nt * mt * (mt + 1);
    const double scores_tc = items * (D + dv) / 16 * 3 * (2 * 16 * 8 * 16);
    // The intra-chunk products (IntraChunkTerms: dq's B Phi_k, dkv's B^T Phi_q and A^T G) on
    // mma: per chunk ks = mt (mt + 1) / 2 (m-tile, k16 step) pairs that can hold kept
    // entries, each Wd / 8 n-tiles of three split terms (Wd: D in dq, D + dv in dkv).
    const double ks = mt * (mt + 1) / 2;
    const double intra_tc = nt * ks * (dq ? D : D + dv) / 8 * 3 * (2 * 16 * 8 * 16);
    // On CUDA cores: dq's den row sums (nrm), dkv's + r_i on B.
    const double intra = tri_all * (dq ? norm : 1) + intra_tc;
    const double updates = nt - live_ranges;  // every chunk but each range's last
    const double update = 2 * N * D * (dv + 1) * updates / nt;
    const double inter = (dq ? 2 * N * D * dv + 2 * N * D * (dv + 1) : 4 * N * D * dv) + update;
    const double terms = dq ? 3 * 2 * N * D * dv + 3 * 2 * N * D * (dv + 1) + (fp16 ? 3 : 2) * update
                            : (fp16 ? 3 : 2) * 2 * N * D * dv + 3 * 2 * N * D * dv + 3 * update;
    const double J = dq ? Jq : Jk;
    k.flops = BH * (N * (Fq + Fk + grad_row + (dq ? den_row + D * norm : D) + J) + intra + scores_tc + inter);
    sp.scores_tc = BH * (scores_tc + intra_tc);
    sp.fm = BH * N * (Fq + Fk + (jt_tc ? 0 : J));
    sp.jt_tc = jt_tc ? BH * N * (dq ? JQ : JK).tc_flops : 0;
    sp.jt_wave = jt_tc ? BH * N * (dq ? JQ : JK).wavefronts + BH * nt * jacobian_per_tile(s, cc, c.warps()) : 0;
    sp.product = BH * inter;
    sp.tc_terms = terms / inter;
    // The shared wavefronts of the intra-chunk terms as the code issues them
    // (FLOP-equivalents, 1 wavefront per 32; checked against the emulator's
    // bank profile, `lunajit report --bank-profile`). The scores' fragments
    // come from the fp32 tiles as 64-bit pairs, 6 loads per item and k16
    // step (4 of the A operand, phi(q) or G, 2 of the B operand, phi(k) or
    // V): 2 wavefronts each from phi's tiles where their rows are padded
    // (backward_phi_stride: D + 8 floats apart; causal_dkv keeps phi(q)'s at
    // D, registers), else 8 (a fragment's rows at the D-float stride share
    // banks); 2 from G's and V's (backward_value_stride: dv + 8 floats apart),
    // and 2 pair stores per item and score tile (2 wavefronts in causal_dq,
    // rows C + 8 floats apart; 4 in causal_dkv, C + 4: CausalRangeBlock::CS),
    // the den row sums' reads (dq, 4-way at C + 8). The intra-chunk products (IntraChunkTerms)
    // per (m-tile, k16 step): each of the wn warps sharing the m-tile loads its
    // A fragment from a scores tile (dq: 4 pair loads, 2 wavefronts each; dkv's
    // transposed reads: 8 scalar loads, conflict-free at CS), and each n-tile
    // its B fragment, 4 scalar k-pair loads of one column: 2 wavefronts at a
    // row stride 8 mod 32 floats (padded phi, G), 4 at D (causal_dkv's phi(q)).
    const bool padded = backward_phi_stride(s, c) > D;
    const double wk = padded ? 2 : 8, wq = padded && dq ? 2 : 8;
    const double wv = backward_value_stride(s, c) > dv ? 2 : 8;
    const double scores_wave = items * (D / 16 * (4 * wq + 2 * wk) + dv / 16 * 6 * wv + 2 * 2 * (dq ? 2 : 4));
    const auto warps_n = [&](int width) {
      return double(mma_warp_tiling(KernelKind::output, s.feature_dim(), width, int(cc), c.warps()).warps_n);
    };
    const double yq = padded ? 2 : 4, yv = backward_value_stride(s, c) > dv ? 2 : 4;
    const double intra_wave =
        nt * ks *
        (dq ? warps_n(s.feature_dim()) * 4 * 2 + D / 8 * 4 * yq
            : warps_n(s.feature_dim()) * 8 + D / 8 * 4 * 4 + warps_n(s.value_dim) * 8 + dv / 8 * 4 * yv);
    const double intra_issued = 32 * (scores_wave + intra_wave) + (dq ? 4 * tri_all * norm : 0);
    // Per update: the fp32 state's 64-bit read-modify-write (2), the restaging's
    // read of S and its hi + lo writes (2; its block max comes from the update's
    // own values, write_state_partial), dq's add into the range's dS (2).
    sp.fp32_tiles = BH * (intra_issued + updates * (dq ? 6 : 4) * D * dv);
    sp.sfu = BH * N * (2 * sfu_row + jsfu + norm * (dv + 1));
    k.serial_steps = per_range;
  } else if (role == "causal_dq" || role == "causal_dkv") {
    const bool dq = role == "causal_dq";
    k.bytes = BH * N * ((dq ? 3 * d + 2 * dv : 3 * d + 3 * dv) + o_row) * e + norm * 8 * BH * N + params +
              stab_read + (learned ? 4 * P * BH : 0);
    // Per chunk of cc tokens: see the header. Returns {all, phi, conflicted tiles}.
    auto chunk_flops = [&](double cc, Split& acc) {
      const double tri = cc * (cc + 1) / 2;
      double f = cc * (Fq + Fk) + tri * 2 * D + tri * (2 * dv + 1) + cc * grad_row + 2 * D * dv * cc;
      double fm = cc * (Fq + Fk);
      if (dq) {
        f += cc * den_row + norm * tri + cc * D * (2 * dv + norm) + 2 * D * tri + D * cc + cc * Jq;
        fm += cc * Jq;
      } else {
        f += cc * D * 2 * dv + 2 * D * tri + cc * dv * 2 * D + 2 * dv * tri + 2 * D * cc + cc * Jk;
        fm += cc * Jk;
      }
      acc.fm += fm;
      acc.conflicted += 4 * D * tri;  // A and dphi on the 256-byte-stride tiles
      acc.product += f - fm - cc * grad_row;
      acc.sfu += cc * (2 * sfu_row + jsfu + norm * (dv + 1));
      return f;
    };
    const double C = c.chunk(), full = std::floor(N / C), rest = N - full * C;
    Split one, tail;
    const double f_full = chunk_flops(C, one), f_rest = rest > 0 ? chunk_flops(rest, tail) : 0;
    k.flops = BH * (full * f_full + f_rest);
    sp.fm = BH * (full * one.fm + tail.fm);
    sp.product = BH * (full * one.product + tail.product);
    sp.conflicted = BH * (full * one.conflicted + tail.conflicted);
    sp.sfu = BH * (full * one.sfu + tail.sfu);
    k.serial_steps = ceil_div(N, C);
  } else {  // param_reduce, param_sum
    if (!learned) return Error::invalid(fmt::format("{}: this feature map learns no parameters", role));
    const double slots = 2 * BH * (tiles ? splits : s.causal ? 1 : nt);
    const int warps = c.threads() / 32;
    const double groups = double(param_reduce_groups(static_cast<long long>(slots / Hp), warps));
    if (role == "param_reduce") {
      k.bytes = 4 * P * slots + 4 * P * Hp * groups;  // slots read, one sum per group written
      k.flops = P * slots;
      // Each warp's range, kParamLoads (8) loads in flight: one DRAM round trip per 8 slots.
      k.serial_steps = std::ceil(slots / (Hp * groups * warps) / 8);
    } else {
      k.bytes = 4 * P * Hp * groups + 4 * P * Hp;  // group sums read, dparams written
      k.flops = P * Hp * groups;
      k.serial_steps = std::ceil(groups / warps / 8);
    }
  }
  // phi on tensor cores (fp32-level, split) implies the J^T on them too
  // (MmaPhiSupport is stricter than MmaJacobianSupport), so sp.fm holds phi only.
  const bool tc_phi = feature_map_on_tensor_cores(s, c, Pass::backward) && jt_tc;
  finish(k, sp, s, tensor, sp.fm, Fq, tc_phi, /*split_phi=*/true);
  if (tensor) k.tc_dtype = DType::bf16;  // the backward's operands are bf16 hi + lo splits for fp16 I/O too
  return k;
}

}  // namespace

bool uses_tensor_cores(const AttentionSpec& spec, const TileConfig& config, Pass pass) {
  // TileConfig::mma: the forward's GEMM-shaped products of a bf16/fp16 spec on
  // mma.sync (templates/lunajit/linear_attention_mma.cuh): the non-causal state
  // and output products, and the causal chunk's masked strip, inter-chunk and
  // state-update products (not the causal performer, which has no mma kernel);
  // LUNA's feature map too where feature_map_on_tensor_cores says so, every
  // other feature map stays on CUDA cores. The backward: the non-causal bf16
  // and fp16 one (bf16 operands) (templates/lunajit/linear_attention_backward_mma.cuh: the state pass
  // as the forward's, and the dstate, dq and dkv products; LUNA's neural map
  // and its J^T move to mma, feature_map_on_tensor_cores and
  // jacobian_on_tensor_cores, other maps stay on CUDA cores); the causal backward (not the performer's) is
  // walks super-chunk ranges with the same inter-chunk products and fp32 intra-chunk terms.
  if (!config.mma() || spec.dtype == DType::fp32) return false;
  if (pass == Pass::backward) return !(spec.causal && spec.family == Family::performer);
  return pass == Pass::forward && !(spec.causal && spec.family == Family::performer);
}

bool feature_map_on_tensor_cores(const AttentionSpec& spec, const TileConfig& config, Pass pass) {
  const LunaOptions& o = spec.luna;
  // MmaPhiSupport (feature_map_mma.cuh). The backward's kernels (its state pass
  // included) map phi to fp32 level there (mma_phi_split_tile).
  return uses_tensor_cores(spec, config, pass) && spec.dtype == DType::bf16 && spec.family == Family::luna &&
         o.variant == LunaVariant::neural && o.shared_channels && spec.head_dim % 16 == 0 && o.mlp_width % 16 == 0 &&
         o.channels % 8 == 0 && spec.head_dim + 8 <= 2 * spec.feature_dim();
}

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

Result<KernelCounts> kernel_counts(const AttentionSpec& s, const TileConfig& c, Pass pass, std::string_view role,
                                   const ProblemShape& shape) {
  if (auto st = validate(shape); !st) return st.error();
  const bool backward_role = role == "dstate" || role == "dq" || role == "dkv" || role == "causal_dq" ||
                             role == "causal_dkv" || role == "param_reduce" || role == "param_sum" || role == "state_scan" ||
                             role == "dstate_scan" || role == "dstate_reduce";
  const bool forward_only_role = role == "feature_map" || role == "output" || role == "causal_chunk";
  if (backward_role && pass != Pass::backward)
    return Error::invalid(fmt::format("{}: a backward kernel (pass = backward)", role));
  if (forward_only_role && pass == Pass::backward)
    return Error::invalid(fmt::format("backward {}: the backward pass has no such kernel", role));
  const bool tensor = uses_tensor_cores(s, c, pass);
  if (backward_role) return backward_counts(s, c, role, shape, tensor);
  const double BH = double(shape.batch) * shape.heads, N = shape.seq;
  const double d = s.head_dim, dv = s.value_dim, D = s.feature_dim(), e = dtype_bytes(s.dtype);
  const double nd = ceil_div(dv, c.dv_block()), splits = c.state_splits();
  const double params = 4.0 * param_layout(s).per_head_floats * (s.params_per_head ? shape.heads : 1);
  const bool performer = s.family == Family::performer;
  const double stab_read = performer ? 4 * BH : 0;
  const double Fq = feature_map_flops_per_token(s, true), Fk = feature_map_flops_per_token(s, false);
  const double sfu_row = feature_map_sfu_per_token(s);
  const double norm = s.normalize ? 1 : 0;
  const double partials = 4 * BH * splits * (D * dv + D);
  const double state_read = 4 * BH * (D * dv + D);  // partial 0 (the reduced state when splits > 1)
  KernelCounts k;
  k.role = std::string(role);
  Split sp;
  if (role == "feature_map") {
    k.bytes = BH * N * d * e + 4 * BH * N * D + params + stab_read;
    k.flops = BH * N * Fk;
    sp.fm = k.flops;
    sp.sfu = BH * N * sfu_row;
  } else if (role == "key_stab") {
    if (!performer) return Error::invalid("key_stab: only performer has a key stabiliser kernel");
    k.bytes = BH * N * d * e + 4 * BH + params;
    k.flops = BH * N * (performer_log_flops(s) + D);
    sp.fm = k.flops;
  } else if (role == "state_reduce") {
    // One thread per entry of (S, z): the partials read, their sum written
    // over partial 0 (splits > 1). The non-causal backward on tensor cores
    // (backward_state_staged) runs it with one split too, and stages S as
    // bf16 hi + lo words (2 + 2 bytes an entry; 4 FLOPs: scale, round,
    // subtract, round).
    const bool staged = backward_state_staged(s, c, pass);
    k.bytes = (splits > 1 ? partials + state_read : state_read) + (staged ? 4 * BH * D * dv : 0);
    k.flops = BH * splits * (D * dv + D) + (staged ? 4 * BH * D * dv : 0);
  } else if (role == "state") {
    k.bytes = BH * N * (d + dv) * e + partials + params + stab_read;
    k.flops = nd * BH * N * Fk + 2 * BH * N * D * dv + BH * N * D;
    sp.fm = nd * BH * N * Fk;
    sp.product = k.flops - sp.fm;
    sp.sfu = nd * BH * N * sfu_row;
    // mma: phi split into bf16 hi + lo (kSplitPhi); fp16 V split too (+ Phi_hi^T V_lo).
    if (pass == Pass::backward) sp.tc_terms = s.dtype == DType::fp16 ? 3 : 2;
    // mma: the forward's K and V stream through a two-stage cp.async pipeline (mma_state_pipelined).
    if (tensor && mma_state_pipelined(d, pass == Pass::backward)) k.pipeline_stages = 2;
  } else if (role == "output") {
    k.bytes = BH * N * (d + dv) * e + state_read + params;
    k.flops = nd * BH * N * Fq + 2 * BH * N * D * dv;
    if (s.normalize) k.flops += nd * BH * N * (2 * D + 1) + BH * N * dv;
    sp.fm = nd * BH * N * Fq;
    sp.product = 2 * BH * N * D * dv + norm * nd * BH * N * (2 * D + 1);
    sp.sfu = nd * BH * N * sfu_row + norm * BH * N * dv;
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
    double per_head = nd * N * (Fq + Fk), masked = 0;
    for (double b = 0; b < nd; ++b) {
      const double w = std::min<double>(c.dv_block(), dv - b * c.dv_block());
      per_head += full * chunk_flops(C, w) + (rest > 0 ? chunk_flops(rest, w) : 0);
      masked += full * C * (C + 1) * D + (rest > 0 ? rest * (rest + 1) * D : 0);
    }
    k.flops = BH * per_head;
    sp.fm = BH * nd * N * (Fq + Fk);
    sp.product = k.flops - sp.fm - norm * BH * N * dv;
    sp.conflicted = BH * masked;
    sp.sfu = BH * nd * N * 2 * sfu_row + norm * BH * N * dv;
    k.serial_steps = ceil_div(N, C);
    // mma: the next chunk's Q, K, V rows are copied with cp.async during the
    // chunk's products (mma_causal_pipelined).
    if (tensor && mma_causal_pipelined(d)) k.pipeline_stages = 2;
    if (causal_super_chunks(s, c, pass)) {
      // Ranges of ceil(chunks / R) chunks walked side by side; block r first
      // reads the r earlier ranges' partial states.
      const double R = c.state_splits();
      k.serial_steps = std::ceil(ceil_div(N, C) / R);
      k.bytes += nd * BH * R * (R - 1) / 2 * 4 * (D * std::min<double>(c.dv_block(), dv) + D);
    }
  } else {
    return Error::invalid(fmt::format("kernel = {}: no cost formula (known: feature_map, key_stab, state, output, "
                                      "causal_chunk, state_reduce, dstate, dstate_reduce, dq, dkv, causal_dq, "
                                      "causal_dkv, state_scan, dstate_scan, param_reduce, param_sum)",
                                      role));
  }
  const bool tc_phi = role != "feature_map" && role != "key_stab" && feature_map_on_tensor_cores(s, c, pass);
  finish(k, sp, s, tensor, sp.fm, Fq, tc_phi, /*split_phi=*/pass == Pass::backward);
  if (tensor && pass == Pass::backward) k.tc_dtype = DType::bf16;  // the split state pass: bf16 operands
  return k;
}

Result<std::vector<KernelCounts>> pass_counts(const AttentionSpec& spec, const TileConfig& config, Pass pass,
                                              const ProblemShape& shape, int splits) {
  auto plan = plan_launches(spec, config, pass, shape, splits);
  if (!plan) return plan.error();
  // The kernels run with the plan's split count: counted as compiled with it.
  const TileConfig run = config.with_state_splits(plan->splits);
  std::vector<KernelCounts> out;
  for (const KernelLaunch& l : plan->launches) {
    auto k = kernel_counts(spec, run, pass, l.role, shape);
    if (!k) return k.error();
    k->blocks = double(l.grid[0]) * l.grid[1] * l.grid[2];
    k->threads = int(l.threads);
    k->dynamic_smem = l.smem_bytes;
    out.push_back(std::move(*k));
  }
  return out;
}

double KernelPrediction::limb_ms() const { return std::max({dram_ms, tensor_ms, fp32_ms, shared_ms, sfu_ms}); }

KernelPrediction predict_kernel(const KernelCounts& k, const GpuSpec& gpu, const Arch& arch,
                                const std::optional<KernelUsage>& usage) {
  KernelPrediction p;
  p.role = k.role;
  const double clock_hz = gpu.boost_mhz * 1e6, sms = gpu.sm_count;
  p.dram_ms = k.bytes / (gpu.memory_gbps * 1e9) * 1e3;
  const double tc_peak = tensor_peak_tflops(gpu, k.tc_dtype);
  p.tensor_ms = k.tc_flops > 0 ? k.tc_flops / (tc_peak * 1e12) * 1e3 : 0;
  p.fp32_ms = k.cuda_flops / (scalar_peak_tflops(gpu) * 1e12) * 1e3;
  p.shared_ms = k.smem_wavefronts / (sms * kSharedWavefrontsPerClockPerSm * clock_hz) * 1e3;
  p.sfu_ms = k.sfu_ops / (sms * kSfuOpsPerClockPerSm * clock_hz) * 1e3;

  p.registers_known = usage.has_value() && usage->registers > 0;
  const int regs = p.registers_known ? usage->registers : kAssumedRegisters;
  const Occupancy occ =
      theoretical_occupancy(arch, {k.threads, regs, usage ? int64_t(usage->static_smem) : 0, k.dynamic_smem});
  const int bps = std::max(1, occ.blocks_per_sm);
  p.blocks_per_sm = occ.blocks_per_sm;
  const double blocks = std::max(1.0, k.blocks);
  const double fill = std::min(1.0, blocks / sms);
  const double resident = std::min<double>(bps, std::ceil(blocks / sms));
  const double warps = resident * ((k.threads + 31) / 32);
  // A kernel whose loads run pipeline_stages tiles ahead (cp.async) keeps that
  // many tiles' loads in flight per warp: counted as that many warps.
  const double hiding = std::min(1.0, warps * std::max(1, k.pipeline_stages) / kWarpsToHideLatency);
  const double slots = sms * bps;
  const double waves = std::ceil(blocks / slots);
  const double wave_eff = waves > 1 ? blocks / (waves * slots) : 1.0;
  p.efficiency = fill * hiding * wave_eff;
  // A block of a later wave starts its chain when a block of the wave before
  // it ends: the chains of the waves add up.
  p.serial_ms = waves * k.serial_steps * kSerialStepLatencyCycles / clock_hz /
                (std::max(1, k.pipeline_stages) * std::max(1.0, resident)) * 1e3;
  const double busy = p.limb_ms() / std::max(p.efficiency, 1e-6);
  p.ms = busy + p.serial_ms + kLaunchOverheadMs;
  struct Limb { double ms; const char* name; };
  const Limb limbs[] = {{p.dram_ms, "dram"}, {p.tensor_ms, "tensor"}, {p.fp32_ms, "fp32"},
                        {p.shared_ms, "shared"}, {p.sfu_ms, "sfu"}};
  const Limb* top = &limbs[0];
  for (const Limb& l : limbs)
    if (l.ms > top->ms) top = &l;
  p.limiter = p.serial_ms > busy ? "latency" : top->name;
  return p;
}

namespace {
Result<PassPrediction> predict_at(const AttentionSpec& spec, const TileConfig& config, Pass pass,
                                  const ProblemShape& shape, const GpuSpec& gpu, const Arch& arch,
                                  const std::map<std::string, KernelUsage>& usage, int splits) {
  auto counts = pass_counts(spec, config, pass, shape, splits);
  if (!counts) return counts.error();
  PassPrediction out;
  out.splits = splits;
  for (const KernelCounts& k : *counts) {
    auto it = usage.find(k.role);
    out.kernels.push_back(predict_kernel(k, gpu, arch, it != usage.end() ? std::optional(it->second) : std::nullopt));
    out.ms += out.kernels.back().ms;
  }
  out.counts = std::move(*counts);
  return out;
}
}  // namespace

int best_splits(const AttentionSpec& spec, const TileConfig& config, Pass pass, const ProblemShape& shape,
                const GpuSpec& gpu, const Arch& arch, const std::map<std::string, KernelUsage>& usage) {
  const int top = config.state_splits();
  if (!reads_runtime_splits(spec, config, pass)) return top;
  int best = top;
  double best_ms = 0;
  for (int s = 1; s <= top; ++s) {
    auto p = predict_at(spec, config, pass, shape, gpu, arch, usage, s);
    if (!p) return top;  // the plan itself is invalid: predict_pass reports it
    if (s == 1 || p->ms < best_ms) {
      best = s;
      best_ms = p->ms;
    }
  }
  return best;
}

Result<PassPrediction> predict_pass(const AttentionSpec& spec, const TileConfig& config, Pass pass,
                                    const ProblemShape& shape, const GpuSpec& gpu, const Arch& arch,
                                    const std::map<std::string, KernelUsage>& usage) {
  return predict_at(spec, config, pass, shape, gpu, arch, usage,
                    best_splits(spec, config, pass, shape, gpu, arch, usage));
}

}  // namespace lunajit
