// Kernel reports: hand-computed bytes and FLOPs, occupancy, schema validation,
// Markdown/HTML numbers equal to the JSON's, the HTML rendered by headless
// Chromium with its charts checked pixel by pixel, the CLI and `compare`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <map>
#include <set>
#include <tuple>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <png.h>

#include "autotune/tuner.h"
#include "cache/binary_cache.h"
#include "cache/tuning_db.h"
#include "codegen/baseline_model.h"
#include "codegen/cost_model.h"
#include "report/kernel_report.h"
#include "report/occupancy.h"
#include "report/ptx_census.h"
#include "report/render.h"
#include "report/report_reader.h"
#include "report/summary.h"
#include "report/svg_chart.h"
#include "runtime/cuda/cuda_backend.h"

namespace lunajit::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ------------------------------------------------------------------ cost model
// Default LUNA spec: d = dv = 64, M = L = 8, Hm = 64 (D = 64), bf16 (2 bytes),
// shared channels, relu/relu, params per head: W 512 + W1 64 + b1 64 + W2 512 + b2 8 = 1160 floats.
// Config T64.w4.dv64.C64.s4: nd = 1, splits 4, chunk 64.
const TileConfig kConfig(64, 4, 64, 64, 4);

TEST(CostModel, LunaFeatureMapPerToken) {
  // 2dM + M(2Hm + Hm + 2 Hm L + L) + ML = 1024 + 8 (128 + 64 + 1024 + 8) + 64.
  EXPECT_EQ(feature_map_flops_per_token(default_spec(Family::luna), false), 10880);
  EXPECT_EQ(feature_map_flops_per_token(default_spec(Family::luna), true), 10880);
  // ARCHITECTURE.md's estimate 2dM + M(2Hm + 2 Hm L) is the bulk of it.
  EXPECT_EQ(2 * 64 * 8 + 8 * (2 * 64 + 2 * 64 * 8), 10240);
}

struct HandCase {
  ProblemShape shape;
  double fm_bytes, fm_flops, state_bytes, state_flops, output_bytes, output_flops, causal_bytes, causal_flops;
  double reduce_bytes, reduce_flops;
};

// Worked by hand from the formulas in codegen/cost_model.h.
// Shape A: B 2, H 4, N 128: BH = 8, nt = 2, two full chunks.
//   params 4 * 1160 * 4 = 18560 B
//   feature_map: 8*128*64*2 + 4*8*128*64 + 18560 = 411776 B; 8*128*10880 = 11141120 FLOPs
//   state: 8*128*128*2 + 4*8*4*4160 + 18560 = 813184 B;
//          11141120 + 2*8*128*64*64 + 8*128*64 = 19595264 FLOPs
//   state_reduce (splits 4): 4*8*4*4160 + 4*8*4160 = 532480 + 133120 = 665600 B; 8*4*4160 = 133120 FLOPs
//   output: 8*128*128*2 + 4*8*4160 (the reduced state) + 18560 = 413824 B;
//          11141120 + 8388608 + 8*128*129 + 8*128*64 = 19727360 FLOPs
//   causal_chunk: 8*128*256*2 + 18560 = 542848 B;
//          chunk(64): 2080*128 + 64*(4160 + 8192) + 2*64*64*64 + 4096 + 64*129 + 2080 + 4096 = 1599584
//          8 * (128*21760 + 2*1599584) = 47875584 FLOPs
// Shape B: B 1, H 2, N 100: BH = 2, nt = 2, chunks of 64 and 36.
//   params 4 * 1160 * 2 = 9280 B
//   feature_map: 2*100*64*2 + 4*2*100*64 + 9280 = 86080 B; 200*10880 = 2176000 FLOPs
//   state: 2*100*128*2 + 4*2*4*4160 + 9280 = 193600 B; 2176000 + 1638400 + 12800 = 3827200 FLOPs
//   state_reduce: 4*2*4*4160 + 4*2*4160 = 133120 + 33280 = 166400 B; 2*4*4160 = 33280 FLOPs
//   output: 2*100*128*2 + 4*2*4160 + 9280 = 93760 B; 2176000 + 1638400 + 200*129 + 200*64 = 3853000 FLOPs
//   causal_chunk: 2*100*256*2 + 9280 = 111680 B;
//          chunk(36): 666*128 + 64*(1332 + 4608) + 2*64*64*36 + 2304 + 36*129 + 666 + 2304 = 770238
//          2 * (100*21760 + 1599584 + 770238) = 9091644 FLOPs
const HandCase kHandCases[] = {
    {{2, 4, 128}, 411776, 11141120, 813184, 19595264, 413824, 19727360, 542848, 47875584, 665600, 133120},
    {{1, 2, 100}, 86080, 2176000, 193600, 3827200, 93760, 3853000, 111680, 9091644, 166400, 33280},
};

TEST(CostModel, HandComputedBytesAndFlops) {
  AttentionSpec spec = default_spec(Family::luna);
  for (const HandCase& h : kHandCases) {
    SCOPED_TRACE(fmt::format("shape {},{},{}", h.shape.batch, h.shape.heads, h.shape.seq));
    auto fm = kernel_counts(spec, kConfig, Pass::feature_map, "feature_map", h.shape).value_or_throw();
    EXPECT_EQ(fm.bytes, h.fm_bytes);
    EXPECT_EQ(fm.flops, h.fm_flops);
    auto st = kernel_counts(spec, kConfig, Pass::forward, "state", h.shape).value_or_throw();
    EXPECT_EQ(st.bytes, h.state_bytes);
    EXPECT_EQ(st.flops, h.state_flops);
    auto out = kernel_counts(spec, kConfig, Pass::forward, "output", h.shape).value_or_throw();
    EXPECT_EQ(out.bytes, h.output_bytes);
    EXPECT_EQ(out.flops, h.output_flops);
    // The split partials summed once, the same in the backward (state and dstate).
    for (auto [pass, role] : {std::pair{Pass::forward, "state_reduce"}, std::pair{Pass::backward, "state_reduce"},
                              std::pair{Pass::backward, "dstate_reduce"}}) {
      auto red = kernel_counts(spec, kConfig, pass, role, h.shape).value_or_throw();
      EXPECT_EQ(red.bytes, h.reduce_bytes) << role;
      EXPECT_EQ(red.flops, h.reduce_flops) << role;
    }
    AttentionSpec causal = spec;
    causal.causal = true;
    auto cc = kernel_counts(causal, kConfig, Pass::forward, "causal_chunk", h.shape).value_or_throw();
    EXPECT_EQ(cc.bytes, h.causal_bytes);
    EXPECT_EQ(cc.flops, h.causal_flops);
  }
}

struct BackwardHandCase {
  ProblemShape shape;
  double dstate_bytes, dstate_flops, dq_bytes, dq_flops, dkv_bytes, dkv_flops;
  double causal_dq_bytes, causal_dq_flops, causal_dkv_bytes, causal_dkv_flops;
  double reduce_bytes, reduce_flops, causal_reduce_bytes, causal_reduce_flops;
};

// Worked by hand from the backward formulas in codegen/cost_model.h, same spec and
// config as above (normalized, learned params, P = 1160, part = D dv + D = 4160):
//   F = 10880 (q and k alike), J = 56576 (LUNA's fp32 J^T counted as written: codegen/cost_model.h),
//   den row 2D + 1 = 129, grad row 3dv + 2 = 194. (Before J was counted, the 2F estimate 21760 stood
//   in its place: every J term below is 34816 more per row than it was.)
// Shape A: B 2, H 4, N 128: BH = 8, nt = 2, params 18560 B.
// The readers read the one reduced state (state_reduce, dstate_reduce): 4*BH*4160 B, no sums.
//   dstate: 8*128*(128*2 + 4) (q, dout, r) + 4*8*64 (z) + 4*8*4*4160 + 18560 = 266240 + 2048 + 532480 + 18560
//           = 819328 B; 1024*(10880 + 129 + 194) + 2*1024*4096 + 2*1024*64
//           = 11471872 + 8388608 + 131072 = 19991552 FLOPs
//   dq:     8*128*(192*2 + 4) (q, dout, dq, r) + 4*8*4160 + 18560 + 4*1160*8*2 = 397312 + 133120 + 18560 + 74240
//           = 623232 B; 1024*(10880 + 129 + 194 + 64*129 + 56576) = 1024*76035 = 77859840 FLOPs
//   dkv:    8*128*256*2 + 133120 + 18560 + 74240 = 750208 B (k, v read, dk, dv written);
//           1024*(10880 + 8192 + 8192 + 56576) = 1024*83840 = 85852160 FLOPs
//   causal_dq: 8*128*320*2 + 8*8*128 (den, r) + 18560 + 4*1160*8 = 655360 + 8192 + 18560 + 37120 = 719232 B;
//           chunk(64), tri = 2080: 64*21760 + 2080*128 + 2080*129 + 64*194 + 64*129 + 2080 + 64*64*129
//           + 2080*128 + 8192*64 + 64*64 + 64*56576
//           = 1392640 + 266240 + 268320 + 12416 + 8256 + 2080 + 528384 + 266240 + 524288 + 4096 + 3620864
//           = 6893824;  8 * 2 * 6893824 = 110301184 FLOPs
//   causal_dkv: 8*128*384*2 + 8192 + 18560 + 37120 = 786432 + 63872 = 850304 B;
//           chunk(64): 64*21760 + 2080*128 + 2080*129 + 64*194 + 64*8192 + 2080*128 + 64*8192 + 2080*128
//           + 8192*64 + 128*64 + 64*56576
//           = 1392640 + 266240 + 268320 + 12416 + 524288 + 266240 + 524288 + 266240 + 524288 + 8192 + 3620864
//           = 7674016;  8 * 2 * 7674016 = 122784256 FLOPs
//   param_reduce: slots 2*8*2 = 32: 4*1160*32 + 18560 = 148480 + 18560 = 167040 B; 1160*32 = 37120
//           causal: slots 16: 74240 + 18560 = 92800 B; 18560 FLOPs
// Shape B: B 1, H 2, N 100: BH = 2, nt = 2, chunks of 64 and 36, params 9280 B.
//   dstate: 2*100*260 + 4*2*64 + 4*2*4*4160 + 9280 = 52000 + 512 + 133120 + 9280 = 194912 B;
//           200*11203 + 2*200*4096 + 2*200*64 = 2240600 + 1638400 + 25600 = 3904600 FLOPs
//   dq:     2*100*388 + 4*2*4160 + 9280 + 4*1160*2*2 = 77600 + 33280 + 9280 + 18560 = 138720 B;
//           200*76035 = 15207000 FLOPs
//   dkv:    2*100*256*2 + 33280 + 9280 + 18560 = 163520 B; 200*83840 = 16768000 FLOPs
//   causal_dq: 2*100*320*2 + 8*2*100 + 9280 + 4*1160*2 = 128000 + 1600 + 9280 + 9280 = 148160 B;
//           chunk(36), tri = 666: 36*21760 + 666*128 + 666*129 + 36*194 + 36*129 + 666 + 36*64*129
//           + 666*128 + 8192*36 + 64*36 + 36*56576
//           = 783360 + 85248 + 85914 + 6984 + 4644 + 666 + 297216 + 85248 + 294912 + 2304 + 2036736 = 3683232;
//           2 * (6893824 + 3683232) = 21154112 FLOPs
//   causal_dkv: 2*100*384*2 + 1600 + 9280 + 9280 = 153600 + 20160 = 173760 B;
//           chunk(36): 783360 + 85248 + 85914 + 6984 + 36*8192 + 85248 + 36*8192 + 85248 + 36*8192
//           + 128*36 + 2036736 = 4058082;  2 * (7674016 + 4058082) = 23464196 FLOPs
//   param_reduce: slots 2*2*2 = 8: 4*1160*8 + 9280 = 37120 + 9280 = 46400 B; 9280 FLOPs
//           causal: slots 4: 18560 + 9280 = 27840 B; 4640 FLOPs
const BackwardHandCase kBackwardHandCases[] = {
    {{2, 4, 128}, 819328, 19991552, 623232, 77859840, 750208, 85852160, 719232, 110301184, 850304, 122784256,
     167040, 37120, 92800, 18560},
    {{1, 2, 100}, 194912, 3904600, 138720, 15207000, 163520, 16768000, 148160, 21154112, 173760, 23464196, 46400,
     9280, 27840, 4640},
};

TEST(CostModel, BackwardHandComputedBytesAndFlops) {
  const AttentionSpec spec = default_spec(Family::luna);
  AttentionSpec causal = spec;
  causal.causal = true;
  for (const BackwardHandCase& h : kBackwardHandCases) {
    SCOPED_TRACE(fmt::format("shape {},{},{}", h.shape.batch, h.shape.heads, h.shape.seq));
    auto expect = [&](const AttentionSpec& sp, const char* role, double bytes, double flops) {
      SCOPED_TRACE(role);
      auto k = kernel_counts(sp, kConfig, Pass::backward, role, h.shape).value_or_throw();
      EXPECT_EQ(k.bytes, bytes);
      EXPECT_EQ(k.flops, flops);
    };
    expect(spec, "dstate", h.dstate_bytes, h.dstate_flops);
    expect(spec, "dq", h.dq_bytes, h.dq_flops);
    expect(spec, "dkv", h.dkv_bytes, h.dkv_flops);
    expect(spec, "param_reduce", h.reduce_bytes, h.reduce_flops);
    expect(causal, "causal_dq", h.causal_dq_bytes, h.causal_dq_flops);
    expect(causal, "causal_dkv", h.causal_dkv_bytes, h.causal_dkv_flops);
    expect(causal, "param_reduce", h.causal_reduce_bytes, h.causal_reduce_flops);
    // The backward's state pass is the forward's.
    auto fwd = kernel_counts(spec, kConfig, Pass::forward, "state", h.shape).value_or_throw();
    auto bwd = kernel_counts(spec, kConfig, Pass::backward, "state", h.shape).value_or_throw();
    EXPECT_EQ(fwd.bytes, bwd.bytes);
    EXPECT_EQ(fwd.flops, bwd.flops);
  }
}

TEST(CostModel, UnknownKernelsHaveNoFormula) {
  const AttentionSpec spec = default_spec(Family::luna);
  EXPECT_FALSE(kernel_counts(spec, kConfig, Pass::forward, "mystery", {1, 1, 8}));
  EXPECT_FALSE(kernel_counts(spec, kConfig, Pass::backward, "mystery", {1, 1, 8}));
  EXPECT_FALSE(kernel_counts(spec, kConfig, Pass::forward, "key_stab", {1, 1, 8}));  // not performer
  EXPECT_TRUE(kernel_counts(default_spec(Family::performer), kConfig, Pass::forward, "key_stab", {1, 1, 8}));
  // Backward kernels exist only in the backward pass, and the forward-only ones not there.
  EXPECT_FALSE(kernel_counts(spec, kConfig, Pass::forward, "dq", {1, 1, 8}));
  EXPECT_FALSE(kernel_counts(spec, kConfig, Pass::backward, "output", {1, 1, 8}));
  EXPECT_TRUE(kernel_counts(spec, kConfig, Pass::backward, "dq", {1, 1, 8}));
  // param_reduce only for a family that learns parameters; key_stab in the backward as in the forward.
  EXPECT_FALSE(kernel_counts(default_spec(Family::elu), kConfig, Pass::backward, "param_reduce", {1, 1, 8}));
  const AttentionSpec perf = default_spec(Family::performer);
  auto fwd = kernel_counts(perf, kConfig, Pass::forward, "key_stab", {1, 2, 8}).value_or_throw();
  auto bwd = kernel_counts(perf, kConfig, Pass::backward, "key_stab", {1, 2, 8}).value_or_throw();
  EXPECT_EQ(fwd.bytes, bwd.bytes);
  EXPECT_EQ(fwd.flops, bwd.flops);
}

TEST(CostModel, EveryBackwardKernelOfEveryFamilyHasAFormula) {
  for (Family f : kAllFamilies)
    for (bool c : {false, true}) {
      AttentionSpec spec = default_spec(f);
      spec.causal = c;
      for (const std::string& role : kernel_roles(spec, Pass::backward)) {
        auto k = kernel_counts(spec, kConfig, Pass::backward, role, {1, 2, 100});
        ASSERT_TRUE(k) << to_string(f) << " " << role << ": " << k.error().message;
        EXPECT_GT(k->bytes, 0) << role;
        EXPECT_GT(k->flops, 0) << role;
      }
    }
}

// ------------------------------------------------------------------ occupancy
TEST(Occupancy, WorkedExampleOfTheHeader) {
  const Arch sm90 = arch_from_sm(90).value_or_throw();
  const Occupancy o = theoretical_occupancy(sm90, {128, 96, 0, 40 * 1024});
  EXPECT_EQ(o.blocks_by_threads, 16);
  EXPECT_EQ(o.blocks_by_registers, 5);
  EXPECT_EQ(o.blocks_by_smem, 5);
  EXPECT_EQ(o.blocks_per_sm, 5);
  EXPECT_EQ(o.limited_by, "registers");
  EXPECT_DOUBLE_EQ(o.fraction, 20.0 / 64);
}

TEST(Occupancy, EachLimit) {
  const Arch sm80 = arch_from_sm(80).value_or_throw();
  // 32 regs, no smem, 256 threads: 8 blocks by threads (2048 / 256) = 100%.
  Occupancy o = theoretical_occupancy(sm80, {256, 32, 0, 0});
  EXPECT_EQ(o.blocks_per_sm, 8);
  EXPECT_EQ(o.limited_by, "threads");
  EXPECT_DOUBLE_EQ(o.fraction, 1.0);
  // 33 regs round up to 1280 per warp: 16384 / 1280 = 12 warps per quarter, 48 warps = 6 blocks of 8.
  o = theoretical_occupancy(sm80, {256, 33, 0, 0});
  EXPECT_EQ(o.blocks_by_registers, 6);
  EXPECT_EQ(o.limited_by, "registers");
  // 100 KiB of smem + 1 KiB reserved: one block of 164 KiB.
  o = theoretical_occupancy(sm80, {128, 32, 0, 100 * 1024});
  EXPECT_EQ(o.blocks_by_smem, 1);
  EXPECT_EQ(o.limited_by, "smem");
  // 32 threads, few regs, no smem: the 32-block limit.
  o = theoretical_occupancy(sm80, {32, 16, 0, 0});
  EXPECT_EQ(o.blocks_per_sm, 32);
  EXPECT_EQ(o.limited_by, "blocks");
  // Over the per-block smem limit: cannot launch.
  o = theoretical_occupancy(sm80, {128, 32, 0, 200 * 1024});
  EXPECT_EQ(o.blocks_per_sm, 0);
}

// ------------------------------------------------------------------ PTX census
TEST(PtxCensus, CountsEachKindInTheNamedEntryOnly) {
  const std::string ptx = R"(
.version 8.8
.target sm_90
.visible .entry _Zother(
	.param .u64 p
)
{
	fma.rn.f32 	%f1, %f2, %f3, %f4;
}
.visible .entry _Zmine(
	.param .u64 p
)
{
	.reg .f32 	%f<9>;
	// fma.rn.f32 in a comment is not an instruction
$L__BB0_1:
	ld.global.nc.v4.f32 	{%f1, %f2, %f3, %f4}, [%rd1];
	@%p1 ld.shared.f32 	%f5, [%r1];
	@!%p2 ld.shared.v2.f32 	{%f6, %f7}, [%r2];
	st.shared.f32 	[%r3], %f5;
	fma.rn.f32 	%f8, %f5, %f6, %f8;
	fma.rn.ftz.f32 	%f8, %f5, %f7, %f8;
	{
	mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, {%r4, %r5, %r6, %r7}, {%r8, %r9}, {%f1, %f2, %f3, %f4};
	}
	ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r4, %r5, %r6, %r7}, [%r10];
	cp.async.cg.shared.global [%r11], [%rd2], 16;
	cp.async.commit_group;
	cp.async.wait_group 0;
	ex2.approx.ftz.f32 	%f1, %f1;
	rcp.rn.f32 	%f2, %f2;
	st.global.f32 	[%rd3], %f8;
	ret;
}
)";
  const PtxCensus c = ptx_census(ptx, "_Zmine");
  ASSERT_TRUE(c.found);
  EXPECT_EQ(c.fma, 2);
  EXPECT_EQ(c.ld_global, 1);
  EXPECT_EQ(c.ld_shared, 2);
  EXPECT_EQ(c.st_shared, 1);
  EXPECT_EQ(c.st_global, 1);
  EXPECT_EQ(c.mma, 1);
  EXPECT_EQ(c.ldmatrix, 1);
  EXPECT_EQ(c.cp_async, 1);  // the copy, not the commit or the wait
  EXPECT_EQ(c.sfu, 2);
  EXPECT_EQ(ptx_census(ptx, "_Zother").fma, 1);
  EXPECT_FALSE(ptx_census(ptx, "_Zmissing").found);
}

// A kernel is its entry and the functions it calls: NVRTC's PTX declares a
// .func before the entries (a prototype, not counted), defines it after its
// caller, and spells a call over several lines. Each reached function counts
// once however many call sites; a function only another entry calls, a
// declared-only extern and an indirect call are not followed.
TEST(PtxCensus, FollowsDirectCallsIntoFunctionsOnce) {
  const std::string ptx = R"(
.version 8.8
.target sm_90
.func  (.param .b32 func_retval0) _Zwalk
(
	.param .b64 _Zwalk_param_0
)
;
.extern .func _Zextern
(
	.param .b64 p
)
;
.weak .entry _Zkernel(
	.param .align 8 .b8 _Zkernel_param_0[64]
)
.maxntid 256, 1, 1
{
	.reg .b32 	%r<9>;
	ld.global.u32 	%r1, [%rd1];
	{ // callseq 0, 0
	.param .b64 param0;
	st.param.b64 	[param0+0], %rd2;
	.param .b32 retval0;
	call.uni (retval0), 
	_Zwalk, 
	(
	param0
	);
	ld.param.b32 	%r2, [retval0+0];
	} // callseq 0
	@%p1 call.uni (retval0), _Zwalk, (param0);
	call.uni _Zextern, (param0);
	call (retval0), %rd5, (param0), prototype_0;
	ret;
}
.weak .entry _Zother(
	.param .u64 p
)
{
	call.uni _Zonly_other, (param0);
	ret;
}
.func  (.param .b32 func_retval0) _Zwalk(
	.param .b64 _Zwalk_param_0
)
{
	mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, {%r4, %r5, %r6, %r7}, {%r8, %r9}, {%f1, %f2, %f3, %f4};
	cp.async.cg.shared.global [%r11], [%rd2], 16;
	call.uni _Zleaf, ();
	call.uni _Zwalk, (param0);
	ret;
}
.func _Zleaf()
{
	ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r4, %r5, %r6, %r7}, [%r10];
	ret;
}
.func _Zonly_other()
{
	fma.rn.f32 	%f8, %f5, %f6, %f8;
	ret;
}
)";
  const PtxCensus c = ptx_census(ptx, "_Zkernel");
  ASSERT_TRUE(c.found);
  EXPECT_EQ(c.ld_global, 1);
  EXPECT_EQ(c.mma, 1);       // _Zwalk once: three call sites, one of them its own
  EXPECT_EQ(c.cp_async, 1);
  EXPECT_EQ(c.ldmatrix, 1);  // _Zleaf, called from _Zwalk
  EXPECT_EQ(c.fma, 0);       // _Zonly_other belongs to _Zother
  EXPECT_EQ(c.functions, 2);
  EXPECT_EQ(c.indirect_calls, 1);
  EXPECT_EQ(kernel_bodies(ptx, "_Zkernel").size(), 3u);
  const PtxCensus other = ptx_census(ptx, "_Zother");
  EXPECT_EQ(other.fma, 1);
  EXPECT_EQ(other.mma, 0);
  EXPECT_EQ(other.functions, 1);
  // Counting the entry's body alone (the census before calls were followed)
  // would report the kernel with no mma at all.
  EXPECT_TRUE(kernel_bodies(ptx, "_Zmissing").empty());
}

TEST(Shapes, ParseAndReject) {
  auto s = parse_shapes("2,8,1024;1,16,4096").value_or_throw();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].heads, 16);
  EXPECT_EQ(s[1].seq, 4096);
  for (const char* bad : {"", "2,8", "2,8,x", "0,1,1", "1,1,1,1"}) {
    auto r = parse_shapes(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message.find("shapes"), std::string::npos) << r.error().message;
  }
}

// ------------------------------------------------------------------ the report
std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int run(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// One report for sm_80, sm_90, sm_100 of the default spec, built once.
class ReportFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // One directory per process: ctest runs each test as its own process, in parallel.
    dir_ = fs::path(LUNAJIT_REPORT_TEST_DIR) / fmt::format("default-{}", ::getpid());
    fs::remove_all(dir_);
    // The tests expect default (untuned) configs: the report reads the tuning
    // database under LUNAJIT_CACHE_DIR, which a user's or another test's tune
    // may have filled, so it gets an empty one; compiled kernels still come
    // from (and go to) the usual binary cache.
    static BinaryCache binaries(BinaryCache::default_dir());
    const fs::path empty_cache = dir_ / "empty-cache";
    fs::create_directories(empty_cache);
    fs::permissions(empty_cache, fs::perms::owner_all);
    const char* old_env = std::getenv("LUNAJIT_CACHE_DIR");
    const std::string old_dir = old_env != nullptr ? old_env : "";
    ::setenv("LUNAJIT_CACHE_DIR", empty_cache.c_str(), 1);
    ReportOptions opt;
    opt.cache = &binaries;
    for (int sm : {80, 90, 100}) opt.archs.push_back(arch_from_sm(sm).value_or_throw());
    opt.shapes = parse_shapes("2,4,128;1,2,100;1,8,1024;1,8,4096").value_or_throw();
    opt.measure_repeats = 5;
    auto r = build_report(default_spec(Family::luna), opt);
    if (old_env != nullptr) ::setenv("LUNAJIT_CACHE_DIR", old_dir.c_str(), 1);
    else ::unsetenv("LUNAJIT_CACHE_DIR");
    ASSERT_TRUE(r) << r.error().message;
    report_ = *r;
    ASSERT_TRUE(write_report(report_, dir_));
  }
  // Kept when a test failed, for a look at the files and the screenshot.
  static void TearDownTestSuite() {
    if (::testing::UnitTest::GetInstance()->current_test_suite()->Passed()) fs::remove_all(dir_);
  }
  static json report_;
  static fs::path dir_;
};
json ReportFiles::report_;
fs::path ReportFiles::dir_;

TEST_F(ReportFiles, ValidatesAgainstTheSchema) {
  const fs::path schema = fs::path(LUNAJIT_SOURCE_DIR) / "docs/report_schema.json";
  const std::string script = fs::path(LUNAJIT_SOURCE_DIR) / "tests/report/validate_report.py";
  const std::string py = LUNAJIT_PYTHON3;
  ASSERT_FALSE(py.empty()) << "python3 not found";
  const int rc = run(fmt::format("{} {} {} {}", py, script, schema.string(), (dir_ / "report.json").string()));
  ASSERT_NE(rc, 3) << "install python3-jsonschema (scripts/install_deps.sh)";
  EXPECT_EQ(rc, 0);

  // The validator does reject: a register count as a string, a missing field.
  json bad = report_;
  bad["kernels"][0]["resources"] = {{"registers", "many"}, {"static_smem_bytes", 0}, {"spill_stores", 0},
                                    {"spill_loads", 0}, {"stack_bytes", 0}};
  bad.erase("notes");
  const fs::path bad_path = dir_ / "bad.json";
  std::ofstream(bad_path) << bad.dump();
  EXPECT_EQ(run(fmt::format("{} {} {} {} 2>/dev/null", py, script, schema.string(), bad_path.string())), 1);
}

// The census is the whole kernel's, out-of-line functions included. The
// default causal spec's kernels keep their work in __noinline__ functions:
// the backward's chunk walks hold every mma of causal_dq and causal_dkv, the
// forward's prefetch every cp.async of causal_chunk. A census of the .entry
// bodies alone reported 0 mma and 0 cp.async for them.
TEST(ReportCensus, CausalKernelsCountTheirOutOfLineWalks) {
  const fs::path dir = fs::path(LUNAJIT_REPORT_TEST_DIR) / fmt::format("census-{}", ::getpid());
  fs::remove_all(dir);
  const fs::path empty_cache = dir / "empty-cache";  // default (untuned) configs, as ReportFiles
  fs::create_directories(empty_cache);
  fs::permissions(empty_cache, fs::perms::owner_all);
  const char* old_env = std::getenv("LUNAJIT_CACHE_DIR");
  const std::string old_dir = old_env != nullptr ? old_env : "";
  static BinaryCache binaries(BinaryCache::default_dir());
  ::setenv("LUNAJIT_CACHE_DIR", empty_cache.c_str(), 1);
  ReportOptions opt;
  opt.cache = &binaries;
  for (int sm : {80, 90}) opt.archs.push_back(arch_from_sm(sm).value_or_throw());
  opt.shapes = parse_shapes("1,2,256").value_or_throw();
  opt.measure = false;
  AttentionSpec spec = default_spec(Family::luna);
  spec.causal = true;
  auto r = build_report(spec, opt);
  if (old_env != nullptr) ::setenv("LUNAJIT_CACHE_DIR", old_dir.c_str(), 1);
  else ::unsetenv("LUNAJIT_CACHE_DIR");
  ASSERT_TRUE(r) << r.error().message;
  std::set<std::string> seen;
  for (const json& k : r->at("kernels")) {
    const std::string role = k.at("kernel").get<std::string>();
    const std::string where = k.at("arch").get<std::string>() + " " + role;
    ASSERT_FALSE(k.at("ptx_census").is_null()) << where;
    const json& c = k.at("ptx_census");
    if (role == "causal_dq" || role == "causal_dkv") {
      seen.insert(role);
      EXPECT_GE(c.at("functions").get<int64_t>(), 1) << where << ": the chunk walk is out of line";
      EXPECT_GT(c.at("mma").get<int64_t>(), 0) << where;
      EXPECT_GT(c.at("ldmatrix").get<int64_t>(), 0) << where;
    }
    if (role == "causal_chunk") {
      seen.insert(role);
      EXPECT_GT(c.at("mma").get<int64_t>(), 0) << where;
      EXPECT_GT(c.at("cp_async").get<int64_t>(), 0) << where << ": the next chunk's prefetch";
    }
    EXPECT_EQ(c.at("indirect_calls").get<int64_t>(), 0) << where;
  }
  EXPECT_EQ(seen, (std::set<std::string>{"causal_chunk", "causal_dq", "causal_dkv"}));
  fs::remove_all(dir);
}

// A report of sm_90 at one shape, causal and not, with no NVRTC and no GPU:
// only the host bank profile and the model (the bank-profile tests).
ReportOptions host_bank_profile_options(const char* shape) {
  ReportOptions opt;
  opt.archs.push_back(arch_from_sm(90).value_or_throw());
  opt.shapes = parse_shapes(shape).value_or_throw();
  opt.causal = CausalVariants::both;
  opt.compile = false;
  opt.measure = false;
  opt.bank_profile = true;
  return opt;
}

// The cost model's shared-memory wavefronts against the emulator, for the
// default LUNA spec's tensor-core backward kernels (block (0,0,0) at the
// bank profile's 1 x 1 x 256): within 30% either way. The model also counts
// ldmatrix and the parameters' L1 reads, which the emulator does not see, and
// does not price every bank conflict, so the two need not agree exactly; a
// term the model lost shows as a ratio out of the band (without the J^T's
// per-tile reductions, jacobian_per_tile: causal_dq 1.43). The forward
// kernels are left out: their feature map's parameter reads through L1 put
// the model at 1.4-2.9x.
TEST(ReportBanks, ModelTracksTheEmulatorOnTheDefaultBackward) {
  ReportOptions opt = host_bank_profile_options("1,1,256");
  AttentionSpec spec = default_spec(Family::luna);
  spec.dtype = DType::bf16;
  auto r = build_report(spec, opt);
  ASSERT_TRUE(r) << r.error().message;
  std::set<std::string> seen;
  for (const json& k : r->at("bank_conflicts").at("kernels")) {
    const std::string role = k.at("role").get<std::string>();
    if (k.at("pass") != "backward" ||
        (role != "dq" && role != "dkv" && role != "dstate" && role != "causal_dq" && role != "causal_dkv"))
      continue;
    seen.insert(role);
    const double emulated = k.at("wavefronts").get<double>(), model = k.at("model_wavefronts_per_block").get<double>();
    ASSERT_GT(model, 0.0) << role;
    EXPECT_GE(emulated / model, 0.7) << role << ": emulator " << emulated << ", model " << model;
    EXPECT_LE(emulated / model, 1.3) << role << ": emulator " << emulated << ", model " << model;
  }
  EXPECT_EQ(seen, (std::set<std::string>{"dq", "dkv", "dstate", "causal_dq", "causal_dkv"}));
}

// --config: every pass at the given tile config, marked so, in place of the
// tuning database's choice (and in the bank profile); a bad field is an
// error naming it; a config an arch cannot implement skips the pass with why.
TEST(ReportGivenConfig, EveryKernelRunsAtItAndSaysSo) {
  ReportOptions opt = host_bank_profile_options("1,1,40");
  opt.config = json{{"state_splits", 1}};
  const AttentionSpec spec = default_spec(Family::elu);  // small kernels: the test stays quick
  auto r = build_report(spec, opt);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_FALSE(r->at("kernels").empty());
  for (const json& k : r->at("kernels")) {
    const std::string where = k.at("pass").get<std::string>() + " " + k.at("kernel").get<std::string>();
    EXPECT_EQ(k.at("config").at("how"), "given (--config)") << where;
    EXPECT_FALSE(k.at("config").at("tuned").get<bool>()) << where;
    EXPECT_EQ(k.at("config").at("tile").at("state_splits"), 1) << where;
  }
  // The bank profile ran at it too: one range, so the causal forward walks in
  // one block with no per-range state pass (the default's 4 ranges: 4 blocks
  // and a state kernel).
  ASSERT_TRUE(r->contains("bank_conflicts"));
  bool walked = false;
  for (const json& k : r->at("bank_conflicts").at("kernels")) {
    if (!k.at("causal").get<bool>() || k.at("pass") != "forward") continue;
    EXPECT_NE(k.at("role"), "state") << k.dump();
    if (k.at("role") != "causal_chunk") continue;
    walked = true;
    EXPECT_EQ(k.at("blocks").get<double>(), 1.0) << k.dump();
  }
  EXPECT_TRUE(walked);

  opt.bank_profile = false;
  opt.config = json{{"chunk", 7}};
  auto bad = build_report(spec, opt);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("config.chunk = 7"), std::string::npos) << bad.error().message;

  opt.config = json{{"dv_block", 128}};  // twice elu's value_dim 64: can_implement refuses it
  auto skipped = build_report(spec, opt);
  ASSERT_TRUE(skipped) << skipped.error().message;
  int passes = 0;
  for (const json& p : skipped->at("passes")) {
    if (p.at("pass") == "feature_map") continue;
    ++passes;
    EXPECT_EQ(p.at("status"), "skipped") << p.dump();
    EXPECT_NE(p.at("note").get<std::string>().find("dv_block"), std::string::npos) << p.dump();
  }
  EXPECT_EQ(passes, 4);  // forward and backward, causal and not
}

// --bank-profile: the host-profiled bank conflicts, valid against the schema,
// in the Markdown, and non-trivial for the causal kernels (the dot products over
// rows of phi tiles are strided by D floats: many lanes on one bank).
TEST(ReportBanks, HostProfiledTableValidatesAndNamesTheWorstSites) {
  const fs::path dir = fs::path(LUNAJIT_REPORT_TEST_DIR) / fmt::format("banks-{}", ::getpid());
  fs::remove_all(dir);
  ReportOptions opt = host_bank_profile_options("1,1,40");
  AttentionSpec spec = default_spec(Family::elu);  // small kernels: the test stays quick
  auto r = build_report(spec, opt);
  ASSERT_TRUE(r) << r.error().message;
  ASSERT_TRUE(r->contains("bank_conflicts")) << r->dump(1);
  const json& b = r->at("bank_conflicts");
  EXPECT_EQ(b.at("shape").at("seq").get<int>(), 40);
  EXPECT_GT(b.at("total_wavefronts").get<std::uint64_t>(), b.at("conflict_free_wavefronts").get<std::uint64_t>());
  ASSERT_FALSE(b.at("sites").empty());
  const json& worst = b.at("sites")[0];
  EXPECT_GT(worst.at("wavefronts").get<std::uint64_t>(), worst.at("conflict_free_wavefronts").get<std::uint64_t>());
  // Per kernel: the emulator's count of block (0,0,0) beside the model's per
  // block, for the kernels of each pass's own plan (not the forward's kernels
  // that a backward check runs first), and the per-kernel sums make the total.
  std::uint64_t summed = 0;
  std::set<std::string> seen;
  for (const json& k : b.at("kernels")) {
    const std::string key = fmt::format("{}:{}:{}", k.at("causal").get<bool>() ? "causal" : "non-causal",
                                        k.at("pass").get<std::string>(), k.at("role").get<std::string>());
    EXPECT_TRUE(seen.insert(key).second) << "one row per kernel and pass: " << key;
    summed += k.at("wavefronts").get<std::uint64_t>();
    EXPECT_GE(k.at("wavefronts").get<std::uint64_t>(), k.at("conflict_free_wavefronts").get<std::uint64_t>()) << key;
    if (k.at("role") == "dq" || k.at("role") == "causal_dq" || k.at("role") == "output" ||
        k.at("role") == "causal_chunk") {
      ASSERT_TRUE(k.contains("model_wavefronts_per_block")) << key;
      EXPECT_GT(k.at("model_wavefronts_per_block").get<double>(), 0.0) << key;
      EXPECT_GE(k.at("blocks").get<double>(), 1.0) << key;
    }
  }
  for (const char* key : {"non-causal:forward:output", "non-causal:backward:dq", "causal:forward:causal_chunk",
                          "causal:backward:causal_dq"})
    EXPECT_TRUE(seen.count(key)) << key << " missing from " << b.at("kernels").dump();
  EXPECT_EQ(summed, b.at("total_wavefronts").get<std::uint64_t>());
  ASSERT_TRUE(write_report(*r, dir));
  const std::string md = slurp(dir / "report.md");
  EXPECT_NE(md.find("## Shared-memory bank conflicts (host-profiled)"), std::string::npos);
  EXPECT_NE(md.find(worst.at("site").get<std::string>()), std::string::npos);
  EXPECT_NE(md.find("| causal | pass | role | wavefronts | conflict-free | model per block | emulator / model |"),
            std::string::npos);
  const fs::path schema = fs::path(LUNAJIT_SOURCE_DIR) / "docs/report_schema.json";
  const std::string script = fs::path(LUNAJIT_SOURCE_DIR) / "tests/report/validate_report.py";
  EXPECT_EQ(run(fmt::format("{} {} {} {}", LUNAJIT_PYTHON3, script, schema.string(), (dir / "report.json").string())), 0);
  fs::remove_all(dir);
}

TEST_F(ReportFiles, PredictedWithoutAGpuForEveryArchAndKernel) {
  const json& r = report_;
  EXPECT_EQ(r["schema_version"], kReportSchemaVersion);
  const bool have_gpu = !r["machine"]["device"].is_null();
  if (!have_gpu) {
    EXPECT_EQ(r["machine"]["mode"], "predicted");
  }
  std::set<std::string> archs, roles;
  for (const auto& k : r["kernels"]) {
    archs.insert(k["arch"].get<std::string>());
    roles.insert(k["pass"].get<std::string>() + ":" + k["kernel"].get<std::string>());
    if (!have_gpu) {
      EXPECT_EQ(k["status"], "predicted");
      EXPECT_TRUE(k["measured"].is_null());
    }
    ASSERT_FALSE(k["resources"].is_null()) << k.dump();
    EXPECT_GT(k["resources"]["registers"].get<int>(), 0);
    ASSERT_FALSE(k["occupancy"].is_null());
    EXPECT_GT(k["occupancy"]["fraction"].get<double>(), 0);
    ASSERT_FALSE(k["predicted"].is_null());
    EXPECT_GT(k["predicted"]["time_ms"].get<double>(), 0);
    EXPECT_EQ(k["config"]["how"], "default (untuned)");
    // The row's cost is the cost model's for its own config and shape.
    const TileConfig config = tile_config_from_json(k["config"]["tile"], TileConfig()).value_or_throw();
    AttentionSpec spec = default_spec(Family::luna);
    spec.causal = k["causal"].get<bool>();
    const ProblemShape shape{k["shape"]["batch"], k["shape"]["heads"], k["shape"]["seq"]};
    // At the split count the row's plan runs (the model's pick for the product).
    const int splits = k["launch"]["splits"].get<int>();
    EXPECT_GE(splits, 1);
    EXPECT_LE(splits, config.state_splits());
    const auto cost = kernel_counts(spec, config.with_state_splits(splits),
                                    parse_pass(k["pass"].get<std::string>()).value_or_throw(),
                                    k["kernel"].get<std::string>(), shape)
                          .value_or_throw();
    EXPECT_EQ(k["cost"]["bytes"].get<double>(), cost.bytes);
    EXPECT_EQ(k["cost"]["flops"].get<double>(), cost.flops);
    EXPECT_EQ(k["cost"]["shared_wavefronts"].get<double>(), cost.smem_wavefronts);
    // The model's limiting resource, and the compiled kernel's PTX census.
    EXPECT_FALSE(k["predicted"]["limiter"].get<std::string>().empty());
    ASSERT_FALSE(k["ptx_census"].is_null()) << k["kernel"];
    EXPECT_GT(k["ptx_census"]["ld_global"].get<int64_t>() + k["ptx_census"]["ld_shared"].get<int64_t>(), 0)
        << k["kernel"] << ": a kernel that loads nothing";
    // Every GEMM-shaped kernel of a tensor-core config shows its mma and
    // ldmatrix; the causal kernels: ReportCensus below.
    const std::string role = k["kernel"].get<std::string>();
    const std::set<std::string> gemm = {"state",  "output", "causal_chunk", "dq",
                                        "dkv",    "dstate", "causal_dq",    "causal_dkv"};
    if (config.mma() && gemm.count(role)) {
      EXPECT_GT(k["ptx_census"]["mma"].get<int64_t>(), 0) << k["pass"] << " " << role << " " << k["arch"];
      EXPECT_GT(k["ptx_census"]["ldmatrix"].get<int64_t>(), 0) << k["pass"] << " " << role << " " << k["arch"];
    }
    if (!gemm.count(role)) {
      EXPECT_EQ(k["ptx_census"]["mma"].get<int64_t>(), 0) << k["pass"] << " " << role;
    }
  }
  EXPECT_EQ(archs, (std::set<std::string>{"sm_80", "sm_90", "sm_100"}));
  EXPECT_TRUE(roles.count("feature_map:feature_map"));
  EXPECT_TRUE(roles.count("forward:state"));
  EXPECT_TRUE(roles.count("forward:output"));
  // The backward is reported when the generator accepts it, else listed as skipped with the reason;
  // reported, every backward kernel has a cost and a predicted time (checked in the loop above).
  for (const auto& p : r["passes"]) {
    if (p["pass"] == "backward" && p["status"] == "skipped") {
      EXPECT_FALSE(p["note"].get<std::string>().empty());
    }
    if (p["pass"] == "backward" && p["status"] == "reported") {
      for (const char* role : p["causal"].get<bool>()
                                  ? std::vector<const char*>{"causal_dq", "causal_dkv", "param_reduce", "param_sum"}
                                  : std::vector<const char*>{"state", "dstate", "dq", "dkv", "param_reduce", "param_sum"})
        EXPECT_TRUE(roles.count(std::string("backward:") + role)) << role;
    }
  }
  // sm_100 is predicted on its representative product.
  for (const auto& a : r["archs"])
    if (a["arch"] == "sm_100") {
      EXPECT_EQ(a["gpu"]["key"], "b200");
    }
}

// Every cell of the Markdown table equals the JSON's value, as text and as a number.
void expect_row_matches(const json& kernel, const std::vector<std::string>& cells, const std::string& where) {
  const auto& cols = kernel_table_columns();
  ASSERT_EQ(cells.size(), cols.size()) << where;
  for (size_t c = 0; c < cols.size(); ++c) {
    EXPECT_EQ(cells[c], cell_text(kernel, cols[c])) << where << " column " << cols[c].header;
    if (!cols[c].numeric || cells[c] == "-") continue;
    const double want = kernel.at(json::json_pointer(cols[c].pointer)).get<double>();
    EXPECT_NEAR(std::stod(cells[c]), want, std::fabs(want) * 1e-3) << where << " column " << cols[c].header;
  }
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(' '), b = s.find_last_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

TEST_F(ReportFiles, MarkdownNumbersEqualTheJson) {
  const std::string md = slurp(dir_ / "report.md");
  std::istringstream in(md.substr(md.find("## Kernels")));
  std::string line;
  std::vector<std::vector<std::string>> rows;
  int table_line = 0;
  while (std::getline(in, line)) {
    if (line.rfind("|", 0) != 0) {
      if (table_line > 0) break;
      continue;
    }
    if (table_line++ < 2) continue;  // header, rule
    std::vector<std::string> cells;
    size_t pos = 1;
    while (pos < line.size()) {
      const size_t bar = line.find(" |", pos);
      if (bar == std::string::npos) break;
      cells.push_back(trim(line.substr(pos, bar - pos)));
      pos = bar + 2;
    }
    rows.push_back(cells);
  }
  ASSERT_EQ(rows.size(), report_["kernels"].size());
  for (size_t i = 0; i < rows.size(); ++i) expect_row_matches(report_["kernels"][i], rows[i], fmt::format("md row {}", i));
}

std::string html_unescape(std::string s) {
  for (auto [from, to] : {std::pair{"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&amp;", "&"}}) {
    size_t p = 0;
    while ((p = s.find(from, p)) != std::string::npos) s.replace(p, std::strlen(from), to), p += std::strlen(to);
  }
  return s;
}

TEST_F(ReportFiles, HtmlNumbersEqualTheJson) {
  const std::string html = slurp(dir_ / "report.html");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);  // self-contained
  const std::regex row_re("<tr class=\"kernel\" data-index=\"([0-9]+)\">(.*?)</tr>");
  const std::regex cell_re("<td[^>]*>(.*?)</td>");
  size_t n = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), row_re); it != std::sregex_iterator(); ++it, ++n) {
    const size_t index = std::stoul((*it)[1]);
    ASSERT_EQ(index, n);
    const std::string row = (*it)[2];
    std::vector<std::string> cells;
    for (auto c = std::sregex_iterator(row.begin(), row.end(), cell_re); c != std::sregex_iterator(); ++c)
      cells.push_back(html_unescape((*c)[1]));
    expect_row_matches(report_["kernels"][index], cells, fmt::format("html row {}", index));
  }
  EXPECT_EQ(n, report_["kernels"].size());
}

// ------------------------------------------------------------------ screenshot
struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  const uint8_t* at(int x, int y) const { return &rgb[(size_t(y) * width + x) * 3]; }
};

Image read_png(const fs::path& path) {
  Image img;
  png_image png{};
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&png, path.c_str())) return img;
  png.format = PNG_FORMAT_RGB;
  img.rgb.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, img.rgb.data(), 0, nullptr)) return {};
  img.width = png.width;
  img.height = png.height;
  return img;
}

int hex(const char* c, int i) { return std::stoi(std::string(c + 1 + 2 * i, 2), nullptr, 16); }

// Pixels within `tol` per channel of `color` inside the rectangle.
int count_color(const Image& img, int x0, int y0, int w, int h, const char* color, int tol = 10) {
  int n = 0;
  for (int y = std::max(0, y0); y < std::min(img.height, y0 + h); ++y)
    for (int x = std::max(0, x0); x < std::min(img.width, x0 + w); ++x) {
      const uint8_t* p = img.at(x, y);
      if (std::abs(p[0] - hex(color, 0)) <= tol && std::abs(p[1] - hex(color, 1)) <= tol &&
          std::abs(p[2] - hex(color, 2)) <= tol)
        ++n;
    }
  return n;
}

TEST_F(ReportFiles, HtmlRendersInHeadlessChromiumWithTheChartsDrawn) {
  const std::string chromium = LUNAJIT_CHROMIUM;
  ASSERT_FALSE(chromium.empty()) << "chromium not found: install Debian's chromium (scripts/install_deps.sh)";
  const fs::path shot = dir_ / "screenshot.png";
  const fs::path profile = dir_ / "chromium-profile";
  fs::remove(shot);
  fs::create_directories(profile);
  const std::string cmd = fmt::format(
      "timeout 60 {} --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
      "--disable-background-networking --disable-component-update --disable-sync --hide-scrollbars "
      "--force-device-scale-factor=1 --user-data-dir={} --screenshot={} --window-size=1200,2400 file://{} "
      ">{} 2>&1",
      chromium, profile.string(), shot.string(), fs::absolute(dir_ / "report.html").string(),
      (dir_ / "chromium.log").string());
  ASSERT_EQ(run(cmd), 0) << slurp(dir_ / "chromium.log");
  const Image img = read_png(shot);
  ASSERT_EQ(img.width, 1200);
  ASSERT_EQ(img.height, 2400);

  // The charts in page order: the layer time per causal variant (the default spec: non-causal only),
  // the time per pass with predicted times (no roofline-fraction panel: nothing was measured), then
  // resources per arch; below the header and the summary block.
  struct Expected { std::vector<const char*> colors; };
  std::vector<Expected> charts;
  std::vector<std::string> keys;
  std::set<std::string> measured;  // keys with a measured kernel (on a GPU: the forward passes)
  for (const auto& k : report_["kernels"]) {
    if (k["predicted"].is_null()) continue;
    std::string key = k["pass"].get<std::string>() + (k["causal"].get<bool>() ? "c" : "");
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    if (!k["measured"].is_null()) measured.insert(key);
  }
  const std::vector<const char*> arch_colors = {kSeriesColors[0], kSeriesColors[1], kSeriesColors[2]};
  charts.push_back({arch_colors});  // layer time, LUNA and both baselines per arch
  for (const std::string& key : keys) {
    charts.push_back({arch_colors});  // time: one line per arch
    // fraction: the measured arch only (the others have no measurement)
    if (measured.count(key)) charts.push_back({{}});
  }
  for (int a = 0; a < 3; ++a) charts.push_back({{kResourceColors[0], kResourceColors[1], kResourceColors[2]}});
  const int charts_top = kHeaderHeight + summary_html_height(report_["summary"]);
  int checked = 0;
  for (size_t i = 0; i < charts.size(); ++i) {
    const int x = kChartsLeft + int(i % 2) * (kChartWidth + kChartGap);
    const int y = charts_top + int(i / 2) * (kChartHeight + kChartGap);
    if (y + kChartHeight > img.height) break;
    SCOPED_TRACE(fmt::format("chart {} at ({}, {})", i, x, y));
    // The chart's own white background, inside its frame: the layout is where the test expects it.
    EXPECT_GT(count_color(img, x + 5, y + 5, 20, 10, "#ffffff", 2), 150);
    for (const char* color : charts[i].colors)
      EXPECT_GT(count_color(img, x, y, kChartWidth, kChartHeight, color), 20) << color;
    ++checked;
  }
  EXPECT_GE(checked, 6);
  // Between the charts there is nothing of the series colours (the gap is page background).
  EXPECT_EQ(count_color(img, kChartsLeft + kChartWidth + 1, charts_top, kChartGap - 2, kChartHeight,
                        kSeriesColors[1]), 0);
  // The summary block above the charts holds its tables: dark text on the page inside it, none of
  // the charts' white-framed SVGs (their border colour #cccccc runs the width of a chart).
  EXPECT_GT(count_color(img, kChartsLeft, kHeaderHeight, 1100, charts_top - kHeaderHeight, "#222222", 40), 500);
}

// ------------------------------------------------------------------ on a GPU
TEST(ReportOnGpu, MeasuredTimesOfTheDevicesArch) {
  auto gpu = CudaBackend::create();
  if (!gpu) GTEST_SKIP() << "no GPU: " << gpu.error().message;
  ReportOptions opt;
  opt.archs = {(*gpu)->arch()};
  opt.shapes = parse_shapes("2,8,1024").value_or_throw();
  opt.measure_repeats = 3;
  auto r = build_report(default_spec(Family::luna), opt);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ((*r)["machine"]["mode"], "measured");
  int measured = 0;
  for (const auto& k : (*r)["kernels"]) {
    if (k["pass"] == "backward") continue;  // not measured yet
    ASSERT_FALSE(k["measured"].is_null()) << k.dump();
    ++measured;
    const json& m = k["measured"];
    EXPECT_GT(m["time_ms"].get<double>(), 0);
    // The roofline is a bound: no kernel beats it by more than timing noise.
    EXPECT_LT(m["roofline_fraction"].get<double>(), 1.2) << k.dump();
    EXPECT_NEAR(m["gbps"].get<double>(), k["cost"]["bytes"].get<double>() / (m["time_ms"].get<double>() * 1e6),
                1e-6 * m["gbps"].get<double>());
  }
  EXPECT_GE(measured, 3);
  // The summary takes the measured forward and says the total mixes it with the predicted backward.
  const json& cell = (*r)["summary"]["rows"][0]["cells"][0];
  EXPECT_EQ(cell["forward_source"], "measured");
  EXPECT_EQ(cell["backward_source"], "predicted");
  EXPECT_EQ(cell["total_source"], "mixed");
  EXPECT_NE(render_html(*r).find("Fraction of roofline by sequence length: forward"), std::string::npos);
}

// ------------------------------------------------------------------ CLI and compare
TEST(ReportCli, WritesReportAndCompare) {
  const fs::path base = fs::path(LUNAJIT_REPORT_TEST_DIR) / "cli";
  fs::remove_all(base);
  const std::string cli = LUNAJIT_CLI;
  const std::string spec = R"('{"family": "elu", "head_dim": 32, "value_dim": 32}')";
  ASSERT_EQ(run(fmt::format("{} report {} --arch sm_80 --shapes '1,2,64;1,2,256' --no-compile --no-measure "
                            "--out {} >/dev/null",
                            cli, spec, (base / "a").string())), 0);
  ASSERT_EQ(run(fmt::format("{} report {} --arch sm_90,sm_100 --shapes 1,2,64 --causal both --no-compile "
                            "--no-measure --out {} >/dev/null",
                            cli, spec, (base / "b").string())), 0);
  for (const char* f : {"a/report.json", "a/report.md", "a/report.html", "b/report.json"})
    EXPECT_TRUE(fs::exists(base / f)) << f;
  const json b = json::parse(slurp(base / "b/report.json"));
  bool causal = false, noncausal = false;
  for (const auto& k : b["kernels"]) (k["causal"].get<bool>() ? causal : noncausal) = true;
  EXPECT_TRUE(causal && noncausal);

  ASSERT_EQ(run(fmt::format("{} report compare {} {} --out {} >/dev/null", cli, (base / "a/report.json").string(),
                            (base / "b/report.json").string(), (base / "cmp").string())), 0);
  const std::string md = slurp(base / "cmp/compare.md");
  EXPECT_NE(md.find("a sm_80"), std::string::npos);
  EXPECT_NE(md.find("b sm_100"), std::string::npos);
  const std::string html = slurp(base / "cmp/compare.html");
  EXPECT_NE(html.find("<svg"), std::string::npos);
  // The multi-arch summary page: one summary of both reports, columns "label arch", speedups
  // against the first column unless --reference says otherwise.
  EXPECT_NE(md.find("## Summary: time per layer by arch (reference a sm_80)"), std::string::npos);
  EXPECT_NE(html.find("<table id=\"summary\">"), std::string::npos);
  EXPECT_NE(html.find("<table id=\"baselines\">"), std::string::npos);
  EXPECT_NE(html.find("data-column=\"b sm_100\" data-field=\"speedup\""), std::string::npos);
  EXPECT_NE(html.find("id=\"compare\""), std::string::npos);  // the side-by-side table stays
  ASSERT_EQ(run(fmt::format("{} report compare {} {} --reference 'b sm_90' --out {} >/dev/null", cli,
                            (base / "a/report.json").string(), (base / "b/report.json").string(),
                            (base / "cmp2").string())), 0);
  const std::string html2 = slurp(base / "cmp2/compare.html");
  EXPECT_NE(html2.find("b sm_90 = reference"), std::string::npos);
  EXPECT_NE(html2.find("data-column=\"b sm_90\" data-field=\"speedup\">1</td>"), std::string::npos);
  EXPECT_EQ(run(fmt::format("{} report compare {} --reference sm_75 --out {} 2>/dev/null", cli,
                            (base / "a/report.json").string(), (base / "cmp3").string())), 2);
  EXPECT_EQ(run(fmt::format("{} report {} --arch sm_80 --shapes 1,2,64 --reference sm_90 --no-compile --no-measure "
                            "--out {} 2>/dev/null", cli, spec, (base / "c").string())), 2);

  // Bad input: exit 2 with the field named.
  EXPECT_EQ(run(fmt::format("{} report --shapes 1,2 --no-compile --out {} 2>/dev/null", cli, (base / "x").string())), 2);
  EXPECT_EQ(run(fmt::format("{} report --arch sm_1 --no-compile --out {} 2>/dev/null", cli, (base / "x").string())), 2);
  std::ofstream(base / "old.json") << R"({"schema": "lunajit.report", "schema_version": 99})";
  EXPECT_EQ(run(fmt::format("{} report compare {} --out {} 2>/dev/null", cli, (base / "old.json").string(),
                            (base / "y").string())), 2);
}

// Issue 15: `report compare` of a directory, a tuning database or a report
// missing fields was an internal error; each is exit 2 naming the file.
TEST(ReportCompare, RejectsADirectoryATuningDbAndAnIncompleteReport) {
  const fs::path base = fs::path(LUNAJIT_REPORT_TEST_DIR) / "compare-bad";
  fs::remove_all(base);
  fs::create_directories(base / "dir");
  std::ofstream(base / "db.json") << R"({"schema": 1, "entries": []})";
  std::ofstream(base / "partial.json") << R"({"schema": "lunajit.report", "schema_version": 1, "kernels": []})";
  std::ofstream(base / "schema_number.json") << R"({"schema": 7})";
  for (const fs::path& p : {base / "dir", base / "db.json", base / "partial.json", base / "schema_number.json"}) {
    auto r = read_report_file(p);
    ASSERT_FALSE(r.ok()) << p;
    EXPECT_EQ(r.error().kind, ErrorKind::invalid_argument) << r.error().message;
    EXPECT_NE(r.error().message.find(p.string()), std::string::npos) << r.error().message;
  }
  const std::string cli = LUNAJIT_CLI;
  for (const char* f : {"dir", "db.json", "partial.json"})
    EXPECT_EQ(run(fmt::format("{} report compare {} --out {} 2>/dev/null", cli, (base / f).string(),
                              (base / "out").string())), 2) << f;
}

// The reader of `report compare` (report/report_reader.h): what write_report
// writes is accepted; a field the comparison reads that is missing or of the
// wrong type is an error naming it (JSON pointer), where the renderer used to
// throw (issue: "report compare of a report missing fields" was an internal
// error); a directory or a tuning database is not a report. The same checks
// run under libFuzzer in tests/fuzz/report_compare_fuzzer.
TEST(ReportReader, AcceptsWrittenReportsAndNamesAMissingOrMistypedField) {
  ReportOptions opt;
  opt.archs = {arch_from_sm(80).value_or_throw()};
  opt.shapes = parse_shapes("1,2,64").value_or_throw();
  opt.compile = false;
  opt.measure = false;
  auto built = build_report(default_spec(Family::elu), opt);
  ASSERT_TRUE(built) << built.error().message;
  const fs::path dir = fs::path(LUNAJIT_REPORT_TEST_DIR) / fmt::format("reader-{}", ::getpid());
  fs::remove_all(dir);
  ASSERT_TRUE(write_report(*built, dir));
  auto read = read_report_file(dir / "report.json");
  ASSERT_TRUE(read) << read.error().message;
  EXPECT_EQ(*read, *built);
  EXPECT_FALSE(render_compare_html({*read}, {"a"}).empty());

  auto error_of = [](const json& j) {
    auto r = parse_report(j.dump(), "r.json");
    return r ? std::string("accepted") : r.error().message;
  };
  json bad = *built;
  bad["kernels"][0]["shape"].erase("seq");
  EXPECT_EQ(error_of(bad), "report compare: r.json: /kernels/0/shape/seq: missing");
  bad["kernels"][0]["shape"]["seq"] = 1e82;  // get<int>() of it was undefined behaviour
  EXPECT_EQ(error_of(bad), "report compare: r.json: /kernels/0/shape/seq = 1e+82: expected an integer in the range of int");
  bad = *built;
  bad["machine"]["mode"] = 5;
  EXPECT_EQ(error_of(bad), "report compare: r.json: /machine/mode = 5: expected a string");
  bad = *built;
  bad.erase("kernels");
  EXPECT_EQ(error_of(bad), "report compare: r.json: /kernels: missing");
  EXPECT_NE(error_of(json{{"schema", 5}}).find("is not a lunajit report"), std::string::npos);
  EXPECT_NE(error_of(json{{"schema", "lunajit.report"}, {"schema_version", "1"}}).find("schema_version \"1\""),
            std::string::npos);

  auto not_a_file = read_report_file(dir);
  ASSERT_FALSE(not_a_file);
  EXPECT_NE(not_a_file.error().message.find("is not a regular file"), std::string::npos) << not_a_file.error().message;
  std::ofstream(dir / "tuning.json") << R"({"schema": 1, "entries": []})";
  auto tuning = read_report_file(dir / "tuning.json");
  ASSERT_FALSE(tuning);
  EXPECT_NE(tuning.error().message.find("is not a lunajit report"), std::string::npos);
  fs::remove_all(dir);
}

// ------------------------------------------------------------------ summary (issue 11 item 6)
// Every <td data-row data-column data-field> of the summary and baseline tables of `html`, as
// {(row, column, field) -> text}.
std::map<std::tuple<int, std::string, std::string>, std::string> summary_cells(const std::string& html) {
  std::map<std::tuple<int, std::string, std::string>, std::string> out;
  const std::regex cell_re("<td data-row=\"([0-9]+)\" data-column=\"([^\"]*)\" data-field=\"([a-z_]+)\"[^>]*>(.*?)</td>");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), cell_re); it != std::sregex_iterator(); ++it)
    out[{std::stoi((*it)[1]), html_unescape((*it)[2]), (*it)[3]}] = html_unescape((*it)[4]);
  return out;
}

// The summary's cells as re-read from report.html equal the JSON's figures, and those figures are
// the kernels' own: forward = the sum of the forward kernels' predicted ms at the arch and shape,
// total = forward + backward, tokens/s = B N / total.
TEST_F(ReportFiles, SummaryCellsInHtmlEqualTheJson) {
  const json& sum = report_["summary"];
  ASSERT_TRUE(sum.is_object());
  const auto cells = summary_cells(slurp(dir_ / "report.html"));
  const std::vector<std::string> baseline = {"predicted_total_ms", "softmax_ms", "eager_ms", "vs_softmax", "vs_eager"};
  size_t checked = 0;
  ASSERT_EQ(sum["rows"].size(), 4u);  // the four shapes, non-causal
  for (size_t ri = 0; ri < sum["rows"].size(); ++ri) {
    const json& row = sum["rows"][ri];
    ASSERT_EQ(row["cells"].size(), 3u);
    for (const auto& cell : row["cells"]) {
      const std::string col = cell["column"].get<std::string>();
      std::vector<std::string> fields = summary_fields();
      fields.insert(fields.end(), baseline.begin(), baseline.end());
      for (const std::string& f : fields) {
        auto it = cells.find({int(ri), col, f});
        ASSERT_NE(it, cells.end()) << ri << " " << col << " " << f;
        EXPECT_EQ(it->second, summary_cell_text(cell, f)) << ri << " " << col << " " << f;
        if (cell.contains(f) && cell[f].is_number()) {
          EXPECT_NEAR(std::stod(it->second), cell[f].get<double>(), std::fabs(cell[f].get<double>()) * 1e-3) << f;
        }
        ++checked;
      }
      // Independently of the summary code: the kernels' predicted times.
      double fwd = 0, bwd = 0;
      for (const auto& k : report_["kernels"]) {
        if (k["arch"] != col || k["shape"] != row["shape"] || k["causal"] != row["causal"]) continue;
        if (k["pass"] == "forward") fwd += k["predicted"]["time_ms"].get<double>();
        if (k["pass"] == "backward") bwd += k["predicted"]["time_ms"].get<double>();
      }
      EXPECT_DOUBLE_EQ(cell["forward_ms"].get<double>(), fwd);
      EXPECT_DOUBLE_EQ(cell["backward_ms"].get<double>(), bwd);
      EXPECT_DOUBLE_EQ(cell["total_ms"].get<double>(), fwd + bwd);
      EXPECT_EQ(cell["total_source"], "predicted");
      const double tokens = row["shape"]["batch"].get<double>() * row["shape"]["seq"].get<double>();
      EXPECT_DOUBLE_EQ(cell["tokens_per_s"].get<double>(), tokens / ((fwd + bwd) * 1e-3));
      // The baselines are the model's for this GPU and shape.
      AttentionSpec spec = default_spec(Family::luna);
      const ProblemShape shape{row["shape"]["batch"], row["shape"]["heads"], row["shape"]["seq"]};
      const GpuSpec* gpu = find_gpu(cell["gpu"].get<std::string>());
      ASSERT_NE(gpu, nullptr);
      EXPECT_DOUBLE_EQ(cell["softmax_ms"].get<double>(), softmax_attention_baseline(spec, shape, *gpu).total_ms());
      EXPECT_DOUBLE_EQ(cell["eager_ms"].get<double>(), eager_linear_attention_baseline(spec, shape, *gpu).total_ms());
      EXPECT_EQ(cell["config"], "fwd default; bwd default");
    }
  }
  EXPECT_EQ(checked, 4u * 3u * (summary_fields().size() + baseline.size()));
  // The Markdown says the same: its summary header and one crossover line per arch.
  const std::string md = slurp(dir_ / "report.md");
  EXPECT_NE(md.find("## Summary: time per layer by arch (reference sm_80)"), std::string::npos);
  EXPECT_EQ(sum["crossover"].size(), 3u);
}

// speedup = the reference column's total / this column's total; the reference's own is 1.
TEST_F(ReportFiles, SpeedupAgainstTheReferenceArch) {
  for (const std::string& reference : {std::string(""), std::string("sm_90"), std::string("sm_100")}) {
    auto s = build_summary({report_}, {""}, reference);
    ASSERT_TRUE(s) << s.error().message;
    const std::string ref = reference.empty() ? "sm_80" : reference;
    EXPECT_EQ((*s)["reference"], ref);
    for (const auto& row : (*s)["rows"]) {
      double ref_total = 0;
      for (const auto& cell : row["cells"])
        if (cell["column"] == ref) ref_total = cell["total_ms"].get<double>();
      ASSERT_GT(ref_total, 0);
      for (const auto& cell : row["cells"]) {
        if (cell["column"] == ref) {
          EXPECT_EQ(cell["speedup"].get<double>(), 1.0);
        }
        EXPECT_DOUBLE_EQ(cell["speedup"].get<double>(), ref_total / cell["total_ms"].get<double>());
      }
    }
    // The HTML prints the reference's speedups as 1 and names the reference column.
    json r = report_;
    r["summary"] = *s;
    const auto cells = summary_cells(render_html(r));
    for (size_t ri = 0; ri < (*s)["rows"].size(); ++ri) EXPECT_EQ(cells.at({int(ri), ref, "speedup"}), "1");
    EXPECT_NE(render_html(r).find(ref + " = reference"), std::string::npos);
  }
  auto bad = build_summary({report_}, {""}, "sm_75");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(bad.error().message.find("sm_80, sm_90, sm_100"), std::string::npos) << bad.error().message;
}

// A report made by hand: one arch (sm_90, H100), forward and backward kernels whose predicted
// times are `factors` x the softmax baseline's at seq 256, 512, 1024, 2048.
json constructed_report(const std::vector<double>& factors) {
  const AttentionSpec spec = default_spec(Family::luna);
  const GpuSpec& h100 = *find_gpu("h100");
  json kernels = json::array();
  const int seqs[] = {256, 512, 1024, 2048};
  for (size_t i = 0; i < factors.size(); ++i) {
    const ProblemShape shape{2, 8, seqs[i]};
    const BaselinePrediction sm = softmax_attention_baseline(spec, shape, h100);
    for (const char* pass : {"forward", "backward"})
      kernels.push_back({{"arch", "sm_90"}, {"gpu", "h100"}, {"pass", pass}, {"causal", false}, {"kernel", "k"},
                         {"shape", {{"batch", 2}, {"heads", 8}, {"seq", seqs[i]}}},
                         {"config", {{"how", "default (untuned)"}}},
                         {"predicted", {{"time_ms", factors[i] * (pass == std::string("forward") ? sm.forward.ms : sm.backward.ms)}}},
                         {"measured", nullptr}});
  }
  return {{"schema", "lunajit.report"}, {"schema_version", kReportSchemaVersion}, {"spec", to_json(spec)},
          {"spec_hash", spec_hash(spec)}, {"generator", {{"created_utc", "2025-01-01T00:00:00Z"}}},
          {"machine", {{"mode", "predicted"}, {"device", nullptr}}},
          {"archs", {{{"arch", "sm_90"}, {"gpu", {{"key", "h100"}, {"name", "NVIDIA H100 SXM5 80GB"}}}}}},
          {"kernels", kernels}};
}

TEST(Summary, CrossoverIsTheSmallestSweptSeqWhereLunaBeatsSoftmax) {
  auto crossover_of = [](const std::vector<double>& factors) {
    auto s = build_summary({constructed_report(factors)}, {""});
    EXPECT_TRUE(s) << s.error().message;
    EXPECT_EQ((*s)["crossover"].size(), 1u);
    return (*s)["crossover"][0];
  };
  EXPECT_EQ(crossover_of({2, 1.5, 0.9, 0.5})["seq"], 1024);
  EXPECT_EQ(crossover_of({0.5, 2, 2, 2})["seq"], 256);
  EXPECT_EQ(crossover_of({2, 0.99, 1.1, 0.5})["seq"], 512);  // the smallest, not the last change
  EXPECT_EQ(crossover_of({2, 1.5, 1.01, 1.0})["seq"], nullptr);  // equal is not below
  // Rendered: the seq, or "none in the range"; a crossover marks the layer-time chart.
  auto s = build_summary({constructed_report({2, 1.5, 0.9, 0.5})}, {""}).value_or_throw();
  EXPECT_NE(summary_markdown(s).find("- non-causal, sm_90: N = 1024 (B,H = 2,8)"), std::string::npos);
  const std::vector<std::string> charts = summary_charts(s);
  ASSERT_EQ(charts.size(), 1u);
  EXPECT_NE(charts[0].find("class=\"marker\""), std::string::npos);
  EXPECT_NE(charts[0].find(">crossover sm_90</text>"), std::string::npos);
  EXPECT_NE(charts[0].find("sm_90 softmax (FA-like)"), std::string::npos);
  EXPECT_NE(charts[0].find("sm_90 eager"), std::string::npos);
  auto none = build_summary({constructed_report({2, 2, 2, 2})}, {""}).value_or_throw();
  EXPECT_NE(summary_html(none).find("non-causal, sm_90: none in the range"), std::string::npos);
  EXPECT_EQ(summary_charts(none)[0].find("class=\"marker\""), std::string::npos);
}

// The softmax baseline's formula on numbers checked by hand: H100 bf16, d = dv = 64, B 2, H 8, N 4096:
// FLOPs 4 B H N^2 d = 4 * 16 * 4096^2 * 64 = 68.72 GFLOP; at 0.7 * 989 TFLOP/s: 99.27 us (+ 3 us launch);
// bytes 16 * 4096 * (4 * 64 * 2 + 4) = 33.82 MB at 0.8 * 3350 GB/s = 12.6 us: compute bound.
TEST(Summary, SoftmaxBaselineByHand) {
  const AttentionSpec spec = default_spec(Family::luna);
  const GpuSpec& h100 = *find_gpu("h100");
  const BaselinePrediction p = softmax_attention_baseline(spec, ProblemShape{2, 8, 4096}, h100);
  EXPECT_DOUBLE_EQ(p.forward.flops, 4.0 * 16 * 4096.0 * 4096.0 * 64);
  EXPECT_DOUBLE_EQ(p.backward.flops, 2.5 * p.forward.flops);
  EXPECT_DOUBLE_EQ(p.forward.bytes, 16 * 4096.0 * (4 * 64 * 2 + 4));
  EXPECT_NEAR(p.forward.ms, p.forward.flops / (0.7 * 989e12) * 1e3 + 0.003, 1e-12);
  EXPECT_STREQ(p.forward.limiter, "tensor");
  AttentionSpec causal = spec;
  causal.causal = true;
  EXPECT_DOUBLE_EQ(softmax_attention_baseline(causal, ProblemShape{2, 8, 4096}, h100).forward.flops,
                   0.5 * p.forward.flops);
  // Short sequences are bandwidth bound.
  EXPECT_STREQ(softmax_attention_baseline(spec, ProblemShape{2, 8, 64}, h100).forward.limiter, "dram");
  // Eager: luna neural shared channels (relu output) materialises x, u, 3 x M Hm, 3 x M L, phi per token.
  const EagerFeatureMap fm = eager_feature_map(spec);
  EXPECT_DOUBLE_EQ(fm.floats, 64 + 8 + 3 * 8 * 64 + 3 * 8 * 8 + 64);
  EXPECT_EQ(fm.ops, 9);
}

// Sequence axes are log 2: a tick at every power of two in range, equally spaced.
TEST(SvgChart, Log2SequenceAxis) {
  LineChart c{"t", "sequence length", "ms", {{"a", "#1f77b4", false, {{100, 1}, {128, 2}, {1024, 3}, {4096, 4}}, ""}},
              std::nullopt, "", true, {}};
  const std::string svg = svg_line_chart(c, 580, 340);
  const std::regex tick_re("<text class=\"xtick\" x=\"([0-9.]+)\"[^>]*>([^<]*)</text>");
  std::vector<double> xs;
  std::vector<std::string> labels;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick_re); it != std::sregex_iterator(); ++it)
    xs.push_back(std::stod((*it)[1])), labels.push_back((*it)[2]);
  EXPECT_EQ(labels, (std::vector<std::string>{"128", "256", "512", "1024", "2048", "4096"}));
  for (size_t i = 2; i < xs.size(); ++i) EXPECT_NEAR(xs[i] - xs[i - 1], xs[1] - xs[0], 0.15);
  EXPECT_NE(svg.find("sequence length (log2)"), std::string::npos);
}

TEST_F(ReportFiles, SequenceAxesOfTheReportAreLog2) {
  const std::string html = slurp(dir_ / "report.html");
  const std::regex tick_re("<text class=\"xtick\"[^>]*>([^<]*)</text>");
  std::set<std::string> labels;
  size_t charts = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), tick_re); it != std::sregex_iterator(); ++it)
    labels.insert((*it)[1]);
  for (size_t p = 0; (p = html.find("sequence length (log2)", p)) != std::string::npos; ++p) ++charts;
  // Shapes 100, 128, 1024, 4096: the time charts tick 128 ... 4096.
  EXPECT_EQ(labels, (std::set<std::string>{"128", "256", "512", "1024", "2048", "4096"}));
  EXPECT_EQ(html.find("sequence length (log)"), std::string::npos);
  EXPECT_GE(charts, 4u);  // layer time, feature map, forward, backward
}

// Without a measurement there is no roofline-fraction panel; with one there is.
TEST_F(ReportFiles, NoRooflinePanelWithoutMeasurement) {
  bool measured = false;
  for (const auto& k : report_["kernels"]) measured = measured || !k["measured"].is_null();
  if (measured) GTEST_SKIP() << "measured on this machine's GPU";
  const std::string html = slurp(dir_ / "report.html");
  EXPECT_EQ(html.find("Fraction of roofline"), std::string::npos);
  EXPECT_EQ(html.find("(1 by definition)"), std::string::npos);
  json m = report_;
  m.erase("summary");
  for (auto& k : m["kernels"])
    if (k["pass"] == "forward") k["measured"] = {{"time_ms", 2 * k["predicted"]["time_ms"].get<double>()}};
  const std::string with = render_html(m);
  EXPECT_NE(with.find("Fraction of roofline by sequence length: forward (non-causal)"), std::string::npos);
  EXPECT_EQ(with.find("Fraction of roofline by sequence length: backward"), std::string::npos);
  // The measured forward shows as measured in the summary, the total as mixed.
  auto s = build_summary({m}, {""}).value_or_throw();
  EXPECT_EQ(s["rows"][0]["cells"][0]["forward_source"], "measured");
  EXPECT_EQ(s["rows"][0]["cells"][0]["total_source"], "mixed");
}

// The report's config comes from the tuning database of the arch's model
// fingerprint when it has an entry for the spec, pass and shape bucket.
TEST(ReportConfig, FromTheTuningDatabase) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("lunajit-report-db-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ::setenv("LUNAJIT_CACHE_DIR", dir.c_str(), 1);
  AttentionSpec spec = default_spec(Family::luna);
  const Arch arch = arch_from_sm(90).value_or_throw();
  const ProblemShape shape{2, 4, 1000};
  const ReportConfig before = report_config(spec, arch, Pass::forward, shape);
  EXPECT_EQ(before.how, "default (untuned)");
  EXPECT_EQ(before.config, default_config(spec, arch, Pass::forward));

  const TileConfig tuned(32, 2, 64, 64, 2);
  TuningEntry e;
  e.key = tuning_key(spec, Pass::forward, shape);
  e.config = tuned.to_json();
  e.config_name = tuned.to_string();
  e.method = "model-ranked";
  TuningDb db(BinaryCache::default_dir(), model_fingerprint(arch));
  ASSERT_TRUE(db.store(e).ok());
  const ReportConfig after = report_config(spec, arch, Pass::forward, shape);
  EXPECT_EQ(after.config, tuned);
  // The bucket is the database entry's: seq 1000 -> 1024, batch x heads 8.
  EXPECT_EQ(after.how, "model-ranked (exact bucket seq1024/bh8)");
  EXPECT_TRUE(after.tuned);
  EXPECT_EQ(after.bucket, "seq1024/bh8");
  EXPECT_FALSE(before.tuned);
  // A shape of another bucket takes the nearest entry, and says whose bucket it is.
  const ReportConfig nearest = report_config(spec, arch, Pass::forward, ProblemShape{2, 4, 3000});
  EXPECT_EQ(nearest.how, "model-ranked (nearest bucket seq1024/bh8)");

  // In the report: the kernel rows and the summary's config cell say tuned (forward) and default (backward).
  ReportOptions opt;
  opt.archs = {arch};
  opt.shapes = {shape};
  opt.compile = false;
  opt.measure = false;
  auto r = build_report(spec, opt);
  ASSERT_TRUE(r) << r.error().message;
  for (const auto& k : (*r)["kernels"]) {
    const bool fwd = k["pass"] == "forward";
    EXPECT_EQ(k["config"]["tuned"].get<bool>(), fwd) << k["pass"];
    EXPECT_EQ(k["config"]["bucket"], fwd ? json("seq1024/bh8") : json(nullptr));
    EXPECT_EQ(k["config"]["how"], fwd ? "model-ranked (exact bucket seq1024/bh8)" : "default (untuned)");
  }
  const json& cell = (*r)["summary"]["rows"][0]["cells"][0];
  EXPECT_EQ(cell["config"], "fwd tuned: model-ranked (exact bucket seq1024/bh8); bwd default");
  const std::string html = render_html(*r);
  EXPECT_NE(html.find("data-field=\"config\" class=\"text\">fwd tuned: model-ranked (exact bucket seq1024/bh8); bwd default</td>"),
            std::string::npos);
  ::unsetenv("LUNAJIT_CACHE_DIR");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lunajit::report
