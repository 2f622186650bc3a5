// The warp-level matrix primitives (templates/lunajit/mma.cuh) compile with
// NVRTC to real tensor-core instructions for sm_80, sm_90 and sm_120: the same
// kernels the host emulation tests run (tests/runtime/mma_test_kernels.cpp).
#include <gtest/gtest.h>

#include "runtime/nvrtc_compiler.h"
#include "tests/runtime/mma_test_kernels.h"

namespace lunajit {
namespace {

class MmaNvrtc : public ::testing::TestWithParam<int> {};

TEST_P(MmaNvrtc, PrimitivesCompileToTheirPtxInstructions) {
  const int sm = GetParam();
  NvrtcOptions o;
  o.emit_ptx = true;
  const KernelSource src = test::mma_test_kernels();
  auto r = compile_nvrtc(src, arch_from_sm(sm).value_or_throw(), o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->lowered_names.size(), src.entries.size());
  for (const char* instr :
       {"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32", "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32",
        "ldmatrix.sync.aligned.m8n8.x1.shared.b16", "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16", "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "cp.async.ca.shared.global", "cp.async.cg.shared.global",
        "cp.async.commit_group", "cp.async.wait_group", "fma.rn.relu.bf16x2", "fma.rn.bf16x2"}) {
    EXPECT_NE(r->ptx.find(instr), std::string::npos) << instr << " missing from the sm_" << sm << " PTX";
  }
  for (const auto& res : r->resources) EXPECT_EQ(res.spill_stores, 0) << res.name_expression;
}

INSTANTIATE_TEST_SUITE_P(Archs, MmaNvrtc, ::testing::Values(80, 90, 120),
                         [](const auto& info) { return "sm_" + std::to_string(info.param); });

}  // namespace
}  // namespace lunajit
