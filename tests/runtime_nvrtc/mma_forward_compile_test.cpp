// Static evidence for the tensor-core forward (TileConfig::mma): the default
// LUNA spec's non-causal state and output kernels and its causal chunk kernel,
// compiled by NVRTC for sm_80 and sm_90, contain mma.sync and ldmatrix and do
// not spill (mma is the default of a 16-bit forward); the scalar kernels of
// the same tiles contain no mma. Prints each kernel's registers, spills
// and PTX census (mma, ldmatrix, fma, ld.shared, ld.global) for the record.
// The scalar kernels' spills are not asserted here: every kernel of the
// default bf16 configs, scalar and mma, forward and backward, is checked for
// spills by default_kernel_compile_test.cpp (issue 11 item 5); this test
// adds the fp16 mma kernels.
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "codegen/cost_model.h"
#include "codegen/generator.h"
#include "codegen/launch_plan.h"
#include "report/ptx_census.h"
#include "runtime/nvrtc_compiler.h"

namespace lunajit {
namespace {

// The PTX of one kernel: its .entry and every function it calls, each once
// (report/ptx_census.h; the causal walks are out-of-line functions).
std::string kernel_text(const std::string& ptx, const std::string& lowered) {
  std::string text;
  for (const std::string_view body : report::kernel_bodies(ptx, lowered)) {
    text += body;
    text += '\n';
  }
  return text;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

struct Census {
  int mma, ldmatrix, fma, ld_shared, ld_global;
};

Census census(const std::string& t) {
  return {count(t, "mma.sync"), count(t, "ldmatrix"), count(t, "fma.rn.f32") + count(t, "fma.rn.ftz.f32"),
          count(t, "ld.shared"), count(t, "ld.global")};
}

class MmaForwardNvrtc : public ::testing::TestWithParam<std::tuple<int, DType, bool>> {};

TEST_P(MmaForwardNvrtc, TensorCoreKernelsUseMmaAndNothingSpills) {
  const auto [sm, dtype, causal] = GetParam();
  const Arch arch = arch_from_sm(sm).value_or_throw();
  AttentionSpec spec = default_spec(Family::luna);
  spec.causal = causal;
  spec.dtype = dtype;
  const TileConfig tc = default_config(spec, arch);  // mma by default for bf16/fp16
  EXPECT_TRUE(tc.mma());
  const TileConfig scalar = tc.with_mma(false);
  ASSERT_TRUE(can_implement(spec, tc, arch)) << can_implement(spec, tc, arch).error().message;
  NvrtcOptions o;
  o.emit_ptx = true;
  for (const TileConfig& config : {scalar, tc}) {
    SCOPED_TRACE(config.to_string());
    const KernelSource src = generate(spec, config, Pass::forward).value_or_throw();
    auto r = compile_nvrtc(src, arch, o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->resources.size(), src.entries.size());
    for (const KernelResources& res : r->resources) {
      const Census c = census(kernel_text(r->ptx, res.lowered_name));
      int64_t dyn_smem = -1;  // dynamic shared memory of the entry's role (launch_plan)
      std::string role;
      for (const KernelEntry& e : src.entries)
        if (e.name_expression == res.name_expression) {
          dyn_smem = dynamic_smem_bytes(spec, config, Pass::forward, e.role);
          role = e.role;
        }
      std::printf("sm_%d %s %-10s %-45s regs %3d smem %6lld spill st/ld %d/%d  mma %3d ldmatrix %3d fma %4d ld.shared %4d "
                  "ld.global %3d\n",
                  sm, std::string(to_string(dtype)).c_str(), causal ? "causal" : "non-causal",
                  res.name_expression.c_str(), res.registers, static_cast<long long>(dyn_smem),
                  res.spill_stores, res.spill_loads, c.mma, c.ldmatrix, c.fma, c.ld_shared, c.ld_global);
      const bool tensor_core = res.name_expression.rfind("lunajit::mma_", 0) == 0;
      if (config.mma()) {
        EXPECT_EQ(res.spill_stores, 0) << res.name_expression;
        EXPECT_EQ(res.spill_loads, 0) << res.name_expression;
        EXPECT_EQ(res.stack_bytes, 0) << res.name_expression;
      }
      // The GEMM-shaped roles take the tensor-core kernels with mma on; the
      // split partials' reduction (state_reduce: sums, no product) never does.
      EXPECT_EQ(tensor_core, config.mma() && role != "state_reduce") << res.name_expression;
      if (tensor_core) {
        EXPECT_GT(c.mma, 0) << res.name_expression;
        EXPECT_GT(c.ldmatrix, 0) << res.name_expression;
      } else {
        EXPECT_EQ(c.mma, 0) << res.name_expression;
      }
    }
    if (config.mma()) {
      const std::string instr = dtype == DType::bf16 ? "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
                                                     : "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
      EXPECT_NE(r->ptx.find(instr), std::string::npos) << instr;
    }
  }
}

// The tensor-core backward (bf16 and fp16, TileConfig::mma): for the default
// LUNA spec's backward tiles with mma on, the state, dstate, dq and dkv
// kernels (causal, bf16: state, causal_dq, causal_dkv) contain mma.sync and
// ldmatrix and nothing spills on sm_80 and sm_90; param_reduce, param_sum and the causal
// state scans (fixed-order sums, not GEMM-shaped) have no mma.
// The operands are bf16 for fp16 I/O too (V split into hi + lo): no f16 mma.
TEST(MmaBackwardNvrtc, GemmShapedKernelsUseMmaAndNothingSpills) {
  struct Case {
    int sm;
    DType dtype;
    bool causal;
  };
  for (auto [sm, dtype, causal] : {Case{80, DType::bf16, false}, Case{90, DType::bf16, false},
                                   Case{80, DType::fp16, false}, Case{90, DType::fp16, false},
                                   Case{80, DType::bf16, true}, Case{90, DType::bf16, true}}) {
    const Arch arch = arch_from_sm(sm).value_or_throw();
    AttentionSpec spec = default_spec(Family::luna);
    spec.causal = causal;
    spec.dtype = dtype;
    const TileConfig config = default_config(spec, arch, Pass::backward).with_mma(true);
    ASSERT_TRUE(can_implement(spec, config, arch, Pass::backward));
    NvrtcOptions o;
    o.emit_ptx = true;
    const KernelSource src = generate(spec, config, Pass::backward).value_or_throw();
    auto r = compile_nvrtc(src, arch, o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_EQ(r->resources.size(), src.entries.size());
    for (const KernelResources& res : r->resources) {
      std::string role;
      for (const KernelEntry& e : src.entries)
        if (e.name_expression == res.name_expression) role = e.role;
      const Census c = census(kernel_text(r->ptx, res.lowered_name));
      std::printf("sm_%d %s %s backward %-12s %-45s regs %3d smem %6lld spill st/ld %d/%d  mma %3d ldmatrix %3d fma "
                  "%4d ld.shared %4d ld.global %3d\n",
                  sm, std::string(to_string(dtype)).c_str(), causal ? "causal" : "non-causal", role.c_str(), res.name_expression.c_str(), res.registers,
                  static_cast<long long>(dynamic_smem_bytes(spec, config, Pass::backward, role)), res.spill_stores, res.spill_loads,
                  c.mma, c.ldmatrix, c.fma, c.ld_shared, c.ld_global);
      EXPECT_EQ(res.spill_stores, 0) << res.name_expression;
      EXPECT_EQ(res.spill_loads, 0) << res.name_expression;
      EXPECT_EQ(res.stack_bytes, 0) << res.name_expression;
      const bool gemm = role == "state" || role == "dstate" || role == "dq" || role == "dkv" || role == "causal_dq" ||
                        role == "causal_dkv";
      if (gemm) {
        EXPECT_EQ(res.name_expression.rfind("lunajit::mma_", 0), 0u) << res.name_expression;
        EXPECT_GT(c.mma, 0) << role;
        EXPECT_GT(c.ldmatrix, 0) << role;
      } else {
        EXPECT_EQ(c.mma, 0) << role;
      }
    }
    EXPECT_NE(r->ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), std::string::npos);
    EXPECT_EQ(r->ptx.find("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"), std::string::npos);
  }
}

// The cost model's feature_map_on_tensor_cores (host) against what the
// template does (MmaPhiSupport, device): a LUNA variant's mma state kernel in
// bf16 holds exactly 2 KP NP + M KH NL more mma.sync than the same variant in
// fp16 (whose feature map never takes the tensor-core form; same D, same
// config, so the same product mmas) when the model says phi is on tensor
// cores (KP = d / 16, NP = ceil(M / 8), KH = Hm / 16, NL = L / 8), and as many
// otherwise.
TEST(MmaFeatureMapNvrtc, CostModelAgreesWithTheTemplate) {
  const Arch arch = arch_from_sm(90).value_or_throw();
  NvrtcOptions o;
  o.emit_ptx = true;
  auto state_mmas = [&](const AttentionSpec& spec, const TileConfig& config) {
    const KernelSource src = generate(spec, config, Pass::forward).value_or_throw();
    auto r = compile_nvrtc(src, arch, o);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok()) return -1;
    for (const KernelResources& res : r->resources)
      if (res.name_expression.rfind("lunajit::mma_state_kernel", 0) == 0)
        return count(kernel_text(r->ptx, res.lowered_name), "mma.sync");
    ADD_FAILURE() << "no mma_state_kernel";
    return -1;
  };
  struct Variant {
    const char* what;
    void (*change)(AttentionSpec&);
    bool expect;
  };
  const Variant variants[] = {
      {"default", [](AttentionSpec&) {}, true},
      {"envelope", [](AttentionSpec& s) { s.luna.envelope = true; }, true},
      {"M 4, L 16 (a partial projection n-tile, two psi n-tiles)",
       [](AttentionSpec& s) {
         s.luna.projections = 4;
         s.luna.channels = 16;
       },
       true},
      {"separate channels", [](AttentionSpec& s) { s.luna.shared_channels = false; }, false},
      {"Hm 24", [](AttentionSpec& s) { s.luna.mlp_width = 24; }, false},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.what);
    AttentionSpec bf16 = default_spec(Family::luna);
    v.change(bf16);
    AttentionSpec fp16 = bf16;
    fp16.dtype = DType::fp16;
    const TileConfig config = default_config(bf16, arch).with_mma(true);
    ASSERT_TRUE(can_implement(bf16, config, arch)) << can_implement(bf16, config, arch).error().message;
    const bool model = feature_map_on_tensor_cores(bf16, config, Pass::forward);
    EXPECT_EQ(model, v.expect);
    EXPECT_FALSE(feature_map_on_tensor_cores(fp16, config, Pass::forward));
    const LunaOptions& l = bf16.luna;
    const int phi_mmas = 2 * (bf16.head_dim / 16) * ((l.projections + 7) / 8) +
                         l.projections * (l.mlp_width / 16) * (l.channels / 8);
    const int a = state_mmas(bf16, config), b = state_mmas(fp16, config);
    std::printf("%-45s mma.sync bf16 %d fp16 %d (model: phi on tensor cores %d)\n", v.what, a, b, model);
    EXPECT_EQ(a - b, model ? phi_mmas : 0);
  }
}

// jacobian_on_tensor_cores (host: the smem layout and the cost model) against
// the template (MmaJacobianSupport, device): the tensor-core backward's dq and
// dkv kernels hold the J^T's dh = dpre W2 products (3 split terms x L/8 x Hm/8
// in the unrolled loop body) and its dx = dU W (3 split terms x ceil(M/8)
// k-steps), the only m16n8k8 mmas of the backward (at least once each: the
// compiler may duplicate a loop body), exactly when the host says the J^T is
// on tensor cores; and neither spills.
TEST(MmaJacobianNvrtc, HostAgreesWithTheTemplate) {
  const Arch arch = arch_from_sm(80).value_or_throw();
  NvrtcOptions o;
  o.emit_ptx = true;
  struct Variant {
    const char* what;
    void (*change)(AttentionSpec&);
    bool expect;
  };
  const Variant variants[] = {
      {"default", [](AttentionSpec&) {}, true},
      {"envelope, softplus", [](AttentionSpec& s) {
         s.luna.envelope = true;
         s.luna.output_activation = OutputActivation::softplus;
       }, true},
      {"M 4, L 16, Hm 32, gelu", [](AttentionSpec& s) {
         s.luna.projections = 4;
         s.luna.channels = 16;
         s.luna.mlp_width = 32;
         s.luna.activation = Activation::gelu;
       }, true},
      {"separate channels", [](AttentionSpec& s) { s.luna.shared_channels = false; }, false},
      {"Hm 24", [](AttentionSpec& s) { s.luna.mlp_width = 24; }, false},
      {"L 4", [](AttentionSpec& s) { s.luna.channels = 4; }, false},
      {"d 24", [](AttentionSpec& s) { s.head_dim = 24; }, false},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.what);
    AttentionSpec spec = default_spec(Family::luna);
    spec.causal = false;
    spec.dtype = DType::bf16;
    v.change(spec);
    const TileConfig config = default_config(spec, arch, Pass::backward).with_mma(true);
    ASSERT_TRUE(can_implement(spec, config, arch, Pass::backward))
        << can_implement(spec, config, arch, Pass::backward).error().message;
    const bool model = jacobian_on_tensor_cores(spec, config);
    EXPECT_EQ(model, v.expect);
    const KernelSource src = generate(spec, config, Pass::backward).value_or_throw();
    auto r = compile_nvrtc(src, arch, o);
    ASSERT_TRUE(r.ok()) << r.error().message;
    for (const KernelResources& res : r->resources) {
      const bool dq = res.name_expression.rfind("lunajit::mma_dq_kernel", 0) == 0;
      const bool dkv = res.name_expression.rfind("lunajit::mma_dkv_kernel", 0) == 0;
      if (!dq && !dkv) continue;
      const int k8 = count(kernel_text(r->ptx, res.lowered_name), "mma.sync.aligned.m16n8k8");
      const int expect = 3 * (spec.luna.channels / 8) * (spec.luna.mlp_width / 8);
      const int dx_k8 = 3 * ((spec.luna.projections + 7) / 8);
      std::printf("%-28s %s m16n8k8 %3d (model: J^T on tensor cores %d, %d per loop body) regs %d spills %d\n", v.what,
                  dq ? "dq " : "dkv", k8, model, expect, res.registers, res.spill_stores);
      // At least one copy of each (ptxas may duplicate a loop body: the default
      // spec's dq holds dx's three twice), always whole groups of three split terms.
      if (model) EXPECT_GE(k8, expect + dx_k8) << res.name_expression;
      EXPECT_EQ(k8 % 3, 0) << res.name_expression;
      EXPECT_EQ(k8 > 0, model) << res.name_expression;
      EXPECT_EQ(res.spill_stores, 0) << res.name_expression;
    }
  }
}

// feature_map_on_tensor_cores for the backward (host) against the template
// (backward_phi_tile / mma_phi_split_tile: MmaPhiSupport, device). The
// backward's state and dstate kernels map phi without a J^T; against the same
// spec with separate channels (same D, dv and tiles, so the same product mmas,
// but no tensor-core form) each holds 2 KP NP (u, W split) + 3 NL (psi,
// three split terms, in the body of the loops over the projections and the
// hidden layer's k-steps, which are not unrolled) more mma.sync exactly when
// the host says phi is on tensor cores. (Spills: MmaBackwardNvrtc checks the
// default spec's kernels; ptxas holds this test's envelope + softplus + gelu
// variant's state kernel at 128 registers on sm_80 and spills 4 bytes there.)
TEST(MmaBackwardFeatureMapNvrtc, CostModelAgreesWithTheTemplate) {
  const Arch arch = arch_from_sm(80).value_or_throw();
  NvrtcOptions o;
  o.emit_ptx = true;
  auto mmas = [&](const AttentionSpec& spec, const TileConfig& config) {
    std::map<std::string, int> out;
    const KernelSource src = generate(spec, config, Pass::backward).value_or_throw();
    auto r = compile_nvrtc(src, arch, o);
    EXPECT_TRUE(r.ok()) << r.error().message;
    if (!r.ok()) return out;
    for (const KernelResources& res : r->resources) {
      for (const char* k : {"lunajit::mma_backward_state_kernel", "lunajit::mma_dstate_kernel"})
        if (res.name_expression.rfind(k, 0) == 0) out[k] = count(kernel_text(r->ptx, res.lowered_name), "mma.sync");
    }
    return out;
  };
  struct Variant {
    const char* what;
    void (*change)(AttentionSpec&);
    bool expect;
  };
  const Variant variants[] = {
      {"default", [](AttentionSpec&) {}, true},
      {"envelope, softplus, gelu", [](AttentionSpec& s) {
         s.luna.envelope = true;
         s.luna.output_activation = OutputActivation::softplus;
         s.luna.activation = Activation::gelu;
       }, true},
      {"M 4, L 16, Hm 32", [](AttentionSpec& s) {
         s.luna.projections = 4;
         s.luna.channels = 16;
         s.luna.mlp_width = 32;
       }, true},
      {"Hm 24", [](AttentionSpec& s) { s.luna.mlp_width = 24; }, false},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.what);
    AttentionSpec spec = default_spec(Family::luna);
    spec.causal = false;
    spec.dtype = DType::bf16;
    v.change(spec);
    AttentionSpec separate = spec;
    separate.luna.shared_channels = false;
    const TileConfig config = default_config(spec, arch, Pass::backward).with_mma(true);
    ASSERT_TRUE(can_implement(spec, config, arch, Pass::backward));
    ASSERT_TRUE(can_implement(separate, config, arch, Pass::backward));
    const bool model = feature_map_on_tensor_cores(spec, config, Pass::backward);
    EXPECT_EQ(model, v.expect);
    EXPECT_FALSE(feature_map_on_tensor_cores(separate, config, Pass::backward));
    const LunaOptions& l = spec.luna;
    const int phi_mmas = 2 * (spec.head_dim / 16) * ((l.projections + 7) / 8) +
                         3 * (l.channels / 8);
    const auto a = mmas(spec, config), b = mmas(separate, config);
    ASSERT_EQ(a.size(), 2u);
    ASSERT_EQ(b.size(), 2u);
    for (const auto& [kernel, n] : a) {
      std::printf("%-28s %-36s mma.sync %3d, separate channels %3d (model: phi on tensor cores %d, %d each)\n",
                  v.what, kernel.c_str(), n, b.at(kernel), model, phi_mmas);
      EXPECT_EQ(n - b.at(kernel), model ? phi_mmas : 0) << kernel;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, MmaForwardNvrtc,
                         ::testing::Combine(::testing::Values(80, 90), ::testing::Values(DType::bf16, DType::fp16),
                                            ::testing::Values(false, true)),
                         [](const auto& info) {
                           return "sm_" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::string(to_string(std::get<1>(info.param))) +
                                  (std::get<2>(info.param) ? "_causal" : "");
                         });

}  // namespace
}  // namespace lunajit
