// Every family x {causal, non-causal} x {fp32, bf16} x {default, smallest,
// largest} tile config, run on the host backend and compared with the
// double-precision reference (tolerances: autotune/validation.h). Shapes cover
// n = 1, n not a multiple of any tile or chunk, batch and heads > 1 with the
// strides of a fused QKV buffer, and unusual dims (d 48/96, dv != d, M = 6,
// L = 5, Hm = 24).
#include <algorithm>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "autotune/validation.h"
#include "tests/autotune/host_cases.h"

namespace lunajit {
namespace {

using namespace testing_host;

// Configs that differ only in phi_backward run the same forward kernels. The
// scalar kernels only: the tensor-core variant (mma) has mma_host_test.cpp.
std::vector<TileConfig> forward_configs(const AttentionSpec& spec) {
  std::vector<TileConfig> out;
  for (const auto& c : all_valid_configs(spec, sm90()))
    if (c.phi_backward() == PhiInBackward::recompute && !c.mma()) out.push_back(c);
  return out;
}

int64_t volume(const TileConfig& c, const AttentionSpec& spec) {
  // "Largest" = most work per block for the kernels this spec runs.
  const int64_t tokens = spec.causal ? c.chunk() : c.block_tokens();
  return tokens * c.threads() * c.dv_block() * (spec.causal ? 1 : c.state_splits());
}

TileConfig pick(const AttentionSpec& spec, Which which) {
  if (which == Which::default_config) return default_config(spec, sm90());
  auto all = forward_configs(spec);
  auto by_volume = [&](const TileConfig& a, const TileConfig& b) {
    const int64_t va = volume(a, spec), vb = volume(b, spec);
    return va != vb ? va < vb : a < b;
  };
  return which == Which::smallest ? *std::min_element(all.begin(), all.end(), by_volume)
                                  : *std::max_element(all.begin(), all.end(), by_volume);
}

struct Case {
  Family family;
  bool causal;
  DType dtype;
  Which which;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return fmt::format("{}_{}_{}_{}", to_string(c.family), c.causal ? "causal" : "noncausal", to_string(c.dtype),
                     which_name(c.which));
}

void expect_matches_reference(const AttentionSpec& spec, const TileConfig& config, const CheckOptions& opt) {
  auto rep = check_forward(host_backend(), spec, config, opt);
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  EXPECT_TRUE(rep->pass) << fmt::format("{} config {} shape b{} h{} n{}: rel rms {:.3e} (tolerance {:.0e}), max abs {:.3e}",
                                        canonical_json(spec), config.to_string(), opt.shape.batch, opt.shape.heads,
                                        opt.shape.seq, rep->rel_rms, rep->tolerance, rep->max_abs_error);
  // The comparison must be meaningful: a zero reference would let anything pass.
  EXPECT_GT(rep->rms_reference, 1e-3);
}

class ForwardHost : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardHost, MatchesReference) {
  const Case& c = GetParam();
  AttentionSpec spec = default_spec(c.family);
  spec.causal = c.causal;
  spec.dtype = c.dtype;
  const TileConfig config = pick(spec, c.which);
  SCOPED_TRACE(config.to_string());
  // n not a multiple of any tile (8..128) or chunk; fused QKV strides; b, h > 1.
  CheckOptions opt;
  opt.shape = {2, 3, 77};
  opt.layout = InputLayout::fused_qkv;
  opt.seed = 1;
  expect_matches_reference(spec, config, opt);
  // A single token.
  opt.shape = {1, 2, 1};
  opt.layout = InputLayout::contiguous;
  expect_matches_reference(spec, config, opt);
  // Longer than the largest tile, several chunks and state splits.
  opt.shape = {1, 1, 300};
  expect_matches_reference(spec, config, opt);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (Family f : kAllFamilies)
    for (bool causal : {false, true})
      for (DType t : {DType::fp32, DType::bf16})
        for (Which w : {Which::default_config, Which::smallest, Which::largest}) cases.push_back({f, causal, t, w});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, ForwardHost, ::testing::ValuesIn(all_cases()), case_name);

// Unusual dimensions: d = 48 with dv = 40, d = 96 with dv = 96; luna with
// M = 6, L = 5, Hm = 24. Default config, fp32 and bf16.

class ForwardHostDims : public ::testing::TestWithParam<DimsCase> {};

TEST_P(ForwardHostDims, MatchesReference) {
  AttentionSpec spec = unusual_dims_spec(GetParam());
  for (DType t : {DType::fp32, DType::bf16}) {
    spec.dtype = t;
    CheckOptions opt;
    opt.shape = {2, 2, 45};
    opt.layout = InputLayout::fused_qkv;
    opt.seed = 3;
    expect_matches_reference(spec, default_config(spec, sm90()), opt);
  }
}

INSTANTIATE_TEST_SUITE_P(UnusualDims, ForwardHostDims, ::testing::ValuesIn(unusual_dims_cases()),
                         dims_case_name);

// Luna's options beyond the defaults: each activation, output activation,
// per-channel MLPs, the envelope, the two ablation variants, shared params.
TEST(ForwardHostLuna, EveryOption) {
  std::vector<AttentionSpec> specs;
  auto base = [] {
    AttentionSpec s = default_spec(Family::luna);
    s.dtype = DType::fp32;
    s.luna.projections = 4;
    s.luna.channels = 3;
    s.luna.mlp_width = 16;
    return s;
  };
  for (Activation a : {Activation::gelu, Activation::silu, Activation::tanh}) {
    AttentionSpec s = base();
    s.luna.activation = a;
    specs.push_back(s);
  }
  for (OutputActivation o : {OutputActivation::softplus, OutputActivation::none}) {
    AttentionSpec s = base();
    s.luna.output_activation = o;
    s.normalize = o != OutputActivation::none;  // signed features: unnormalized
    specs.push_back(s);
  }
  AttentionSpec per_channel = base();
  per_channel.luna.shared_channels = false;
  per_channel.luna.envelope = true;
  per_channel.params_per_head = false;
  specs.push_back(per_channel);
  AttentionSpec bank = base();
  bank.luna.variant = LunaVariant::bank_coef;
  bank.luna.channels = 9;  // the basis cycle wraps
  bank.normalize = false;
  specs.push_back(bank);
  AttentionSpec rff = base();
  rff.luna.variant = LunaVariant::rff;
  rff.luna.channels = 2;
  rff.luna.envelope = true;
  rff.normalize = false;
  specs.push_back(rff);
  for (auto& s : specs)
    for (bool causal : {false, true}) {
      s.causal = causal;
      CheckOptions opt;
      opt.shape = {2, 2, 40};
      opt.seed = 5;
      expect_matches_reference(s, default_config(s, sm90()), opt);
    }
}

// The check is not vacuous: the same kernel judged against the reference of a
// slightly different spec (causal vs not, normalized vs not) fails.
TEST(ForwardHostLuna, CheckDetectsAWrongResult) {
  AttentionSpec spec = default_spec(Family::luna);
  spec.dtype = DType::fp32;
  CheckOptions opt;
  opt.shape = {1, 2, 20};
  auto good = check_forward(host_backend(), spec, default_config(spec, sm90()), opt);
  ASSERT_TRUE(good.ok()) << good.error().message;
  EXPECT_TRUE(good->pass);
  for (auto mutate : {+[](AttentionSpec& s) { s.causal = !s.causal; },
                      +[](AttentionSpec& s) { s.normalize = !s.normalize; },
                      +[](AttentionSpec& s) { s.luna.activation = Activation::gelu; }}) {
    AttentionSpec wrong = spec;
    mutate(wrong);
    opt.reference_spec = wrong;
    auto bad = check_forward(host_backend(), spec, default_config(spec, sm90()), opt);
    ASSERT_TRUE(bad.ok()) << bad.error().message;
    EXPECT_FALSE(bad->pass) << "a mismatch went unnoticed: rel rms " << bad->rel_rms;
    EXPECT_GT(bad->rel_rms, 1e-3);
  }
}

}  // namespace
}  // namespace lunajit
