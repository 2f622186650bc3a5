// KernelCost: bytes moved and FLOPs of every generated kernel, counted from the
// spec, the tile config and the problem shape, and the roofline time they imply
// on a GPU product. Pure functions, no compilation, no device.
//
// Counting conventions (docs/MATH.md, docs/ARCHITECTURE.md "Cost model" and
// "Kernel plan"; the kernels are templates/lunajit/linear_attention.cuh):
//
//   Notation: B batch, H heads, N seq, BH = B*H, d head_dim, dv value_dim,
//   D feature dim, e = dtype bytes (fp32 4, fp16/bf16 2), nd = ceil(dv / dv_block)
//   (blocks along dv), s = state_splits, T = block_tokens, nt = ceil(N / T),
//   P = parameter floats of one head's block (codegen/feature_params.h),
//   Hp = H when params_per_head else 1.
//
//   Bytes are compulsory DRAM traffic: every input tensor read once, every
//   output written once, workspace written once and read once, parameters read
//   once (4 * P * Hp). Re-reads of the same bytes by other blocks (K re-read
//   by each of the nd dv blocks, S re-read by every query tile) are assumed to
//   hit in L2 and are not counted, which is what "minimum traffic" in the
//   kernel plan means.
//
//   FLOPs are the arithmetic the kernels as written execute: an FMA counts 2,
//   every other add, multiply, compare, max or special-function evaluation
//   (exp, sin, erf, rsqrt, ...) counts 1; index arithmetic is not counted.
//   Work a kernel repeats (phi recomputed in each of the nd dv blocks) is
//   counted as often as it is done.
//
//   Feature map per token, F(x) (the cost of phi for one row; see
//   feature_map_flops_per_token for every family). LUNA neural, shared channels:
//       F = 2dM (projections u = W x) + M(2Hm + Hm + 2 Hm L + L) (1 -> Hm -> L MLP:
//           W1 u + b1 by FMA, activation, W2 by FMA, output activation) + ML (gate)
//     = 2dM + M(2Hm + 2Hm L) + M Hm + 2ML; the first two terms are the
//     ARCHITECTURE.md estimate, the rest are the element-wise ops it leaves out.
//     At d = 64, M = L = Hm/8 = 8: 1024 + 9216 + 512 + 128 = 10880.
//
//   Other families (per token): performer keys 2d + 3 + D(2d + 2) + 4D, queries
//   D more (their own max); rff m(2d + 4); elu 2d; relu d; t2r D(2d + 2);
//   hedgehog f(2d + 11) + 2; cosformer 7d; slay 2d + 2 + P(2d + 3) + RM(2d + 7)
//   + 3D. LUNA per-channel MLPs: 2dM + ML(Hm(4 + a) + o) + ML; bank_coef and
//   the rff variant, and the envelope (+ 2d + 5), in feature_map_flops_per_token.
//   Activations a: relu 1, gelu 5, silu 4, tanh 1; output o: relu 1, softplus 3.
//
//   Per kernel (Fq = F for queries, Fk = F for keys; they differ only for performer):
//   feature_map   bytes = BH N d e (x) + 4 BH N D (phi, fp32) + 4 P Hp [+ 4 BH key_stab read]
//                 flops = BH N Fk
//   key_stab      bytes = BH N d e + 4 BH + 4 P Hp
//                 flops = BH N (2d + 3 + D(2d + 2)) + BH N D (max)   (performer only)
//   state         bytes = BH N (d + dv) e + 4 BH s (D dv + D) + 4 P Hp
//                 flops = nd BH N Fk + 2 BH N D dv (S) + BH N D (z)
//   output        bytes = BH N d e + BH N dv e + 4 BH s (D dv + D) + 4 P Hp
//                 flops = nd BH N Fq + 2 BH N D dv (numerator)
//                         + normalize: nd BH N (2D + 1) (den) + BH N dv (divide)
//                         + nt BH s (D dv + nd D) (split partials summed per query tile)
//   causal_chunk  bytes = BH N (2d + 2dv) e + 4 P Hp   (q, k, v read, o written)
//                 flops = nd BH N (Fq + Fk)
//                         + per chunk of c tokens and dv block of w columns:
//                           c(c+1)/2 * 2D (masked A) + w (c(c+1) + 2Dc) (A V + phi_q S)
//                           + 2 D w c (S update) + D c (z update)
//                           + normalize: c(2D + 1) + c(c+1)/2 (den) + w c (divide)
//   (performer adds 4 BH bytes of key stabiliser read to state, causal_chunk and
//   feature_map, and its key_stab kernel runs first in the forward pass.)
//
//   Backward (templates/lunajit/linear_attention_backward.cuh, feature_map_backward.cuh;
//   grids in codegen/launch_plan.cpp). Further notation: nt (above) is also the
//   number of query or key tiles (non-causal), Pl = P when the family learns parameters
//   (has_learned_params) else 0, nrm = 1 when normalize else 0, J = the Jacobian-
//   transpose product dx = J_phi^T dphi of one row plus its parameter partial,
//   Jq for a query row, Jk for a key row. A dot product of length n counts 2n.
//   The backward works on whole value rows (no dv blocks) except its state pass.
//   Per token of the queries' side, when normalized:
//     den row  nrm (2D + 1)      phi(q) . z + eps
//     grad row nrm (3 dv + 2)    r = -(dO . o) / den (dot, negate, divide), g = dO / den
//   Workspace traffic: the (S, z) partials are written by state, their z part read
//   by dstate, all of them read by dq; the (dS, dz) partials written by dstate,
//   read by dkv; den (causal, normalized: 4 BH N) written by causal_dq, read by
//   causal_dkv; one parameter slot of 4 P bytes per block that maps dphi back
//   (dq, dkv: BH nt each; causal_dq, causal_dkv: BH each), written there and read
//   by param_reduce. Every kernel reads each of its inputs once (q, k, v, o, dout);
//   dq, dk, dv are written once.
//   key_stab      as the forward (performer only)
//   state         as the forward (the backward's state pass is the forward's, grid with nd)
//   dstate        bytes = BH N (d + 2dv) e (q, dout, o) + 4 BH s D (z partials) + 4 BH s (D dv + D)
//                         (dS, dz partials written) + 4 P Hp
//                 flops = BH s^2 D (each of the s blocks sums the s z partials)
//                         + BH N (Fq + den row + grad row) + 2 BH N D dv (dS) + 2 BH N D (dz)
//   dq            bytes = BH N (2d + 2dv) e (q, dout, o read, dq written) + 4 BH s (D dv + D)
//                         + 4 P Hp + 4 Pl BH nt (slots)
//                 flops = nt BH s (D dv + D) (split partials summed per tile)
//                         + BH N (Fq + den row + grad row + D (2dv + nrm) (dphi = S g + z r) + Jq)
//   dkv           bytes = BH N (2d + 2dv) e (k, v read, dk, dv written) + 4 BH s (D dv + D)
//                         + 4 P Hp + 4 Pl BH nt [+ 4 BH key_stab read]
//                 flops = nt BH s (D dv + D) + BH N (Fk + 2 D dv (dphi = dS v + dz)
//                         + 2 D dv (dv = dS^T phi(k)) + Jk)
//   causal_dq     bytes = BH N (3d + 3dv) e (q, k, v, dout, o read, dq written) + nrm 4 BH N (den
//                         written) + 4 P Hp + 4 Pl BH [+ 4 BH key_stab read]
//                 flops = BH * sum over chunks of c tokens (tri = c(c+1)/2, full dv):
//                           c (Fq + Fk) + tri 2D (A) + tri (2dv + 1) (B = v . g + r) + c (grad row)
//                           + c (den row) + nrm tri (den: sum of A) + c D (2dv + nrm) + 2D tri (dphi)
//                           + 2 D dv c (S update) + D c (z update) + c Jq
//   causal_dkv    bytes = BH N (3d + 4dv) e (q, k, v, dout, o read, dk, dv written) + nrm 4 BH N (den
//                         read) + 4 P Hp + 4 Pl BH [+ 4 BH key_stab read]
//                 flops = BH * sum over chunks:
//                           c (Fq + Fk) + tri 2D (A) + tri (2dv + 1) (B) + c (grad row)
//                           + c D 2dv + 2D tri (dphi) + c dv 2D + 2 dv tri (dv)
//                           + 2 D dv c (dS update) + 2 D c (dz update) + c Jk
//   param_reduce  (learned families only) with slots = 2 BH nt (non-causal) or 2 BH (causal):
//                 bytes = 4 P slots (read) + 4 P Hp (dparams written)
//                 flops = P slots (one add per slot entry)
//   ESTIMATE, not a count: J = 2F of the same row (Jq = 2 Fq, Jk = 2 Fk), the usual
//   "backward of a layer costs twice its forward" rule, for every family. Every
//   other backward term above counts the code as written; this one does not
//   (the true J^T cost differs per family: relu's is d compares per row, luna's
//   recomputes its MLP per projection for the parameter partials).
//
//   Roofline: t = max(bytes / BW, flops / peak) with BW the product's DRAM
//   bandwidth and peak its FP32 rate: these kernels use no tensor cores yet.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "codegen/attention_spec.h"
#include "codegen/gpu_specs.h"
#include "codegen/launch_plan.h"
#include "codegen/tile_config.h"

namespace lunajit::report {

struct KernelCost {
  double bytes = 0;  // compulsory DRAM traffic
  double flops = 0;
  double arithmetic_intensity() const { return bytes > 0 ? flops / bytes : 0; }
};

// FLOPs of phi for one token of one head (the conventions above), for a query
// row (is_query) or a key row; the two differ only for performer, whose
// queries take a max over their own features.
double feature_map_flops_per_token(const AttentionSpec& spec, bool is_query);

// Bytes and FLOPs of the kernel with `role` of `pass` (feature_map:
// "feature_map", "key_stab"; forward: "key_stab", "state", "output",
// "causal_chunk"; backward: "key_stab", "state", "dstate", "dq", "dkv",
// "causal_dq", "causal_dkv", "param_reduce") for one launch at `shape`; Error
// for a role the pass has no such kernel for (key_stab off performer,
// param_reduce for a family without learned parameters, an unknown role). The
// backward FLOPs include one estimated term, the feature map's J^T (above).
Result<KernelCost> kernel_cost(const AttentionSpec& spec, const TileConfig& config, Pass pass, std::string_view role,
                               const ProblemShape& shape);

struct RooflineTime {
  double memory_ms = 0;   // bytes / bandwidth
  double compute_ms = 0;  // flops / FP32 peak
  double time_ms = 0;     // the larger
  std::string bound;      // "memory" or "compute"
};

// The roofline time of `cost` on `gpu` (FP32 peak; no tensor cores).
RooflineTime roofline_time(const KernelCost& cost, const GpuSpec& gpu);

}  // namespace lunajit::report
