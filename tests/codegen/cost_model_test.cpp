// The cost model (codegen/cost_model.h): each limb, the launch efficiency and
// the serial-chain term against hand-computed cases on the H100 row of the
// GPU table (132 SMs, 3350 GB/s, FP32 67 TFLOP/s, BF16 tensor 989, TF32
// 494.7, 1980 MHz), and the new counts (wavefronts, SFU ops, serial steps) of
// the default LUNA spec by hand. The byte and FLOP counts themselves are
// checked by hand in tests/report/report_test.cpp (CostModel.*).
#include <algorithm>
#include <tuple>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "codegen/cost_model.h"
#include "codegen/feature_params.h"
#include "codegen/launch_plan.h"
#include "lunajit/layout.cuh"

namespace lunajit {
namespace {

const GpuSpec& h100() {
  const GpuSpec* g = find_gpu("h100");
  EXPECT_NE(g, nullptr);
  return *g;
}
const Arch& sm90() {
  static const Arch a = arch_from_sm(90).value_or_throw();
  return a;
}

// 128 threads at 64 registers: 8 blocks per SM (registers: 16384 / 2048 = 8
// warps per sub-partition, 32 warps = 8 blocks); 132 * 8 blocks fill one wave
// with 32 resident warps: efficiency 1.
KernelCounts full_gpu() {
  KernelCounts k;
  k.role = "test";
  k.blocks = 132 * 8;
  k.threads = 128;
  return k;
}
constexpr double kTol = 1e-9;  // relative: the arithmetic is a handful of doubles

TEST(CostModelPredict, EachLimbAtPeakOnAFullGpu) {
  const KernelUsage regs{64, 0};
  KernelCounts k = full_gpu();
  k.bytes = 3.35e9;       // 1 ms at 3350 GB/s
  k.cuda_flops = 6.7e9;   // 0.1 ms at 67 TFLOP/s
  KernelPrediction p = predict_kernel(k, h100(), sm90(), regs);
  EXPECT_EQ(p.blocks_per_sm, 8);
  EXPECT_NEAR(p.efficiency, 1.0, kTol);
  EXPECT_NEAR(p.dram_ms, 1.0, kTol);
  EXPECT_NEAR(p.fp32_ms, 0.1, kTol);
  EXPECT_NEAR(p.ms, 1.0 + kLaunchOverheadMs, kTol);
  EXPECT_EQ(p.limiter, "dram");

  k = full_gpu();
  k.smem_wavefronts = 132 * 1.98e9 * 1e-3 * 2;  // 2 ms at one wavefront per clock per SM
  k.sfu_ops = 16 * 132 * 1.98e9 * 1e-3;          // 1 ms at 16 per clock per SM
  p = predict_kernel(k, h100(), sm90(), regs);
  EXPECT_NEAR(p.shared_ms, 2.0, kTol);
  EXPECT_NEAR(p.sfu_ms, 1.0, kTol);
  EXPECT_EQ(p.limiter, "shared");

  k = full_gpu();
  k.tc_flops = 989e9;  // 1 ms of bf16 mma
  k.tc_dtype = DType::bf16;
  EXPECT_NEAR(predict_kernel(k, h100(), sm90(), regs).tensor_ms, 1.0, kTol);
  k.tc_dtype = DType::fp32;  // TF32 runs at half the rate
  p = predict_kernel(k, h100(), sm90(), regs);
  EXPECT_NEAR(p.tensor_ms, 989 / 494.7, kTol);
  EXPECT_EQ(p.limiter, "tensor");
}

TEST(CostModelPredict, UnderfilledGridAndUnhiddenLatency) {
  // 66 blocks of 4 warps: half the SMs (fill 0.5), one block each (4 warps of
  // the 16 that hide latency: 0.25); efficiency 0.125, so 1 ms of DRAM takes 8.
  KernelCounts k = full_gpu();
  k.blocks = 66;
  k.bytes = 3.35e9;
  KernelPrediction p = predict_kernel(k, h100(), sm90(), KernelUsage{64, 0});
  EXPECT_NEAR(p.efficiency, 0.125, kTol);
  EXPECT_NEAR(p.ms, 8.0 + kLaunchOverheadMs, 1e-9);
  // Two waves of 1056 slots for 1584 blocks: wave efficiency 1584 / 2112 = 0.75.
  k.blocks = 1584;
  EXPECT_NEAR(predict_kernel(k, h100(), sm90(), KernelUsage{64, 0}).efficiency, 0.75, kTol);
  // Registers decide occupancy: 255 registers -> 2 blocks of 4 warps per SM
  // (255 * 32 rounds to 8192 per warp; 16384 / 8192 = 2 warps per
  // sub-partition, 8 warps = 2 blocks): 1056 blocks in 4 full waves of 264,
  // 8 resident warps hide half the latency: efficiency 0.5.
  k.blocks = 132 * 8;
  p = predict_kernel(k, h100(), sm90(), KernelUsage{255, 0});
  EXPECT_EQ(p.blocks_per_sm, 2);
  EXPECT_TRUE(p.registers_known);
  EXPECT_NEAR(p.efficiency, 0.5, kTol);
}

TEST(CostModelPredict, SerialChunkWalkExposesOneRoundTripPerStep) {
  // The causal shape of issue 11: 96 blocks walking 256 chunks, one block per
  // SM, no prefetch: 256 * 600 cycles / 1.98 GHz = 77.58 us on top.
  KernelCounts k = full_gpu();
  k.blocks = 96;
  k.serial_steps = 256;
  const KernelPrediction p = predict_kernel(k, h100(), sm90());
  EXPECT_FALSE(p.registers_known);
  EXPECT_NEAR(p.serial_ms, 256 * 600 / 1.98e9 * 1e3, 1e-12);
  EXPECT_EQ(p.limiter, "latency");
  k.pipeline_stages = 2;  // a second load in flight halves it
  EXPECT_NEAR(predict_kernel(k, h100(), sm90()).serial_ms, p.serial_ms / 2, 1e-12);
}

TEST(CostModelCounts, DefaultLunaStateKernelByHand) {
  // Default LUNA (d = dv = 64, M = L = 8, Hm = 64, relu/relu, bf16), config
  // T64.w4.dv64.C64.s4, shape 1 x 1 x 64: F = 10880 per token.
  //   phi: 64 * 10880 = 696320 FLOPs; its L1 wavefronts per token:
  //     projections 2dM = 1024 FLOPs at min(M, 32) = 8 lines, the MLP's
  //     9856 FLOPs broadcast: (512 * 8 + 4928) / 32 = 282; * 64 = 18048
  //   products: S = phi^T v 2 * 64 * 64 * 64 = 524288, z 64 * 64 = 4096:
  //     528384 / 32 = 16512 wavefronts
  //   SFU: relu and relu: none. Not a serial kernel.
  const AttentionSpec s = default_spec(Family::luna);
  const TileConfig c(64, 4, 64, 64, 4);
  auto k = kernel_counts(s, c, Pass::forward, "state", {1, 1, 64}).value_or_throw();
  EXPECT_EQ(k.flops, 696320 + 528384);
  EXPECT_EQ(k.tc_flops, 0);  // the scalar kernel (mma off)
  EXPECT_EQ(k.cuda_flops, k.flops);
  EXPECT_DOUBLE_EQ(k.smem_wavefronts, 18048 + 16512);
  EXPECT_EQ(k.sfu_ops, 0);
  EXPECT_EQ(k.serial_steps, 0);

  // silu in the MLP: ex2 and rcp per hidden unit, M * Hm * 2 = 1024 per token.
  AttentionSpec silu = s;
  silu.luna.activation = Activation::silu;
  EXPECT_EQ(kernel_counts(silu, c, Pass::forward, "state", {1, 1, 64}).value_or_throw().sfu_ops, 64 * 1024);
}

TEST(CostModelCounts, MmaStateKernelMovesItsProductsToTensorCores) {
  // The same state kernel with TileConfig::mma, fp16 (phi stays on CUDA
  // cores): the 528384 product FLOPs on tensor cores, phi's 696320 on CUDA
  // cores; the products' shared traffic is 2 bytes * (32 + 32) / (2 * 32 * 32)
  // per FLOP in 128-byte wavefronts: 528384 / 2048 = 258, phi's 18048 unchanged.
  AttentionSpec s16 = default_spec(Family::luna);
  s16.dtype = DType::fp16;
  const TileConfig c = TileConfig(64, 4, 64, 64, 4).with_mma(true);
  auto k = kernel_counts(s16, c, Pass::forward, "state", {1, 1, 64}).value_or_throw();
  EXPECT_EQ(k.tc_flops, 528384);
  EXPECT_EQ(k.tc_dtype, DType::fp16);
  EXPECT_EQ(k.cuda_flops, 696320);
  EXPECT_DOUBLE_EQ(k.smem_wavefronts, 18048 + 258);
  EXPECT_FALSE(feature_map_on_tensor_cores(s16, c, Pass::forward));
  // bf16: LUNA's phi on tensor cores too (feature_map_mma.cuh). Per row of
  // phi (F = 10880): the projection with W split in two, 2 * 2 * 64 * 8 = 2048,
  // and psi = H W2^T, 2 * 8 * 64 * 8 = 8192, on mma (replacing 1024 + 8192 of
  // F); 10880 - 9216 = 1664 on CUDA cores; wavefronts 8 * 64 / 32 (W1, b1)
  // + 2 * 64 / 64 (x copy and its ldmatrix) + 64 / 64 (phi's stores) = 19.
  const AttentionSpec s = default_spec(Family::luna);
  ASSERT_EQ(s.dtype, DType::bf16);
  EXPECT_TRUE(feature_map_on_tensor_cores(s, c, Pass::forward));
  k = kernel_counts(s, c, Pass::forward, "state", {1, 1, 64}).value_or_throw();
  EXPECT_EQ(k.tc_flops, 528384 + 64 * (2048 + 8192));
  EXPECT_EQ(k.tc_dtype, DType::bf16);
  EXPECT_EQ(k.cuda_flops, 64 * 1664);
  EXPECT_EQ(k.flops, k.tc_flops + k.cuda_flops);
  EXPECT_DOUBLE_EQ(k.smem_wavefronts, 64 * 19 + 258);
  // The backward maps phi on tensor cores too (to fp32 level, MmaBackwardCountsTheSplitProducts);
  // not the standalone feature map, or maps without the form.
  EXPECT_TRUE(feature_map_on_tensor_cores(s, c, Pass::backward));
  EXPECT_FALSE(feature_map_on_tensor_cores(s, c.with_mma(false), Pass::forward));
  auto fm = kernel_counts(s, c, Pass::forward, "feature_map", {1, 1, 64}).value_or_throw();
  EXPECT_EQ(fm.tc_flops, 0);
  for (auto change : {+[](AttentionSpec& x) { x.luna.shared_channels = false; },
                      +[](AttentionSpec& x) { x.luna.mlp_width = 24; },
                      +[](AttentionSpec& x) { x.luna.channels = 4; },
                      +[](AttentionSpec& x) { x.luna.variant = LunaVariant::bank_coef; }}) {
    AttentionSpec v = s;
    change(v);
    EXPECT_FALSE(feature_map_on_tensor_cores(v, c, Pass::forward)) << to_json(v).dump();
  }
  // The forward of a 16-bit spec has mma kernels, causal or not, except the
  // causal performer (its running stabiliser has no mma kernel); so does the
  // bf16 or fp16 backward (the causal one walking super-chunks), not the causal performer's.
  EXPECT_TRUE(uses_tensor_cores(s, c, Pass::forward));
  EXPECT_TRUE(uses_tensor_cores(s, c, Pass::backward));
  AttentionSpec causal = s, fp32 = s, fp16 = s, causal_performer = default_spec(Family::performer);
  causal.causal = true;
  causal_performer.causal = true;
  fp32.dtype = DType::fp32;
  fp16.dtype = DType::fp16;
  EXPECT_TRUE(uses_tensor_cores(causal, c, Pass::backward));
  EXPECT_FALSE(uses_tensor_cores(causal_performer, c, Pass::backward));
  EXPECT_TRUE(uses_tensor_cores(fp16, c, Pass::backward));
  EXPECT_FALSE(uses_tensor_cores(fp32, c, Pass::backward));
  EXPECT_TRUE(uses_tensor_cores(causal, c, Pass::forward));
  EXPECT_FALSE(uses_tensor_cores(causal_performer, c, Pass::forward));
  EXPECT_FALSE(uses_tensor_cores(fp32, c, Pass::forward));
  EXPECT_FALSE(uses_tensor_cores(s, c.with_mma(false), Pass::forward));
}

// The tensor-core backward splits its operands into bf16 hi + lo: tc_flops
// count every executed mma (dstate and dq 3 per product, the state pass 2, dkv
// 2 + 3 over its two equal products), the extra FLOPs are added, the rest stays
// on CUDA cores, and the scalar config has none. dq and dkv also map dphi back
// through LUNA's map on tensor cores (feature_map_backward_mma.cuh), counted
// per row against the fp32 code's count (cost_model.h, default spec: d = Hm = 64,
// M = L = 8, relu/relu):
//   fp32:  M (2d + Hm (2 + 1) + 2 Hm L + L (2 + 1) + Hm (2L + 6) + Hm (2L + 7)
//          + L Hm (4 + 1) + L) + 4dM = 8 * 6816 + 2048 = 56576
//   mma:   D (3 + 1) + M Hm (8 + 1 + 1) = 5376 on CUDA cores
//          + 2 * 2 d M (u = X W^T, W split) + 12 M L Hm (three split terms of
//          dh = dpre W2 and dW2^T = H^T dpre) + 10 d M (dx = dU W, three split
//          terms, dW^T = X^T dU, two) = 2048 + 49152 + 5120 = 56320 on mma:
//          61696, 5120 more than the fp32 code
//   wavefronts: M/16 (8 + 32 + 32 + 32 + 4) + 20 D / 128 + 2 d / 64 + M / 32
//          + d/8 (12 + 16) / 16 + d/16 12 / 16 = 54 + 10 + 2 + 0.25 + 14 + 3 = 83.25
// Every kernel that maps phi (one row per token; two in the causal dq and
// dkv) maps it on tensor cores to fp32 level (mma_phi_split_tile): per row
// 2 * 2 d M (u, W split) + 3 * 2 M Hm L (psi, three split terms) = 2048 +
// 24576 = 26624 on mma, replacing 2 d M + 2 M Hm L = 9216 of F (17408 more
// executed), and M Hm / 32 + 2 d / 64 + D / 32 = 16 + 2 + 2 = 20 wavefronts in
// place of the fp32 map's 282 (phi's fp32 tile in conflict-free 64-bit stores,
// its rows padded: backward_phi_stride; D / 8 while they were D floats apart).
TEST(CostModelCounts, MmaBackwardCountsTheSplitProducts) {
  const AttentionSpec s = default_spec(Family::luna);  // bf16, D = dv = 64
  const TileConfig c = TileConfig(64, 4, 64, 64, 1).with_mma(true);
  const ProblemShape shape{1, 1, 64};
  const double N = 64, D = 64, dv = 64;
  ASSERT_TRUE(jacobian_on_tensor_cores(s, c));
  for (auto [role, gemm, terms, jt] : {std::tuple{"dstate", N * (2 * D * dv + 2 * D), 3.0, false},
                                       std::tuple{"dq", N * 2 * D * dv, 3.0, true},
                                       std::tuple{"dkv", N * 4 * D * dv, 2.5, true},
                                       std::tuple{"state", N * (2 * D * dv + D), 2.0, false}}) {
    SCOPED_TRACE(role);
    const auto k = kernel_counts(s, c, Pass::backward, role, shape).value_or_throw();
    const auto scalar = kernel_counts(s, c.with_mma(false), Pass::backward, role, shape).value_or_throw();
    EXPECT_DOUBLE_EQ(k.tc_flops, terms * gemm + (jt ? N * 56320 : 0) + N * 26624);
    EXPECT_DOUBLE_EQ(k.flops, k.tc_flops + k.cuda_flops);
    EXPECT_DOUBLE_EQ(k.flops - scalar.flops, (terms - 1) * gemm + (jt ? N * 5120 : 0) + N * 17408);
    EXPECT_EQ(scalar.tc_flops, 0);
    EXPECT_LT(k.smem_wavefronts, scalar.smem_wavefronts);
  }
  AttentionSpec hm24 = s;  // Hm 24: no tensor-core J^T, the fp32 code counted
  hm24.luna.mlp_width = 24;
  EXPECT_FALSE(jacobian_on_tensor_cores(hm24, c));
  EXPECT_FALSE(jacobian_on_tensor_cores(s, c.with_mma(false)));
  AttentionSpec causal = s, d24 = s;
  causal.causal = true;
  EXPECT_TRUE(jacobian_on_tensor_cores(causal, c));  // the causal backward's walks' J^T too
  // The causal backward's walks (one range of one chunk of 64 here): the inter-chunk
  // products on mma (dq: G S^T and the chunk's Phi_q^T [G | r], three split
  // terms each; dkv: V dS^T and Phi_k dS, 2.5 on average), plus the J^T, plus
  // the intra-chunk scores A = Phi_q Phi_k^T and B = G V^T (masked_scores): 4
  // m-tiles of 16 rows, the (m-tile, 8-column n-tile) items on or below the
  // diagonal 2 + 4 + 6 + 8 = 20, each (D + dv) / 16 = 8 k16 steps of three
  // split m16n8k16 products (4096 FLOPs): 20 * 8 * 3 * 4096 = 1,966,080. And
  // the intra-chunk products (IntraChunkTerms: dq's B Phi_k, dkv's B^T Phi_q
  // and A^T G): the (m-tile, k16 step) pairs on or below the diagonal, 1 + 2 +
  // 3 + 4 = 10, each over D / 8 (dq) or (D + dv) / 8 (dkv) n-tiles of three
  // split products: 983,040 and 1,966,080.
  const double scores = 20 * 8 * 3 * 4096.0;
  for (auto [role, gemm, terms, intra] :
       {std::tuple{"causal_dq", N * 2 * D * dv + N * 2 * D * (dv + 1), 3.0, 10 * (D / 8) * 3 * 4096.0},
        std::tuple{"causal_dkv", N * 4 * D * dv, 2.5, 10 * ((D + dv) / 8) * 3 * 4096.0}}) {
    SCOPED_TRACE(role);
    const auto k = kernel_counts(causal, c, Pass::backward, role, shape).value_or_throw();
    EXPECT_DOUBLE_EQ(k.tc_flops, terms * gemm + N * 56320 + 2 * N * 26624 + scores + intra);  // phi(q) and phi(k)
    EXPECT_DOUBLE_EQ(k.flops, k.tc_flops + k.cuda_flops);
    EXPECT_EQ(k.serial_steps, 1);  // one range of one chunk
    const auto scalar = kernel_counts(causal, c.with_mma(false), Pass::backward, role, shape).value_or_throw();
    EXPECT_EQ(scalar.tc_flops, 0);
    EXPECT_GT(scalar.serial_steps, 0);
  }
  d24.head_dim = 24;  // u = X W^T needs d in 16-column k-steps
  EXPECT_FALSE(jacobian_on_tensor_cores(d24, c));
  // fp16 I/O: V is split into bf16 hi + lo too (one more term in the state
  // pass and in V dS^T: 3 and (3 + 3) / 2), the operands are bf16, and the J^T
  // keeps the fp32 code (jacobian_on_tensor_cores: bf16 only).
  AttentionSpec h = s;
  h.dtype = DType::fp16;
  EXPECT_FALSE(jacobian_on_tensor_cores(h, c));
  for (auto [role, gemm, terms] : {std::tuple{"dstate", N * (2 * D * dv + 2 * D), 3.0},
                                   std::tuple{"dq", N * 2 * D * dv, 3.0},
                                   std::tuple{"dkv", N * 4 * D * dv, 3.0},
                                   std::tuple{"state", N * (2 * D * dv + D), 3.0}}) {
    SCOPED_TRACE(std::string("fp16 ") + role);
    const auto k = kernel_counts(h, c, Pass::backward, role, shape).value_or_throw();
    const auto scalar = kernel_counts(h, c.with_mma(false), Pass::backward, role, shape).value_or_throw();
    EXPECT_DOUBLE_EQ(k.tc_flops, terms * gemm);
    EXPECT_DOUBLE_EQ(k.flops - scalar.flops, (terms - 1) * gemm);
    EXPECT_EQ(k.tc_dtype, DType::bf16);
  }
  const auto dq = kernel_counts(s, c, Pass::backward, "dq", shape).value_or_throw();
  // dq = phi on tensor cores (20 per row) + the J^T's 84 per row and, for its one
  // 64-row tile on 4 warps, 520 (4 warps x (4 + 16) partial stores, 20 x (4 + 2)
  // for their sum into dparams, 64 for dW's 2-way read-modify-write, 4 m-tiles x
  // 4 warps x 16 for dx's dU fragments) + G S^T's 3 split terms.
  EXPECT_DOUBLE_EQ(dq.smem_wavefronts,
                   N * (20 + 84) + 520 + 3 * N * 2 * D * dv * 2 * 64 / (2 * 32 * 32) / 128);
  // The per-tile term scales with the tiles: 16-token tiles (4 here) pay the
  // reductions four times (dx's dU fragments are per m-tile either way).
  const auto dq16 = kernel_counts(s, TileConfig(16, 4, 64, 64, 1).with_mma(true), Pass::backward, "dq", shape)
                        .value_or_throw();
  EXPECT_DOUBLE_EQ(dq16.smem_wavefronts - dq.smem_wavefronts, 3 * 264);
}

TEST(CostModelCounts, CausalChunkWalkAndConflictedTiles) {
  // Causal, shape 1 x 1 x 128, chunk 64: two chunks in series. The masked
  // A = phi(q) phi(k)^T (tri * 2D = 2080 * 128 per chunk) reads 8 wavefronts per
  // warp load: its 532480 FLOPs count 8 / 32 per FLOP, the other products 1 / 32.
  AttentionSpec s = default_spec(Family::luna);
  s.causal = true;
  const TileConfig c(64, 4, 64, 64, 4);
  auto k = kernel_counts(s, c, Pass::forward, "causal_chunk", {1, 1, 128}).value_or_throw();
  EXPECT_EQ(k.serial_steps, 2);
  const double phi = 128 * 2 * 10880.0;           // phi(q) and phi(k)
  const double masked = 2 * 2080 * 128.0;          // two chunks of A
  const double divide = 128 * 64;                  // normalize: one division per value element
  const double products = k.flops - phi - divide;  // everything else is a shared-operand product
  const double phi_wave = 2 * 128 * 282.0;
  EXPECT_DOUBLE_EQ(k.smem_wavefronts, phi_wave + (products - masked) / 32 + masked * 8 / 32);
  EXPECT_EQ(k.sfu_ops, divide);
}

TEST(CostModelPredict, PassSumsItsKernelsAndUsesTheLaunchPlan) {
  const AttentionSpec s = default_spec(Family::luna);
  const TileConfig c(64, 4, 64, 64, 4);
  const ProblemShape shape{8, 12, 16384};
  auto p = predict_pass(s, c, Pass::forward, shape, h100(), sm90()).value_or_throw();
  ASSERT_EQ(p.kernels.size(), 3u);  // state, state_reduce, output
  EXPECT_NEAR(p.ms, p.kernels[0].ms + p.kernels[1].ms + p.kernels[2].ms, 1e-12);
  auto plan = plan_launches(s, c, Pass::forward, shape, p.splits).value_or_throw();  // the predicted plan
  const auto& g = plan.launches[0].grid;
  EXPECT_EQ(p.counts[0].blocks, double(g[0]) * g[1] * g[2]);
  EXPECT_EQ(p.counts[0].threads, int(plan.launches[0].threads));
}

TEST(CostModelPlan, ParamReduceCutsTheSlotsIntoGroups) {
  // The parameter gradient in two launches (templates/lunajit/
  // linear_attention_backward.cuh): param_reduce over (ceil(P / 32), G, Hp)
  // sums groups of ~256 slots a warp (8 loads in flight a lane), param_sum
  // adds the G group sums. At the shape the default LUNA backward
  // (per-head parameters, 16-token tiles, one slot per tile and side) has
  // 16,384 slots a head: 16 groups of 1024, 32 serial load rounds a warp,
  // where the single launch before walked 4,096 dependent loads a warp.
  const AttentionSpec s = default_spec(Family::luna);
  ASSERT_TRUE(s.params_per_head);
  const ProblemShape shape{8, 12, 16384};
  const TileConfig c = TileConfig(16, 4, 64, 64, 4).with_mma(true);
  const double P = double(param_layout(s).per_head_floats), slots = 2.0 * 96 * 1024;
  const unsigned cols = unsigned((P + 31) / 32);
  auto last_two = [&](const AttentionSpec& spec) {
    auto plan = plan_launches(spec, c, Pass::backward, shape).value_or_throw();
    EXPECT_GE(plan.launches.size(), 2u);
    return std::pair{plan.launches[plan.launches.size() - 2], plan.launches.back()};
  };
  auto [reduce, sum] = last_two(s);
  EXPECT_EQ(reduce.role, "param_reduce");
  EXPECT_EQ(reduce.grid, (std::array<unsigned, 3>{cols, 16, 12}));
  EXPECT_EQ(reduce.smem_bytes, 4 * 128);
  EXPECT_EQ(sum.role, "param_sum");
  EXPECT_EQ(sum.grid, (std::array<unsigned, 3>{cols, 12, 1}));
  auto r = kernel_counts(s, c, Pass::backward, "param_reduce", shape).value_or_throw();
  EXPECT_DOUBLE_EQ(r.bytes, 4 * P * slots + 4 * P * 12 * 16);
  EXPECT_DOUBLE_EQ(r.flops, P * slots);
  EXPECT_DOUBLE_EQ(r.serial_steps, 32);  // 1024 slots / 4 warps / 8 loads
  auto t = kernel_counts(s, c, Pass::backward, "param_sum", shape).value_or_throw();
  EXPECT_DOUBLE_EQ(t.bytes, 4 * P * 12 * 16 + 4 * P * 12);
  EXPECT_DOUBLE_EQ(t.flops, P * 12 * 16);
  EXPECT_DOUBLE_EQ(t.serial_steps, 1);  // 16 groups / 4 warps / 8 loads
  // Shared parameters: one list of every head's slots, 192 groups.
  AttentionSpec shared = s;
  shared.params_per_head = false;
  auto [reduce_s, sum_s] = last_two(shared);
  EXPECT_EQ(reduce_s.grid, (std::array<unsigned, 3>{cols, 192, 1}));
  EXPECT_EQ(sum_s.grid, (std::array<unsigned, 3>{cols, 1, 1}));
  auto ts = kernel_counts(shared, c, Pass::backward, "param_sum", shape).value_or_throw();
  EXPECT_DOUBLE_EQ(ts.bytes, 4 * P * 192 + 4 * P);
  EXPECT_DOUBLE_EQ(ts.serial_steps, 6);  // 192 groups / 4 warps / 8 loads
  // A family without learned parameters has neither.
  EXPECT_FALSE(kernel_counts(default_spec(Family::elu), c, Pass::backward, "param_sum", shape).ok());
}

TEST(CostModelPlan, NonCausalSplitsAreReducedOnce) {
  // With state_splits s > 1 the non-causal passes sum the split partials once
  // per (batch, head) (state_reduce after state; dstate_reduce after dstate),
  // one thread per entry of a (D dv + D) state, and the readers (output, dq,
  // dstate's z, dkv) read that one state: the model counts the reduction in
  // the reduce kernels and none in the readers. s = 1 runs no reduce kernel,
  // except in the backward on tensor cores, whose reduce kernels (one block
  // per batch*head) also stage S and dS as bf16 hi + lo words for the dq and
  // dkv tiles, with one split too.
  const AttentionSpec s = default_spec(Family::luna);
  const ProblemShape shape{2, 3, 1000};
  const double BH = 6, D = s.feature_dim(), dv = s.value_dim, part = D * dv + D;
  for (bool mma : {false, true}) {
    const TileConfig c4 = TileConfig(64, 4, 64, 64, 4).with_mma(mma);
    SCOPED_TRACE(c4.to_string());
    ASSERT_TRUE(state_reduced(s, c4, Pass::forward));
    EXPECT_EQ(backward_state_staged(s, c4, Pass::backward), mma);
    EXPECT_FALSE(backward_state_staged(s, c4, Pass::forward));
    EXPECT_EQ(kernel_roles(s, Pass::forward, c4), (std::vector<std::string>{"state", "state_reduce", "output"}));
    const unsigned entries = unsigned((part + 127) / 128);
    auto fwd = plan_launches(s, c4, Pass::forward, shape).value_or_throw();
    ASSERT_EQ(fwd.launches.size(), 3u);
    EXPECT_EQ(fwd.launches[1].role, "state_reduce");
    EXPECT_EQ(fwd.launches[1].grid, (std::array<unsigned, 3>{6, entries, 1}));
    EXPECT_EQ(fwd.launches[1].smem_bytes, 0);
    auto bwd = plan_launches(s, c4, Pass::backward, shape).value_or_throw();
    std::vector<std::string> roles;
    for (const auto& l : bwd.launches) roles.push_back(l.role);
    EXPECT_EQ(roles, (std::vector<std::string>{"state", "state_reduce", "dq", "dstate", "dstate_reduce", "dkv",
                                               "param_reduce", "param_sum"}));
    // The staging reduce: one block per batch*head, one float per warp of shared memory.
    EXPECT_EQ(bwd.launches[1].grid, (std::array<unsigned, 3>{6, mma ? 1 : entries, 1}));
    EXPECT_EQ(bwd.launches[1].smem_bytes, mma ? 16 : 0);
    for (auto [pass, role] : {std::pair{Pass::forward, "state_reduce"}, std::pair{Pass::backward, "state_reduce"},
                              std::pair{Pass::backward, "dstate_reduce"}}) {
      const double staged = mma && pass == Pass::backward ? 4 * BH * D * dv : 0;
      auto k = kernel_counts(s, c4, pass, role, shape).value_or_throw();
      EXPECT_DOUBLE_EQ(k.bytes, 4 * BH * 4 * part + 4 * BH * part + staged) << role;
      EXPECT_DOUBLE_EQ(k.flops, BH * 4 * part + staged) << role;
      EXPECT_EQ(k.tc_flops, 0) << role;
    }
    // The readers' bytes do not grow with the splits, nor their FLOPs.
    const TileConfig c1 = TileConfig(64, 4, 64, 64, 1).with_mma(mma);
    EXPECT_EQ(state_reduced(s, c1, Pass::backward), mma);
    EXPECT_FALSE(state_reduced(s, c1, Pass::forward));
    for (auto [pass, role] : {std::pair{Pass::forward, "output"}, std::pair{Pass::backward, "dq"},
                              std::pair{Pass::backward, "dkv"}}) {
      auto k4 = kernel_counts(s, c4, pass, role, shape).value_or_throw();
      auto k1 = kernel_counts(s, c1, pass, role, shape).value_or_throw();
      EXPECT_DOUBLE_EQ(k4.bytes, k1.bytes) << role;
      EXPECT_DOUBLE_EQ(k4.flops, k1.flops) << role;
    }
    EXPECT_EQ(plan_launches(s, c1, Pass::forward, shape).value_or_throw().launches.size(), 2u);
    if (mma) {  // one split: the staging reduce reads the one partial and writes no sum
      auto k = kernel_counts(s, c1, Pass::backward, "dstate_reduce", shape).value_or_throw();
      EXPECT_DOUBLE_EQ(k.bytes, 4 * BH * part + 4 * BH * D * dv);
      // The staged dq and dkv hold no fp32 state tile: D dv floats less shared memory.
      for (BackwardKind kind : {BackwardKind::dq, BackwardKind::dkv}) {
        BackwardDims p{64, 64, 64, 1, 0, 16, 128, 1160};
        const int64_t with_tile = backward_smem_layout(kind, p).bytes();
        p.staged_state = 1;
        EXPECT_EQ(backward_smem_layout(kind, p).bytes(), with_tile - 4 * 64 * 64);
      }
    }
  }
  AttentionSpec causal = s;
  causal.causal = true;
  EXPECT_FALSE(state_reduced(causal, TileConfig(64, 4, 64, 64, 4).with_mma(true), Pass::backward));
  EXPECT_FALSE(state_reduced(s, TileConfig(64, 4, 64, 64, 4), Pass::feature_map));
}

TEST(CostModelPlan, RuntimeSplitsComeFromThePrediction) {
  // plan_launches runs a given count 1 .. state_splits (0: the compiled one);
  // best_splits picks the count of the least predicted time (docs/
  // ARCHITECTURE.md "Runtime split count"), and predict_pass predicts at it.
  const AttentionSpec s = default_spec(Family::luna);
  const TileConfig c(64, 4, 64, 64, 4);
  const ProblemShape big{8, 12, 16384};
  auto at = [&](const ProblemShape& shape, int splits) {
    return plan_launches(s, c, Pass::forward, shape, splits).value_or_throw();
  };
  EXPECT_EQ(at(big, 0).splits, 4);
  EXPECT_EQ(at(big, 3).splits, 3);
  EXPECT_EQ(at(big, 3).launches[0].grid, (std::array<unsigned, 3>{96, 3, 1}));
  for (int bad : {-1, 5}) {
    auto p = plan_launches(s, c, Pass::forward, big, bad);
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.error().message.find(fmt::format("splits = {}", bad)), std::string::npos) << p.error().message;
    EXPECT_NE(p.error().message.find("1 .. 4"), std::string::npos) << p.error().message;
  }
  const LaunchPlan one = at(big, 1);
  ASSERT_EQ(one.launches.size(), 2u);  // state, output: a one-partial reduce is skipped
  EXPECT_EQ(one.launches[1].role, "output");
  // The workspace keeps the layout of the compiled 4 ranges (partial p of head bh at bh 4 + p).
  EXPECT_EQ(one.workspace_floats, at(big, 0).workspace_floats);
  EXPECT_EQ(one.workspace_floats, 96 + 96LL * 4 * (64 * 64 + 64));
  // A pass whose kernels do not read it keeps the compiled count.
  AttentionSpec causal = s;
  causal.causal = true;
  EXPECT_FALSE(reads_runtime_splits(causal, c, Pass::forward));  // the scalar walk
  EXPECT_EQ(plan_launches(causal, c, Pass::forward, big, 2).value_or_throw().splits, 4);
  EXPECT_EQ(best_splits(causal, c, Pass::forward, big, h100(), sm90()), 4);
  // Causal super-chunks at one range: one walk, no state pass.
  causal.dtype = DType::bf16;
  const TileConfig cc = TileConfig(64, 4, 64, 64, 4).with_mma(true);
  const LaunchPlan walk = plan_launches(causal, cc, Pass::forward, big, 1).value_or_throw();
  ASSERT_EQ(walk.launches.size(), 1u);
  EXPECT_EQ(walk.launches[0].role, "causal_chunk");
  EXPECT_EQ(walk.launches[0].grid, (std::array<unsigned, 3>{96, 1, 1}));

  // best_splits is the argmin of the predictions over 1 .. R, and predict_pass
  // predicts there, counting each kernel at that count.
  for (const ProblemShape& shape : {big, ProblemShape{1, 2, 16384}, ProblemShape{64, 32, 4096}}) {
    SCOPED_TRACE(fmt::format("B{} H{} N{}", shape.batch, shape.heads, shape.seq));
    const int best = best_splits(s, c, Pass::forward, shape, h100(), sm90());
    auto p = predict_pass(s, c, Pass::forward, shape, h100(), sm90()).value_or_throw();
    EXPECT_EQ(p.splits, best);
    for (int k = 1; k <= 4; ++k) {
      double ms = 0;
      for (const KernelCounts& counts : pass_counts(s, c, Pass::forward, shape, k).value_or_throw())
        ms += predict_kernel(counts, h100(), sm90()).ms;
      if (k == best) {
        EXPECT_NEAR(ms, p.ms, 1e-12);
      } else {
        EXPECT_GE(ms, p.ms) << k;
      }
      if (k < best) {
        EXPECT_GT(ms, p.ms) << k;  // ties go to the fewest, so fewer ranges are strictly slower
      }
    }
    EXPECT_DOUBLE_EQ(p.counts[0].bytes,
                     kernel_counts(s, c.with_state_splits(best), Pass::forward, "state", shape).value_or_throw().bytes);
  }
  // Two heads leave an H100 nearly idle at one split: every range is taken;
  // 2048 heads fill it many times over, and one range saves the reduce.
  EXPECT_EQ(best_splits(s, c, Pass::forward, ProblemShape{1, 2, 16384}, h100(), sm90()), 4);
  EXPECT_EQ(best_splits(s, c, Pass::forward, ProblemShape{64, 32, 4096}, h100(), sm90()), 1);
}

TEST(CostModelPlan, CausalSuperChunksSplitTheWalk) {
  // A causal tensor-core config with state_splits R > 1 runs the per-range
  // state pass (grid bh x R x dv blocks, chunk tiles) and then R walks per
  // (bh, dv block), each ceil(ceil(N / C) / R) chunks long; R = 1 and the
  // scalar kernel keep the single walk.
  AttentionSpec s = default_spec(Family::luna);
  s.causal = true;
  const ProblemShape shape{2, 3, 1000};  // 16 chunks of 64
  const TileConfig c4 = TileConfig(64, 4, 64, 64, 4).with_mma(true);
  ASSERT_TRUE(can_implement(s, c4, sm90()));
  EXPECT_TRUE(causal_super_chunks(s, c4, Pass::forward));
  EXPECT_EQ(kernel_roles(s, Pass::forward, c4), (std::vector<std::string>{"state", "causal_chunk"}));
  auto plan = plan_launches(s, c4, Pass::forward, shape).value_or_throw();
  ASSERT_EQ(plan.launches.size(), 2u);
  EXPECT_EQ(plan.launches[0].role, "state");
  EXPECT_EQ(plan.launches[0].grid, (std::array<unsigned, 3>{6, 4, 1}));
  EXPECT_EQ(plan.launches[1].grid, (std::array<unsigned, 3>{6, 1, 4}));
  EXPECT_EQ(plan.launches[0].smem_bytes, dynamic_smem_bytes(s, c4, Pass::forward, "state"));
  EXPECT_EQ(plan.workspace_floats, 8 + 6 * 4 * (64 * 64 + 64));
  auto k4 = kernel_counts(s, c4, Pass::forward, "causal_chunk", shape).value_or_throw();
  EXPECT_EQ(k4.serial_steps, 4);  // ceil(16 / 4)
  // The mma walk prefetches its next chunk by cp.async (d 64: mma_causal_pipelined);
  // the scalar walk loads synchronously.
  ASSERT_TRUE(mma_causal_pipelined(s.head_dim));
  EXPECT_EQ(k4.pipeline_stages, 2);
  EXPECT_EQ(kernel_counts(s, c4.with_mma(false), Pass::forward, "causal_chunk", shape).value_or_throw().pipeline_stages,
            1);
  for (const TileConfig& single : {c4.with_mma(false), TileConfig(64, 4, 64, 64, 1).with_mma(true)}) {
    SCOPED_TRACE(single.to_string());
    EXPECT_FALSE(causal_super_chunks(s, single, Pass::forward));
    auto p1 = plan_launches(s, single, Pass::forward, shape).value_or_throw();
    ASSERT_EQ(p1.launches.size(), 1u);
    EXPECT_EQ(p1.launches[0].grid, (std::array<unsigned, 3>{6, 1, 1}));
    EXPECT_EQ(kernel_counts(s, single, Pass::forward, "causal_chunk", shape).value_or_throw().serial_steps, 16);
  }
  // More blocks, a shorter walk: the model predicts the split faster at small B*H.
  const double t1 = predict_pass(s, TileConfig(64, 4, 64, 64, 1).with_mma(true), Pass::forward, shape, h100(), sm90())
                        .value_or_throw()
                        .ms;
  const double t4 = predict_pass(s, c4, Pass::forward, shape, h100(), sm90()).value_or_throw().ms;
  EXPECT_LT(t4, t1);
}

TEST(CostModelPlan, CausalBackwardOnTensorCoresWalksSuperChunks) {
  // The causal backward with mma: per-range states (grid bh x ranges x dv
  // blocks), the prefix scan (bh x ceil(part / threads)), the dq walks over
  // (ranges, bh), the suffix scan, the dk/dv walks over (ranges, bh); the
  // workspace holds one state per range, the denominators and r, and one
  // parameter slot per range and side.
  AttentionSpec s = default_spec(Family::luna);
  s.causal = true;
  const ProblemShape shape{2, 3, 1000};  // 63 chunks of 16: ranges of 16 (the last 15)
  const TileConfig c = TileConfig(64, 8, 64, 16, 4).with_mma(true);
  ASSERT_TRUE(can_implement(s, c, sm90(), Pass::backward));
  EXPECT_TRUE(causal_backward_tiles(s, c, Pass::backward));
  EXPECT_FALSE(causal_backward_tiles(s, c.with_mma(false), Pass::backward));
  EXPECT_FALSE(causal_backward_tiles(s, c, Pass::forward));
  auto plan = plan_launches(s, c, Pass::backward, shape).value_or_throw();
  std::vector<std::string> roles;
  for (const auto& l : plan.launches) roles.push_back(l.role);
  EXPECT_EQ(roles, (std::vector<std::string>{"state", "state_scan", "causal_dq", "dstate_scan", "causal_dkv",
                                             "param_reduce", "param_sum"}));
  const unsigned part = 64 * 64 + 64, entries = (part + 255) / 256;
  EXPECT_EQ(plan.launches[0].grid, (std::array<unsigned, 3>{6, 4, 1}));
  EXPECT_EQ(plan.launches[1].grid, (std::array<unsigned, 3>{6, entries, 1}));
  EXPECT_EQ(plan.launches[2].grid, (std::array<unsigned, 3>{4, 6, 1}));
  EXPECT_EQ(plan.launches[3].grid, (std::array<unsigned, 3>{6, entries, 1}));
  EXPECT_EQ(plan.launches[4].grid, (std::array<unsigned, 3>{4, 6, 1}));
  EXPECT_EQ(plan.launches[1].smem_bytes, 0);
  const int64_t P = param_layout(s).per_head_floats;
  // One array of per-range states: the prefix, then (written over it by dq) the ranges' dS and their
  // suffix; den and r per token.
  EXPECT_EQ(plan.workspace_floats, 8 + 6LL * 4 * part + 2 * 6 * 1000 + 2LL * 6 * 4 * P);
  // The scans carry no shared memory and no tensor-core work; they walk the 4 ranges with 8 loads in flight.
  for (const char* role : {"state_scan", "dstate_scan"}) {
    const auto k = kernel_counts(s, c, Pass::backward, role, shape).value_or_throw();
    EXPECT_EQ(k.tc_flops, 0) << role;
    EXPECT_EQ(k.serial_steps, 1) << role;
  }
  // The walks: 16 chunks in series per range, the state updates on tensor cores.
  for (const char* role : {"causal_dq", "causal_dkv"}) {
    const auto k = kernel_counts(s, c, Pass::backward, role, shape).value_or_throw();
    EXPECT_EQ(k.serial_steps, 16) << role;
    const auto one = kernel_counts(s, TileConfig(64, 8, 64, 16, 1).with_mma(true), Pass::backward, role, shape)
                         .value_or_throw();
    EXPECT_EQ(one.serial_steps, 63) << role;
    // One range updates its state after 62 chunks, four ranges after 59: 3 fewer updates
    // of 2 (N / 63) D (dv + 1) FLOPs (the model spreads the short last chunk over all),
    // executed as 2 split terms in dq (S += Phi_k^T [V | 1], bf16 V exact) and 3 in dkv
    // (dS += Phi_q^T [G | r]); and 3 more prefix states read.
    const double update = 2.0 * 1000 / 63 * 64 * 65 * 6, terms = std::string(role) == "causal_dq" ? 2 : 3;
    EXPECT_NEAR(one.flops - k.flops, 3 * terms * update, 1e-9 * one.flops) << role;
    EXPECT_LT(one.bytes, k.bytes) << role;
  }
  // A long sequence is fine: the grids hold ranges, not chunks.
  EXPECT_TRUE(plan_launches(s, c, Pass::backward, ProblemShape{1, 1, 65535 * 16 + 1}).ok());
}

TEST(GpuSpecs, TensorPeaksPerDtype) {
  for (const GpuSpec& g : gpu_table()) {
    SCOPED_TRACE(g.key);
    EXPECT_GT(g.boost_mhz, 0);
    EXPECT_EQ(tensor_peak_tflops(g, DType::bf16), g.bf16_tensor_tflops);
    EXPECT_EQ(tensor_peak_tflops(g, DType::fp16), g.fp16_tensor_tflops);
    EXPECT_EQ(tensor_peak_tflops(g, DType::fp32), g.tf32_tensor_tflops);
    // TF32 is half the 16-bit rate on every product in the table (B200's
    // datasheet rounds to 1.1 PF against 2.25 PF: 2.2% off, hence 3%).
    EXPECT_NEAR(g.tf32_tensor_tflops * 2, g.bf16_tensor_tflops, 0.03 * g.bf16_tensor_tflops);
    // The FP32 column agrees with the clock: 2 FLOPs per FMA, 128 FP32 lanes per SM
    // (64 on sm_80 A100) within 10% (table values are the vendor's, rounded).
    const double lanes = g.sm == 80 ? 64 : 128;
    EXPECT_NEAR(g.fp32_tflops, 2 * lanes * g.sm_count * g.boost_mhz * 1e6 / 1e12, 0.1 * g.fp32_tflops);
  }
}

}  // namespace
}  // namespace lunajit
