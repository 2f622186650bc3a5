// Backward kernels on the host backend against the reference's exact gradients:
// every family x {causal, non-causal} x {fp32, bf16} x {default, smallest,
// largest} backward config, with n not a multiple of any tile or chunk and
// fused-QKV strides; unusual dims (d 48 / dv 40, d 96; luna M 6, L 5, Hm 24);
// every luna option; bitwise determinism of two runs; and a mutation test.
// Tolerances: those of the forward (autotune/validation.h), since dq, dk, dv
// are rounded to the I/O dtype like O and every sum is fp32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "autotune/forward_probe.h"
#include "autotune/validation.h"
#include "codegen/feature_params.h"
#include "runtime/attention_runner.h"
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
  // + one r per token + parameter slots (2 x ceil(1000 / 64) tiles x 1160 floats).
  EXPECT_EQ(backward_workspace_bytes_per_head(spec, c, 1000),
            4 * (4 + 2 * 4 * (64 * 64 + 64) + 1000 + 2 * 16 * 1160));
  spec.causal = true;
  // Causal: stabiliser slot + one denominator and one r per token + 2 parameter slots.
  EXPECT_EQ(backward_workspace_bytes_per_head(spec, c, 1000), 4 * (4 + 2 * 1000 + 2 * 1160));
  // Causal performer (no learned parameters): also the running key max M_i per token.
  AttentionSpec perf = default_spec(Family::performer);
  perf.causal = true;
  EXPECT_EQ(backward_workspace_bytes_per_head(perf, c, 1000), 4 * (4 + 2 * 1000 + 1000));
}

// ---------------------------------------------------------------- causal performer

// kernel_eps and eps large enough that a key stabiliser shared by the whole
// sequence (the old convention) moves outputs far beyond rounding, so the
// comparison with the reference tells the conventions apart, and a leak cannot
// hide in rounding.
AttentionSpec leaky_performer(double kernel_eps) {
  AttentionSpec spec = default_spec(Family::performer);
  spec.causal = true;
  spec.dtype = DType::fp32;
  spec.performer.kernel_eps = kernel_eps;
  spec.eps = 1e-3;
  return spec;
}

// Forward and backward against the reference of the running-max convention
// (docs/MATH.md §2), smallest and default chunks, several chunks per sequence.
// kernel_eps = 0.01: at 0.1 the normalized dq of every performer path, the
// untouched non-causal one included, sits at rel rms 1.2e-5 (over the 1e-5
// tolerance) from fp32 cancellation in kernel_eps's share of dphi(q),
// kernel_eps * sum_j (v_j . g_i + r_i), which is ~0 when o_i ~ the mean of v.
TEST(CausalPerformerNoFutureLeak, MatchesReferenceWithLargeKernelEps) {
  for (bool normalize : {true, false}) {
    AttentionSpec spec = leaky_performer(0.01);
    spec.normalize = normalize;
    CheckOptions opt;
    opt.shape = {1, 2, 70};
    opt.seed = 12;
    auto fwd = check_forward(host_backend(), spec, default_config(spec, sm90()), opt);
    ASSERT_TRUE(fwd.ok()) << fwd.error().message;
    EXPECT_TRUE(fwd->pass) << "forward rel rms " << fwd->rel_rms;
    for (Which w : {Which::default_config, Which::smallest}) expect_gradients_match(spec, pick(spec, w), opt);
  }
}

// Host-emulated kernels on inputs of our own: o and dq of rows i < j are bitwise
// unchanged when key j (and value j) change; later rows do change. Every value
// the kernels compute for row i < j is a function of tokens <= i only, in the
// same order, hence exact equality rather than a tolerance.
struct LeakRun {
  std::vector<float> o, dq;
};

LeakRun run_kernels(const AttentionSpec& spec, const ProblemShape& s, const std::vector<float>& q,
                    const std::vector<float>& k, const std::vector<float>& v, const std::vector<float>& dout,
                    const std::vector<float>& params) {
  Backend& be = host_backend();
  auto upload = [&](const std::vector<float>& x, int dim) {
    DeviceTensor t = make_device_tensor(be, s, dim, spec.dtype).value_or_throw();
    be.copy_to_device(t.buf, x.data(), x.size() * sizeof(float)).value_or_throw();
    return t;
  };
  const int d = spec.head_dim, dv = spec.value_dim;
  DeviceTensor tq = upload(q, d), tk = upload(k, d), tv = upload(v, dv), tg = upload(dout, dv);
  DeviceTensor to = make_device_tensor(be, s, dv, spec.dtype).value_or_throw();
  DeviceTensor tdq = make_device_tensor(be, s, d, spec.dtype).value_or_throw();
  DeviceTensor tdk = make_device_tensor(be, s, d, spec.dtype).value_or_throw();
  DeviceTensor tdv = make_device_tensor(be, s, dv, spec.dtype).value_or_throw();
  Buffer tp = be.allocate(params.size() * sizeof(float)).value_or_throw();
  be.copy_to_device(tp, params.data(), params.size() * sizeof(float)).value_or_throw();
  Buffer tdp = be.allocate(std::max<size_t>(params.size(), 1) * sizeof(float)).value_or_throw();
  auto fwd = AttentionRunner::create(be, spec, default_config(spec, sm90()), Pass::forward).value_or_throw();
  fwd.forward(s, tq.cref(), tk.cref(), tv.cref(), to.ref, tp.ptr()).value_or_throw();
  auto bwd = AttentionRunner::create(be, spec, pick(spec, Which::smallest), Pass::backward).value_or_throw();
  bwd.backward(s, tq.cref(), tk.cref(), tv.cref(), to.cref(), tg.cref(), tdq.ref, tdk.ref, tdv.ref, tp.ptr(),
               tdp.ptr())
      .value_or_throw();
  be.synchronize().value_or_throw();
  LeakRun r{std::vector<float>(v.size()), std::vector<float>(q.size())};
  be.copy_to_host(r.o.data(), to.buf, r.o.size() * sizeof(float)).value_or_throw();
  be.copy_to_host(r.dq.data(), tdq.buf, r.dq.size() * sizeof(float)).value_or_throw();
  return r;
}

TEST(CausalPerformerNoFutureLeak, PerturbingKeyJLeavesEarlierRowsBitwiseEqual) {
  const AttentionSpec spec = leaky_performer(0.1);
  const ProblemShape s{1, 2, 70};
  const int d = spec.head_dim, dv = spec.value_dim;
  std::mt19937_64 gen(31);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto draw = [&](size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = dist(gen);
    return x;
  };
  const int64_t rows = int64_t(s.batch) * s.seq * s.heads;
  const std::vector<float> q = draw(rows * d), k = draw(rows * d), v = draw(rows * dv), g = draw(rows * dv);
  const std::vector<float> params = init_params(spec, s.heads, 4);
  const LeakRun base = run_kernels(spec, s, q, k, v, g, params);
  const ParamLayout layout = param_layout(spec);
  const int64_t omega = layout.find("omega")->offset;
  // j inside a chunk, at a chunk start of the smallest backward config, and late.
  for (int j : {5, 16, 61}) {
    std::vector<float> k2 = k, v2 = v;
    for (int h = 0; h < s.heads; ++h) {
      // k_j' = omega_0: the largest exponent any key can reach, so s_j becomes the max.
      const int64_t row = (int64_t(j) * s.heads + h);
      const int64_t base_p = (spec.params_per_head ? h * layout.per_head_floats : 0) + omega;
      for (int c = 0; c < d; ++c) k2[row * d + c] = std::pow(float(d), 0.25f) * params[base_p + c];
      for (int c = 0; c < dv; ++c) v2[row * dv + c] += 1.0f;
    }
    const LeakRun pert = run_kernels(spec, s, q, k2, v2, g, params);
    bool later_changed = false;
    for (int i = 0; i < s.seq; ++i)
      for (int h = 0; h < s.heads; ++h) {
        const int64_t row = int64_t(i) * s.heads + h;
        for (int c = 0; c < dv; ++c) {
          if (i < j) EXPECT_EQ(pert.o[row * dv + c], base.o[row * dv + c]) << "o row " << i << " key " << j;
          else later_changed |= pert.o[row * dv + c] != base.o[row * dv + c];
        }
        for (int c = 0; c < d && i < j; ++c)
          EXPECT_EQ(pert.dq[row * d + c], base.dq[row * d + c]) << "dq row " << i << " key " << j;
      }
    EXPECT_TRUE(later_changed) << "key " << j << " changed nothing: the test would be vacuous";
  }
}

}  // namespace
}  // namespace lunajit
