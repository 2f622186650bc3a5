// Compile sweep: every generated kernel NVRTC must accept.
//
// One test per (family x causal x dtype) at the family's default options, plus
// unusual sizes per (family x causal) in bf16 — (a) head_dim 48, value_dim 40
// (neither a power of two, dv not a multiple of d) and (b) head_dim 96,
// value_dim 96 — with LUNA also at projections 6, channels 5, mlp_width 24.
// Each test generates the forward and feature-map passes for sm_80 and sm_90
// under default_config and compiles them; ptxas must have reported resources
// for every entry. 90 tests x 2 archs x 2 passes = 360 compiles.
//
// The compiles go through the process-wide binary cache, which lives in
// LUNAJIT_CACHE_DIR (`make test` sets build/kernel-cache): the tests of this
// executable run as separate processes under ctest and share it, and a second
// run is all cache hits.
//
// Last, a deliberately broken template instantiation (the generated LUNA
// Kernel struct without its dv_block member) must come back as compile_failed
// carrying NVRTC's diagnostic and the path of the dumped source.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "codegen/decode_source.h"
#include "codegen/generator.h"
#include "runtime/nvrtc_compiler.h"

namespace lunajit {
namespace {
namespace fs = std::filesystem;

struct SweepCase {
  std::string name;  // the test's name: "luna_causal_bf16", "elu_d48_dv40_noncausal"
  AttentionSpec spec;
};

// gtest prints a parameter when a test fails and in --gtest_list_tests: its name.
void PrintTo(const SweepCase& c, std::ostream* os) { *os << c.name << " " << canonical_json(c.spec); }

std::string causal_name(bool causal) { return causal ? "causal" : "noncausal"; }

std::vector<SweepCase> default_cases() {
  std::vector<SweepCase> cases;
  for (Family f : kAllFamilies)
    for (bool causal : {false, true})
      for (DType t : {DType::fp32, DType::fp16, DType::bf16}) {
        AttentionSpec s = default_spec(f);
        s.causal = causal;
        s.dtype = t;
        cases.push_back({std::string(to_string(f)) + "_" + causal_name(causal) + "_" + std::string(to_string(t)), s});
      }
  return cases;
}

// Built from JSON so the dims-dependent defaults (t2r / hedgehog features =
// head_dim) resolve as they do for a user's spec.
std::vector<SweepCase> unusual_size_cases() {
  std::vector<SweepCase> cases;
  const std::pair<int, int> dims[] = {{48, 40}, {96, 96}};
  for (Family f : kAllFamilies)
    for (auto [d, dv] : dims)
      for (bool causal : {false, true}) {
        nlohmann::json j = {{"family", to_string(f)}, {"head_dim", d}, {"value_dim", dv},
                            {"causal", causal},       {"dtype", "bf16"}};
        if (f == Family::luna) j["luna"] = {{"projections", 6}, {"channels", 5}, {"mlp_width", 24}};
        const std::string name = std::string(to_string(f)) + "_d" + std::to_string(d) + "_dv" +
                                 std::to_string(dv) + "_" + causal_name(causal);
        cases.push_back({name, spec_from_json(j).value_or_throw()});
      }
  return cases;
}

class CompileSweep : public ::testing::TestWithParam<SweepCase> {};

TEST_P(CompileSweep, ForwardAndFeatureMapCompile) {
  const AttentionSpec& spec = GetParam().spec;
  ASSERT_TRUE(validate(spec).ok()) << validate(spec).error().message;
  for (int sm : {80, 90}) {
    const Arch arch = arch_from_sm(sm).value_or_throw();
    const TileConfig config = default_config(spec, arch);
    const Status implementable = can_implement(spec, config, arch);
    ASSERT_TRUE(implementable.ok()) << arch.name() << " " << config.to_string() << ": "
                                    << implementable.error().message;
    for (Pass pass : {Pass::forward, Pass::feature_map}) {
      SCOPED_TRACE(arch.name() + " " + std::string(to_string(pass)) + " " + config.to_string());
      auto src = generate(spec, config, pass);
      ASSERT_TRUE(src.ok()) << src.error().message;
      ASSERT_FALSE(src->entries.empty());
      auto compiled = compile_nvrtc(*src, arch);
      ASSERT_TRUE(compiled.ok()) << compiled.error().message;
      EXPECT_FALSE(compiled->log.empty()) << "ptxas -v must have reported (the log is kept in the cache too)";
      EXPECT_EQ(compiled->resources.size(), src->entries.size());
      for (const KernelEntry& e : src->entries) {
        const KernelResources* res = compiled->find(e.name_expression);
        ASSERT_NE(res, nullptr) << e.role << ": no resources for " << e.name_expression << "\nlog:\n"
                                << compiled->log;
        EXPECT_GT(res->registers, 0) << e.role << "\nlog:\n" << compiled->log;
        EXPECT_GE(res->spill_stores, 0) << e.role;
        EXPECT_GE(res->spill_loads, 0) << e.role;
        EXPECT_FALSE(res->lowered_name.empty()) << e.role;
      }
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<SweepCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Defaults, CompileSweep, ::testing::ValuesIn(default_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(UnusualSizes, CompileSweep, ::testing::ValuesIn(unusual_size_cases()), case_name);

// The backward kernels of every family x {causal, non-causal} (bf16, default
// options and the backward's default config) for sm_80 and sm_90, with their
// resource usage. fp32/fp16 differ only in the element type of loads and stores.
class CompileSweepBackward : public ::testing::TestWithParam<std::tuple<Family, bool>> {};

TEST_P(CompileSweepBackward, BackwardCompiles) {
  AttentionSpec spec = default_spec(std::get<0>(GetParam()));
  spec.causal = std::get<1>(GetParam());
  for (int sm : {80, 90}) {
    const Arch arch = arch_from_sm(sm).value_or_throw();
    const TileConfig config = default_config(spec, arch, Pass::backward);
    ASSERT_TRUE(can_implement(spec, config, arch, Pass::backward).ok()) << arch.name() << " " << config.to_string();
    auto src = generate(spec, config, Pass::backward);
    ASSERT_TRUE(src.ok()) << src.error().message;
    auto compiled = compile_nvrtc(*src, arch);
    ASSERT_TRUE(compiled.ok()) << compiled.error().message;
    EXPECT_EQ(compiled->resources.size(), src->entries.size());
    for (const KernelEntry& e : src->entries) {
      const KernelResources* res = compiled->find(e.name_expression);
      ASSERT_NE(res, nullptr) << arch.name() << " " << e.role;
      EXPECT_GT(res->registers, 0) << arch.name() << " " << e.role;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CompileSweepBackward,
                         ::testing::Combine(::testing::ValuesIn(kAllFamilies), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<Family, bool>>& info) {
                           return std::string(to_string(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_causal" : "_noncausal");
                         });

// The decode kernel (codegen/decode_source.h) of every family that can carry
// state, fp32 and bf16, for sm_80 and sm_90: the source the host tests run,
// compiled by NVRTC.
class CompileSweepDecode : public ::testing::TestWithParam<Family> {};

TEST_P(CompileSweepDecode, DecodeCompiles) {
  for (DType t : {DType::fp32, DType::bf16}) {
    AttentionSpec spec = default_spec(GetParam());
    spec.causal = true;
    spec.dtype = t;
    for (int sm : {80, 90}) {
      const Arch arch = arch_from_sm(sm).value_or_throw();
      auto src = generate_decode(spec, default_config(spec, arch, Pass::forward));
      ASSERT_TRUE(src.ok()) << src.error().message;
      auto compiled = compile_nvrtc(*src, arch);
      ASSERT_TRUE(compiled.ok()) << compiled.error().message;
      const KernelResources* res = compiled->find("lunajit::decode_step_kernel<lunajit_gen::Kernel>");
      ASSERT_NE(res, nullptr) << arch.name();
      EXPECT_GT(res->registers, 0) << arch.name();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CompileSweepDecode,
                         ::testing::Values(Family::luna, Family::rff, Family::elu, Family::relu, Family::t2r,
                                           Family::hedgehog, Family::slay),
                         [](const ::testing::TestParamInfo<Family>& info) {
                           return std::string(to_string(info.param));
                         });

TEST(CompileSweepCounts, CoverEveryFamilyCausalAndDtype) {
  EXPECT_EQ(default_cases().size(), std::size(kAllFamilies) * 2 * 3);
  EXPECT_EQ(unusual_size_cases().size(), std::size(kAllFamilies) * 2 * 2);
}

// The generated LUNA forward source with the Kernel struct's dv_block line
// removed: the template's use of Kernel::dv_block must fail inside NVRTC.
TEST(CompileSweepBrokenTemplate, MissingKernelMemberIsCompileFailedWithLogAndDump) {
  const AttentionSpec spec = default_spec(Family::luna);
  const Arch arch = arch_from_sm(90).value_or_throw();
  KernelSource src = generate(spec, default_config(spec, arch), Pass::forward).value_or_throw();
  const std::string include = "#include \"lunajit/linear_attention_mma.cuh\"";  // mma: the bf16 default
  ASSERT_NE(src.code.find(include), std::string::npos);
  ASSERT_NE(src.code.find("lunajit::mma_state_kernel"), std::string::npos);
  const auto line = src.code.find("  static constexpr int dv_block = ");
  ASSERT_NE(line, std::string::npos) << src.code;
  src.code.erase(line, src.code.find('\n', line) + 1 - line);
  ASSERT_EQ(src.code.find("dv_block ="), std::string::npos);
  src.name = "compile_sweep_missing_dv_block";

  NvrtcOptions opts;
  opts.use_cache = false;  // a failure is never cached, but keep the shared cache out of it
  auto r = compile_nvrtc(src, arch, opts);
  ASSERT_FALSE(r.ok()) << "a Kernel without dv_block must not compile";
  EXPECT_EQ(r.error().kind, ErrorKind::compile_failed);
  const std::string& msg = r.error().message;
  EXPECT_NE(msg.find("error"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dv_block"), std::string::npos) << msg;
  const auto log_at = msg.find("log:\n");
  ASSERT_NE(log_at, std::string::npos) << msg;
  EXPECT_NE(msg.find("dv_block", log_at), std::string::npos) << "NVRTC's log must name the member\n" << msg;
  const auto at = msg.find("source: ");
  ASSERT_NE(at, std::string::npos) << msg;
  const std::string path = msg.substr(at + 8, msg.find('\n', at) - at - 8);
  EXPECT_TRUE(fs::exists(path)) << path;
}

}  // namespace
}  // namespace lunajit
