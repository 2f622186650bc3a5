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
// "causal_chunk") for one launch at `shape`; Error for a kernel the cost model
// has no formula for (the backward's, so far).
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
