// Static cost model: ranks tile configs without a GPU ("model-ranked" in the
// tuning database). It predicts each kernel of a pass's launch plan from its
// bytes and FLOPs against the arch's representative product
// (codegen/gpu_specs.h: DRAM bandwidth, FP32 peak; the kernels use no tensor
// cores yet) and discounts it for how much of the GPU the launch occupies:
//
//   t_kernel = max(bytes / BW, flops / peak) / (sm_fill * latency_hiding * wave_efficiency) + 3 us
//     blocks per SM    from threads, registers (ptxas, when compiled) and shared
//                      memory against codegen/arch.h limits (occupancy calculator rules)
//     sm_fill          = min(1, grid blocks / SM count)
//     latency_hiding   = min(1, resident warps per SM / 16): 16 warps (a quarter
//                      of sm_90's 64) keep FP32 pipes and DRAM busy in practice
//     wave_efficiency  = blocks / (waves * SMs * blocks per SM) when the grid
//                      needs more than one wave (the idle tail of the last wave)
//
// Bytes are compulsory traffic plus the work the config repeats (phi recomputed
// and q/k re-read by each of the ceil(dv / dv_block) blocks along dv, split
// partials written and read back); FLOPs count phi per token (LUNA:
// 2dM + M(2Hm + 2HmL), docs/ARCHITECTURE.md "Cost model"), the state and
// output products, and for causal the intra-chunk masked products. The
// report's model (report/) counts the same quantities per kernel in more
// detail for display; this one only needs to order candidates.
//
// Worked example (H100 SXM model, luna default bf16, batch 4 x heads 8, seq
// 4096, non-causal T64.w4.dv64.s4): phi ~20 KFLOP per token-head for q and k
// dominates: 2 * 131072 rows * 20.5 KFLOP = 5.4 GFLOP at 67 TFLOP/s = 80 us,
// against 4 MiB of q, k, v, o at 3.35 TB/s = 1.3 us: compute bound, so
// dv_block = 64 (phi once per token) ranks first.
#pragma once

#include <map>
#include <string>

#include "codegen/gpu_specs.h"
#include "codegen/launch_plan.h"

namespace lunajit {

// What ptxas reported for a kernel (by role); empty when not compiled.
struct KernelUsage {
  int registers = 0;
  int static_smem = 0;
};

struct KernelEstimate {
  std::string role;
  double bytes = 0, flops = 0;
  double blocks = 0;
  int blocks_per_sm = 0;
  double efficiency = 1;  // sm_fill * latency_hiding * wave_efficiency
  double ms = 0;
};

struct CostEstimate {
  double ms = 0;  // sum over the pass's kernels
  std::vector<KernelEstimate> kernels;
};

// FLOPs of phi for one token of one head.
double feature_map_flops(const AttentionSpec& spec);

// The predicted time of the pass at `shape` on `gpu` (whose limits are `arch`);
// `usage` maps roles to ptxas resources (missing: 64 registers assumed).
Result<CostEstimate> estimate_cost(const AttentionSpec& spec, const TileConfig& config, Pass pass,
                                   const ProblemShape& shape, const GpuSpec& gpu, const Arch& arch,
                                   const std::map<std::string, KernelUsage>& usage = {});

}  // namespace lunajit
