// The analytic backward of the reference against central finite differences of
// L = sum(dO * O), for q, k, v and every learned parameter, for every family x
// {causal, non-causal} x {normalized, unnormalized (signed maps: unnormalized only)}
// x {params per head, shared}.
//
// Tolerance, per tensor: |fd_i - analytic_i| <= atol + rtol * max|analytic|, with
// rtol = 1e-6, atol = 1e-8 * sum|dO * O| and step h = 1e-6. Central differences
// err by h^2/6 |L'''| (truncation; large where a normalized query's den is small)
// plus about 2.2e-16 sum|dO * O| / h (rounding of L), hence atol scaled by the
// loss. Measured on these problems the worst error is 1.2% of the allowance at
// h = 1e-6 (80x margin) and at most 7% for any h in [2e-7, 2e-6]; h = 1e-5
// fails on t2r through truncation (103% of the allowance), which is why
// the step is 1e-6. A wrong term of the backward is an O(1e-3..1) relative error.
// Maps with kinks (relu, t2r, cosformer, luna relu) pass at every h above, so no
// sampled pre-activation lies within 2e-6 of a kink.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "reference_test_util.h"

namespace lunajit::reference::testing {
namespace {

// REF_STEP overrides the step, to re-measure the margins quoted above.
const double kStep = std::getenv("REF_STEP") ? std::atof(std::getenv("REF_STEP")) : 1e-6;
constexpr double kRtol = 1e-6;
// atol is kAtolPerLoss * sum_i |dO_i O_i|: the rounding of L, divided by 2h.
constexpr double kAtolPerLoss = 1e-8;

double loss(const Problem& p, const Stabilizers* frozen) {
  Result<ForwardResult> fwd = linear_attention_forward(p.spec, p.shape, p.q, p.k, p.v, p.params, frozen);
  EXPECT_TRUE(fwd.ok()) << (fwd.ok() ? "" : fwd.error().message);
  double l = 0;
  for (size_t i = 0; i < fwd->out.size(); ++i) l += p.dout[i] * fwd->out[i];
  return l;
}

// Central differences of loss() over entries [begin, end) of the tensor `pick` selects.
std::vector<double> finite_differences(Problem p, const std::function<std::vector<double>&(Problem&)>& pick,
                                       size_t begin, size_t end, const Stabilizers* frozen) {
  std::vector<double> fd(end - begin);
  for (size_t i = begin; i < end; ++i) {
    double& x = pick(p)[i];
    const double x0 = x;
    x = x0 + kStep;
    const double lp = loss(p, frozen);
    x = x0 - kStep;
    const double lm = loss(p, frozen);
    x = x0;
    fd[i - begin] = (lp - lm) / (2 * kStep);
  }
  return fd;
}

// Checks dq, dk, dv and each learned tensor of every parameter block; fixed
// tensors must have zero gradient. `freeze` holds performer stabilizers at the
// base point's values during the differences (the stop-gradient function).
void check_gradients(const Problem& p, bool freeze) {
  Result<ForwardResult> base = linear_attention_forward(p.spec, p.shape, p.q, p.k, p.v, p.params);
  ASSERT_TRUE(base.ok()) << base.error().message;
  const Stabilizers* frozen = freeze ? &base->stab : nullptr;
  double loss_scale = 0;
  for (size_t i = 0; i < base->out.size(); ++i) loss_scale += std::abs(p.dout[i] * base->out[i]);
  const double atol = kAtolPerLoss * std::max(loss_scale, 1e-4);
  Result<Gradients> g = linear_attention_backward(p.spec, p.shape, p.q, p.k, p.v, p.params, p.dout, frozen);
  ASSERT_TRUE(g.ok()) << g.error().message;

  double worst = 0;
  worst = std::max(worst, expect_close(g->dq, finite_differences(p, [](Problem& x) -> auto& { return x.q; }, 0, p.q.size(), frozen), kRtol, atol, "dq"));
  worst = std::max(worst, expect_close(g->dk, finite_differences(p, [](Problem& x) -> auto& { return x.k; }, 0, p.k.size(), frozen), kRtol, atol, "dk"));
  worst = std::max(worst, expect_close(g->dv, finite_differences(p, [](Problem& x) -> auto& { return x.v; }, 0, p.v.size(), frozen), kRtol, atol, "dv"));
  EXPECT_GT(max_abs(g->dq), 0.0);
  EXPECT_GT(max_abs(g->dk), 0.0);
  EXPECT_GT(max_abs(g->dv), 0.0);

  const ParamLayout layout = param_layout(p.spec);
  const int blocks = p.spec.params_per_head ? p.shape.heads : 1;
  for (int b = 0; b < blocks; ++b)
    for (const ParamTensor& t : layout.tensors) {
      const size_t begin = size_t(b * layout.per_head_floats + t.offset), end = begin + size_t(t.numel());
      const std::vector<double> an(g->dparams.begin() + begin, g->dparams.begin() + end);
      const std::string what = "d" + t.name + " (block " + std::to_string(b) + ")";
      if (!t.learned) {
        EXPECT_EQ(max_abs(an), 0.0) << what << " is fixed and must get no gradient";
        continue;
      }
      EXPECT_GT(max_abs(an), 0.0) << what;
      worst = std::max(worst, expect_close(an, finite_differences(p, [](Problem& x) -> auto& { return x.params; }, begin, end, frozen), kRtol, atol, what));
    }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", worst);
  ::testing::Test::RecordProperty("worst_error_over_allowance", buf);
}

using GradientParam = std::tuple<SpecCase, bool /*causal*/, bool /*normalize*/, bool /*per_head*/>;

class GradientTest : public ::testing::TestWithParam<GradientParam> {};

TEST_P(GradientTest, BackwardMatchesCentralDifferences) {
  auto [c, causal, normalize, per_head] = GetParam();
  AttentionSpec spec = c.spec;
  spec.causal = causal;
  spec.normalize = normalize;
  spec.params_per_head = per_head;
  const Problem p = make_problem(spec, {2, 6, 2}, 1234);
  check_gradients(p, /*freeze=*/true);
}

// Every case x causal x normalize x per-head, without normalize for signed maps
// (their den may cross zero, where the gradient blows up).
std::vector<GradientParam> gradient_cases() {
  std::vector<GradientParam> out;
  for (const SpecCase& c : all_spec_cases())
    for (bool causal : {false, true})
      for (bool normalize : {false, true})
        for (bool per_head : {true, false})
          if (!(normalize && c.signed_features)) out.emplace_back(c, causal, normalize, per_head);
  return out;
}

std::string name_of(const ::testing::TestParamInfo<GradientParam>& info) {
  auto [c, causal, normalize, per_head] = info.param;
  return c.name + (causal ? "_causal" : "_full") + (normalize ? "_norm" : "_raw") + (per_head ? "_perhead" : "_shared");
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, GradientTest, ::testing::ValuesIn(gradient_cases()), name_of);

// With kernel_eps = 0 and eps = 0 the performer stabilizers cancel exactly in a
// normalized output, so the stop-gradient backward is the gradient of the full
// function: finite differences that recompute the stabilizers agree with it.
TEST(PerformerGradient, StopGradientIsExactWhenStabilizersCancel) {
  for (bool causal : {false, true}) {
    AttentionSpec spec = small_spec(Family::performer);
    spec.performer.kernel_eps = 0;
    spec.eps = 0;
    spec.causal = causal;
    check_gradients(make_problem(spec, {2, 5, 2}, 99), /*freeze=*/false);
  }
}

// With kernel_eps > 0 the stabilizers do not cancel; the backward is then the
// gradient of the frozen-stabilizer function, not of the recomputed one. The
// recomputed differences must differ detectably (which shows the frozen test
// above is not vacuous).
TEST(PerformerGradient, FrozenAndRecomputedStabilizersDifferWhenKernelEpsIsLarge) {
  AttentionSpec spec = small_spec(Family::performer);
  spec.performer.kernel_eps = 0.5;
  const Problem p = make_problem(spec, {1, 5, 1}, 7);
  Result<Gradients> g = linear_attention_backward(spec, p.shape, p.q, p.k, p.v, p.params, p.dout);
  ASSERT_TRUE(g.ok());
  const std::vector<double> fd = finite_differences(p, [](Problem& x) -> auto& { return x.q; }, 0, p.q.size(), nullptr);
  double diff = 0;
  for (size_t i = 0; i < fd.size(); ++i) diff = std::max(diff, std::abs(fd[i] - g->dq[i]));
  EXPECT_GT(diff, 1e-4 * max_abs(g->dq));
}

}  // namespace
}  // namespace lunajit::reference::testing
