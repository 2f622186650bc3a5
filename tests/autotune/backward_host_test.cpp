// Backward kernels on the host backend against the reference's exact gradients:
// every family x {causal, non-causal} x {fp32, bf16} x {default, smallest,
// largest} backward config, with n not a multiple of any tile or chunk and
// fused-QKV strides; unusual dims (d 48 / dv 40, d 96; luna M 6, L 5, Hm 24);
// every luna option; bitwise determinism of two runs; and a mutation test.
// Tolerances: those of the forward (autotune/validation.h), since dq, dk, dv
// are rounded to the I/O dtype like O and every sum is fp32.
#include <algorithm>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "autotune/validation.h"
#include "tests/autotune/host_cases.h"

namespace lunajit {
namespace {

using namespace testing_host;

TileConfig pick(const AttentionSpec& spec, Which which) {
  if (which == Which::default_config) return default_config(spec, sm90(), Pass::backward);
  const auto all = all_valid_configs(spec, sm90(), Pass::backward);
  // The knobs the backward uses: tokens (block_tokens or chunk), warps, splits.
  auto volume = [&](const TileConfig& c) {
    const int64_t tokens = spec.causal ? c.chunk() : c.block_tokens();
    return tokens * c.threads() * (spec.causal ? 1 : c.state_splits() * c.dv_block());
  };
  auto less = [&](const TileConfig& a, const TileConfig& b) {
    return volume(a) != volume(b) ? volume(a) < volume(b) : a < b;
  };
  return which == Which::smallest ? *std::min_element(all.begin(), all.end(), less)
                                  : *std::max_element(all.begin(), all.end(), less);
}

std::string describe(const BackwardCheckReport& rep) {
  std::string s;
  for (const auto& t : rep.tensors)
    s += fmt::format("{} {:.2e}{}  ", t.name, t.rel_rms, t.pass ? "" : " FAIL");
  return s;
}

void expect_gradients_match(const AttentionSpec& spec, const TileConfig& config, const CheckOptions& opt) {
  auto rep = check_backward(host_backend(), spec, config, opt);
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  EXPECT_TRUE(rep->pass) << fmt::format("{} config {} shape b{} h{} n{}: {}", canonical_json(spec),
                                        config.to_string(), opt.shape.batch, opt.shape.heads, opt.shape.seq,
                                        describe(*rep));
  for (const auto& t : rep->tensors) {
    if (t.name == "dq" || t.name == "dv") {
      EXPECT_GT(t.rms_reference, 1e-7) << t.name << " is identically zero";
    }
  }
}

struct Case {
  Family family;
  bool causal;
  DType dtype;
  Which which;
};

class BackwardHost : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardHost, GradientsMatchReference) {
  const Case& c = GetParam();
  AttentionSpec spec = default_spec(c.family);
  spec.causal = c.causal;
  spec.dtype = c.dtype;
  const TileConfig config = pick(spec, c.which);
  SCOPED_TRACE(config.to_string());
  CheckOptions opt;
  opt.shape = {2, 2, 45};
  opt.layout = InputLayout::fused_qkv;
  opt.seed = 2;
  expect_gradients_match(spec, config, opt);
  // A single token: normalized, o = v exactly up to eps, so dq, dk and the
  // parameter gradients are ~eps and their relative error meaningless; the
  // unnormalized map keeps every gradient of order one.
  opt.shape = {1, 1, 1};
  opt.layout = InputLayout::contiguous;
  AttentionSpec raw = spec;
  raw.normalize = false;
  expect_gradients_match(raw, config, opt);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Family f : kAllFamilies)
    for (bool causal : {false, true})
      for (DType t : {DType::fp32, DType::bf16})
        for (Which w : {Which::default_config, Which::smallest, Which::largest}) out.push_back({f, causal, t, w});
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, BackwardHost, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return fmt::format("{}_{}_{}_{}", to_string(c.family), c.causal ? "causal" : "noncausal",
                                              to_string(c.dtype), which_name(c.which));
                         });


class BackwardHostDims : public ::testing::TestWithParam<DimsCase> {};

TEST_P(BackwardHostDims, GradientsMatchReference) {
  AttentionSpec spec = unusual_dims_spec(GetParam());
  spec.dtype = DType::fp32;
  CheckOptions opt;
  opt.shape = {2, 2, 70};  // not a multiple of any tile (16..128) or chunk (8..128)
  opt.seed = 4;
  expect_gradients_match(spec, default_config(spec, sm90(), Pass::backward), opt);
}

INSTANTIATE_TEST_SUITE_P(UnusualDims, BackwardHostDims, ::testing::ValuesIn(unusual_dims_cases()),
                         dims_case_name);

// Every luna option: activations, output activations, per-channel MLPs, the
// envelope, bank_coef and rff variants, shared parameters across heads.
TEST(BackwardHostLuna, EveryOption) {
  auto base = [] {
    AttentionSpec s = default_spec(Family::luna);
    s.dtype = DType::fp32;
    s.luna.projections = 4;
    s.luna.channels = 3;
    s.luna.mlp_width = 16;
    return s;
  };
  std::vector<AttentionSpec> specs;
  for (Activation a : {Activation::gelu, Activation::silu, Activation::tanh}) {
    AttentionSpec s = base();
    s.luna.activation = a;
    s.luna.output_activation = OutputActivation::softplus;
    specs.push_back(s);
  }
  AttentionSpec none = base();
  none.luna.output_activation = OutputActivation::none;
  none.normalize = false;
  specs.push_back(none);
  AttentionSpec per_channel = base();
  per_channel.luna.shared_channels = false;
  per_channel.luna.envelope = true;
  per_channel.params_per_head = false;
  specs.push_back(per_channel);
  AttentionSpec bank = base();
  bank.luna.variant = LunaVariant::bank_coef;
  bank.luna.channels = 9;
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
      opt.shape = {2, 3, 30};
      opt.seed = 6;
      expect_gradients_match(s, default_config(s, sm90(), Pass::backward), opt);
    }
}

// Two runs give bitwise-identical gradients (no atomics in any reduction).
TEST(BackwardHostDeterminism, TwoRunsAreBitwiseEqual) {
  for (bool causal : {false, true}) {
    AttentionSpec spec = default_spec(Family::luna);
    spec.causal = causal;
    spec.dtype = DType::fp32;
    CheckOptions opt;
    opt.shape = {2, 3, 100};
    opt.seed = 9;
    const TileConfig config = default_config(spec, sm90(), Pass::backward);
    auto a = check_backward(host_backend(), spec, config, opt);
    auto b = check_backward(host_backend(), spec, config, opt);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->dq, b->dq);
    EXPECT_EQ(a->dk, b->dk);
    EXPECT_EQ(a->dv, b->dv);
    ASSERT_EQ(a->dparams.size(), b->dparams.size());
    EXPECT_EQ(0, std::memcmp(a->dparams.data(), b->dparams.data(), a->dparams.size() * sizeof(float)));
  }
}

// The gradient check is not vacuous: judged against another spec's reference it fails.
TEST(BackwardHostLuna, CheckDetectsWrongGradients) {
  AttentionSpec spec = default_spec(Family::luna);
  spec.dtype = DType::fp32;
  CheckOptions opt;
  opt.shape = {1, 2, 20};
  AttentionSpec wrong = spec;
  wrong.luna.activation = Activation::gelu;
  opt.reference_spec = wrong;
  auto rep = check_backward(host_backend(), spec, default_config(spec, sm90(), Pass::backward), opt);
  ASSERT_TRUE(rep.ok()) << rep.error().message;
  EXPECT_FALSE(rep->pass);
}

// The memory the backward needs per (batch, head), beyond its inputs and outputs.
TEST(BackwardWorkspace, FormulaPerBatchHead) {
  AttentionSpec spec = default_spec(Family::luna);  // D = 64, dv = 64, 1160 parameter floats
  const TileConfig c(64, 4, 64, 64, 4);
  // Non-causal: stabiliser slot (4) + S, z and dS, dz partials (2 x 4 splits x (64*64 + 64))
  // + parameter slots (2 x ceil(1000 / 64) tiles x 1160 floats).
  EXPECT_EQ(backward_workspace_bytes_per_head(spec, c, 1000), 4 * (4 + 2 * 4 * (64 * 64 + 64) + 2 * 16 * 1160));
  spec.causal = true;
  // Causal: stabiliser slot + one denominator per token + 2 parameter slots.
  EXPECT_EQ(backward_workspace_bytes_per_head(spec, c, 1000), 4 * (4 + 1000 + 2 * 1160));
}

}  // namespace
}  // namespace lunajit
