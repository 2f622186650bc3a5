// Carried state (reference/recurrent_state.h): chained pieces equal one call,
// forward and every gradient; the gradient of the initial state against finite
// differences; the zero-state call equals linear_attention_forward; decoding
// token by token equals the causal forward; unsupported specs are rejected.
#include <gtest/gtest.h>

#include "reference_test_util.h"

namespace lunajit::reference {
namespace {

using testing::expect_close;
using testing::make_problem;
using testing::randn;

// Tokens [t0, t1) of a [batch, seq, heads, width] tensor.
std::vector<double> slice_seq(const std::vector<double>& x, const AttentionShape& s, int width, int t0, int t1) {
  std::vector<double> out;
  for (int b = 0; b < s.batch; ++b)
    for (int t = t0; t < t1; ++t)
      for (int h = 0; h < s.heads; ++h) {
        const auto* row = x.data() + s.row(b, t, h) * width;
        out.insert(out.end(), row, row + width);
      }
  return out;
}

// Writes a piece of tokens [t0, t0 + piece.seq) back into x.
void put_seq(std::vector<double>& x, const AttentionShape& s, int width, int t0, const std::vector<double>& piece,
             int len) {
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < len; ++t)
      for (int h = 0; h < s.heads; ++h) {
        const auto* src = piece.data() + ((int64_t(b) * len + t) * s.heads + h) * width;
        std::copy(src, src + width, x.data() + s.row(b, t0 + t, h) * width);
      }
}

std::vector<testing::SpecCase> state_cases() {
  std::vector<testing::SpecCase> out;
  for (auto c : testing::all_spec_cases()) {
    if (c.spec.family == Family::performer || c.spec.family == Family::cosformer) continue;
    c.spec.causal = true;
    if (c.signed_features) c.spec.normalize = false;
    out.push_back(c);
  }
  return out;
}

class RecurrentState : public ::testing::TestWithParam<testing::SpecCase> {};

// Double precision everywhere: pieces and one call sum the same terms in a
// different grouping, so they agree to a few ulps of the largest value.
constexpr double kRtol = 1e-11, kAtol = 1e-12;

TEST_P(RecurrentState, ChainedPiecesEqualOneCall) {
  const AttentionSpec spec = GetParam().spec;
  const AttentionShape shape{2, 7, 2};
  auto p = make_problem(spec, shape, 11);
  std::mt19937_64 rng(5);
  const int D = spec.feature_dim(), dv = spec.value_dim, d = spec.head_dim;
  // A non-zero initial state (positive z keeps normalized denominators away from 0)
  ::lunajit::reference::RecurrentState init = zero_state(spec, 2, 2);
  init.S = randn(rng, init.S.size(), 0.5);
  for (double& e : init.z) e = 1.0 + std::abs(randn(rng, 1)[0]);
  ::lunajit::reference::RecurrentState dfinal{randn(rng, init.S.size()), randn(rng, init.z.size())};

  auto whole = linear_attention_forward_state(spec, shape, p.q, p.k, p.v, p.params, &init).value_or_throw();
  auto whole_g =
      linear_attention_backward_state(spec, shape, p.q, p.k, p.v, p.params, p.dout, &init, &dfinal).value_or_throw();

  const int cuts[] = {0, 1, 4, 7};  // pieces of 1, 3 and 3 tokens
  std::vector<::lunajit::reference::RecurrentState> states{init};
  std::vector<double> out(p.v.size());
  for (int i = 0; i < 3; ++i) {
    const int t0 = cuts[i], t1 = cuts[i + 1];
    const AttentionShape ps{2, t1 - t0, 2};
    auto r = linear_attention_forward_state(spec, ps, slice_seq(p.q, shape, d, t0, t1),
                                            slice_seq(p.k, shape, d, t0, t1), slice_seq(p.v, shape, dv, t0, t1),
                                            p.params, &states.back())
                 .value_or_throw();
    put_seq(out, shape, dv, t0, r.out, t1 - t0);
    states.push_back(r.final_state);
  }
  expect_close(out, whole.out, kRtol, kAtol, "out");
  expect_close(states.back().S, whole.final_state.S, kRtol, kAtol, "final S");
  expect_close(states.back().z, whole.final_state.z, kRtol, kAtol, "final z");

  // Backward in reverse order, each piece receiving the next one's d initial state.
  std::vector<double> dq(p.q.size()), dk(p.k.size()), dvv(p.v.size()), dparams(p.params.size(), 0.0);
  ::lunajit::reference::RecurrentState carry = dfinal;
  for (int i = 2; i >= 0; --i) {
    const int t0 = cuts[i], t1 = cuts[i + 1];
    const AttentionShape ps{2, t1 - t0, 2};
    auto g = linear_attention_backward_state(spec, ps, slice_seq(p.q, shape, d, t0, t1),
                                             slice_seq(p.k, shape, d, t0, t1), slice_seq(p.v, shape, dv, t0, t1),
                                             p.params, slice_seq(p.dout, shape, dv, t0, t1), &states[i], &carry)
                 .value_or_throw();
    put_seq(dq, shape, d, t0, g.grad.dq, t1 - t0);
    put_seq(dk, shape, d, t0, g.grad.dk, t1 - t0);
    put_seq(dvv, shape, dv, t0, g.grad.dv, t1 - t0);
    for (size_t j = 0; j < dparams.size(); ++j) dparams[j] += g.grad.dparams[j];
    carry = g.dinitial;
  }
  expect_close(dq, whole_g.grad.dq, kRtol, kAtol, "dq");
  expect_close(dk, whole_g.grad.dk, kRtol, kAtol, "dk");
  expect_close(dvv, whole_g.grad.dv, kRtol, kAtol, "dv");
  expect_close(dparams, whole_g.grad.dparams, kRtol, kAtol, "dparams");
  expect_close(carry.S, whole_g.dinitial.S, kRtol, kAtol, "dS0");
  expect_close(carry.z, whole_g.dinitial.z, kRtol, kAtol, "dz0");
  (void)D;
}

TEST_P(RecurrentState, ZeroStateEqualsTheCausalForwardAndBackward) {
  const AttentionSpec spec = GetParam().spec;
  const AttentionShape shape{1, 6, 2};
  auto p = make_problem(spec, shape, 3);
  auto want = linear_attention_forward(spec, shape, p.q, p.k, p.v, p.params).value_or_throw();
  auto got = linear_attention_forward_state(spec, shape, p.q, p.k, p.v, p.params, nullptr).value_or_throw();
  expect_close(got.out, want.out, kRtol, kAtol, "out");
  auto wg = linear_attention_backward(spec, shape, p.q, p.k, p.v, p.params, p.dout).value_or_throw();
  auto gg = linear_attention_backward_state(spec, shape, p.q, p.k, p.v, p.params, p.dout, nullptr, nullptr)
                .value_or_throw();
  expect_close(gg.grad.dq, wg.dq, kRtol, kAtol, "dq");
  expect_close(gg.grad.dk, wg.dk, kRtol, kAtol, "dk");
  expect_close(gg.grad.dv, wg.dv, kRtol, kAtol, "dv");
  expect_close(gg.grad.dparams, wg.dparams, kRtol, kAtol, "dparams");
}

// d initial state against central differences of
// L = sum(dout * out) + <W_S, S_T> + <W_z, z_T>; step 1e-6, truncation O(h^2)
// ~ 1e-12 relative to the curvature, rounding ~ 1e-16 / 1e-6 = 1e-10: tolerance 1e-7.
TEST_P(RecurrentState, InitialStateGradientMatchesFiniteDifferences) {
  const AttentionSpec spec = GetParam().spec;
  const AttentionShape shape{1, 5, 1};
  auto p = make_problem(spec, shape, 8);
  std::mt19937_64 rng(9);
  ::lunajit::reference::RecurrentState init = zero_state(spec, 1, 1);
  init.S = randn(rng, init.S.size(), 0.5);
  for (double& e : init.z) e = 1.0 + std::abs(randn(rng, 1)[0]);
  const ::lunajit::reference::RecurrentState W{randn(rng, init.S.size()), randn(rng, init.z.size())};
  auto loss = [&](const ::lunajit::reference::RecurrentState& s) {
    auto r = linear_attention_forward_state(spec, shape, p.q, p.k, p.v, p.params, &s).value_or_throw();
    double L = 0;
    for (size_t i = 0; i < r.out.size(); ++i) L += p.dout[i] * r.out[i];
    for (size_t i = 0; i < W.S.size(); ++i) L += W.S[i] * r.final_state.S[i];
    for (size_t i = 0; i < W.z.size(); ++i) L += W.z[i] * r.final_state.z[i];
    return L;
  };
  auto g = linear_attention_backward_state(spec, shape, p.q, p.k, p.v, p.params, p.dout, &init, &W).value_or_throw();
  const double h = 1e-6;
  std::vector<double> fd_S(init.S.size()), fd_z(init.z.size());
  for (size_t i = 0; i < init.S.size(); ++i) {
    auto a = init, b = init;
    a.S[i] += h;
    b.S[i] -= h;
    fd_S[i] = (loss(a) - loss(b)) / (2 * h);
  }
  for (size_t i = 0; i < init.z.size(); ++i) {
    auto a = init, b = init;
    a.z[i] += h;
    b.z[i] -= h;
    fd_z[i] = (loss(a) - loss(b)) / (2 * h);
  }
  expect_close(g.dinitial.S, fd_S, 1e-7, 1e-7, "dS0");
  expect_close(g.dinitial.z, fd_z, 1e-7, 1e-7, "dz0");
}

TEST_P(RecurrentState, DecodingTokenByTokenEqualsTheCausalForward) {
  const AttentionSpec spec = GetParam().spec;
  const AttentionShape shape{2, 6, 3};
  auto p = make_problem(spec, shape, 21);
  auto want = linear_attention_forward(spec, shape, p.q, p.k, p.v, p.params).value_or_throw();
  ::lunajit::reference::RecurrentState state;
  std::vector<double> out(p.v.size());
  for (int t = 0; t < shape.seq; ++t) {
    auto o = linear_attention_decode_step(spec, 2, 3, slice_seq(p.q, shape, spec.head_dim, t, t + 1),
                                          slice_seq(p.k, shape, spec.head_dim, t, t + 1),
                                          slice_seq(p.v, shape, spec.value_dim, t, t + 1), p.params, state)
                 .value_or_throw();
    put_seq(out, shape, spec.value_dim, t, o, 1);
  }
  expect_close(out, want.out, kRtol, kAtol, "decoded out");
}

INSTANTIATE_TEST_SUITE_P(Families, RecurrentState, ::testing::ValuesIn(state_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(RecurrentStateErrors, RejectsPerformerCosformerAndNonCausalNamingTheField) {
  AttentionSpec perf = testing::small_spec(Family::performer);
  perf.causal = true;
  Status st = check_state_support(perf);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("initial_state"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("running max"), std::string::npos) << st.error().message;
  AttentionSpec cos = testing::small_spec(Family::cosformer);
  cos.causal = true;
  EXPECT_FALSE(check_state_support(cos).ok());
  AttentionSpec nc = testing::small_spec(Family::elu);
  st = check_state_support(nc, "output_final_state");
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("output_final_state"), std::string::npos);
  EXPECT_NE(st.error().message.find("causal"), std::string::npos);
  // A wrong-sized state names the field and the expected layout.
  AttentionSpec elu = nc;
  elu.causal = true;
  auto p = make_problem(elu, {1, 3, 1}, 1);
  ::lunajit::reference::RecurrentState bad{std::vector<double>(3, 0.0), std::vector<double>(2, 0.0)};
  auto r = linear_attention_forward_state(elu, {1, 3, 1}, p.q, p.k, p.v, p.params, &bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("initial_state"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("[batch, heads, D, dv]"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace lunajit::reference
