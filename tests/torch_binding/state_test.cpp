// Carried state and decoding in the binding (torch_binding/linear_attention.h
// linear_attention_with_state, linear_attention_step; modules.h
// MultiheadLinearAttention::forward_incremental):
//  - path aten, fp64: chained pieces equal one call, forward and every gradient
//    (q, k, v, params, initial S and z), to 1e-10 (double, only the grouping of
//    sums differs); one call equals reference::linear_attention_forward_state
//    and its gradients (incl. d initial state, itself checked against finite
//    differences in tests/reference) to 1e-9;
//  - path host_kernels, fp32: chained kernel calls equal the fp64 ATen one
//    call, forward and every gradient, to 2e-5 + 1e-4 * max|ref| (fp32 sums of
//    ~n + D terms; measured ~1e-6), with backward kernels and with the ATen
//    recomputation;
//  - decoding token by token (aten and the decode kernel) equals the causal forward;
//  - the module's incremental API (with dwc) equals its full forward;
//  - rejected inputs name the field.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "reference/reference.h"
#include "torch_binding/linear_attention.h"
#include "torch_binding/modules.h"

namespace lunajit {
namespace {

using torch::Tensor;

AttentionSpec spec_of(const std::string& json) { return spec_from_string(json).value_or_throw(); }

AttentionSpec luna_spec() {
  return spec_of(R"({"family": "luna", "head_dim": 6, "value_dim": 5, "causal": true, "dtype": "fp32",
                     "luna": {"projections": 3, "channels": 2, "mlp_width": 5}})");
}
AttentionSpec hedgehog_spec() {
  return spec_of(R"({"family": "hedgehog", "head_dim": 4, "value_dim": 3, "causal": true, "dtype": "fp32",
                     "hedgehog": {"features": 4}, "params_per_head": false})");
}

double max_rel(const Tensor& got, const Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>() / std::max(scale, 1e-300);
}

void expect_close(const Tensor& got, const Tensor& want, double rtol, double atol, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what << " undefined";
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = want.abs().max().item<double>();
  EXPECT_GT(scale, 1e-8) << what << " is zero: the check could not fail";
  const double err = (got.to(torch::kDouble) - want.to(torch::kDouble)).abs().max().item<double>();
  EXPECT_LE(err, atol + rtol * scale) << what << ": max error " << err << " (scale " << scale << ")";
}

struct Inputs {
  Tensor q, k, v, params, S0, z0, w_out, w_S, w_z;
};

Inputs make_inputs(const AttentionSpec& spec, int64_t B, int64_t N, int64_t H, torch::ScalarType dt, uint64_t seed) {
  torch::manual_seed(seed);
  const auto o = torch::TensorOptions().dtype(torch::kDouble);
  const int64_t D = spec.feature_dim(), dv = spec.value_dim;
  Inputs in;
  in.q = torch::randn({B, N, H, spec.head_dim}, o);
  in.k = torch::randn({B, N, H, spec.head_dim}, o);
  in.v = torch::randn({B, N, H, dv}, o);
  in.params = init_feature_params(spec, H, seed).to(torch::kDouble);
  in.params = in.params + 0.05 * torch::randn_like(in.params);
  in.S0 = 0.3 * torch::randn({B, H, D, dv}, o);
  in.z0 = 1.0 + torch::rand({B, H, D}, o);
  in.w_out = torch::randn({B, N, H, dv}, o);
  in.w_S = torch::randn({B, H, D, dv}, o);
  in.w_z = torch::randn({B, H, D}, o);
  for (Tensor* t : {&in.q, &in.k, &in.v, &in.S0, &in.z0, &in.w_out, &in.w_S, &in.w_z}) *t = t->to(dt);
  in.params = in.params.to(torch::kFloat).to(dt == torch::kDouble ? torch::kDouble : torch::kFloat);
  return in;
}

// {out, S_T, z_T, dq, dk, dv, dparams, dS0, dz0} of one call or of pieces
// [cuts[i], cuts[i+1]) chained; loss = <w_out, out> + <w_S, S_T> + <w_z, z_T>.
std::vector<Tensor> run(const Inputs& in, const AttentionSpec& spec, const std::vector<int64_t>& cuts,
                        const LinearAttentionOptions& opts) {
  std::vector<Tensor> leaves{in.q.clone(), in.k.clone(), in.v.clone(), in.params.clone(), in.S0.clone(),
                             in.z0.clone()};
  for (Tensor& t : leaves) t.requires_grad_(true);
  LinearAttentionState st{leaves[4] * 1.0, leaves[5] * 1.0};
  std::vector<Tensor> outs;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const int64_t t0 = cuts[i], len = cuts[i + 1] - cuts[i];
    auto r = linear_attention_with_state(leaves[0].narrow(1, t0, len), leaves[1].narrow(1, t0, len),
                                         leaves[2].narrow(1, t0, len), leaves[3], spec, st, true, opts);
    outs.push_back(r.out);
    st = r.final_state;
  }
  const Tensor out = torch::cat(outs, 1);
  const Tensor loss = (out.to(torch::kDouble) * in.w_out.to(torch::kDouble)).sum() +
                      (st.S.to(torch::kDouble) * in.w_S.to(torch::kDouble)).sum() +
                      (st.z.to(torch::kDouble) * in.w_z.to(torch::kDouble)).sum();
  loss.backward();
  std::vector<Tensor> res{out.detach(), st.S.detach(), st.z.detach()};
  for (Tensor& t : leaves) res.push_back(t.grad());
  return res;
}

const char* kNames[] = {"out", "S_T", "z_T", "dq", "dk", "dv", "dparams", "dS0", "dz0"};

TEST(StateAten, ChainedPiecesEqualOneCallForwardAndEveryGradient) {
  for (const AttentionSpec& spec : {luna_spec(), hedgehog_spec()}) {
    const Inputs in = make_inputs(spec, 2, 17, 2, torch::kDouble, 3);
    LinearAttentionOptions opts;
    opts.path = AttentionPath::aten;
    opts.chunk = 4;  // pieces start mid-chunk
    const auto whole = run(in, spec, {0, 17}, opts);
    const auto pieces = run(in, spec, {0, 5, 6, 17}, opts);
    for (size_t i = 0; i < whole.size(); ++i) expect_close(pieces[i], whole[i], 1e-10, 1e-12, kNames[i]);
  }
}

TEST(StateAten, OneCallEqualsTheReferenceIncludingInitialStateGradient) {
  const AttentionSpec spec = luna_spec();
  const Inputs in = make_inputs(spec, 2, 9, 2, torch::kDouble, 5);
  LinearAttentionOptions opts;
  opts.path = AttentionPath::aten;
  opts.chunk = 4;
  const auto got = run(in, spec, {0, 9}, opts);
  auto vec = [](const Tensor& t) {
    const Tensor c = t.to(torch::kDouble).contiguous();
    return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  };
  const reference::AttentionShape shape{2, 9, 2};
  const reference::RecurrentState init{vec(in.S0), vec(in.z0)}, dfinal{vec(in.w_S), vec(in.w_z)};
  auto f = reference::linear_attention_forward_state(spec, shape, vec(in.q), vec(in.k), vec(in.v), vec(in.params),
                                                     &init)
               .value_or_throw();
  auto g = reference::linear_attention_backward_state(spec, shape, vec(in.q), vec(in.k), vec(in.v), vec(in.params),
                                                      vec(in.w_out), &init, &dfinal)
               .value_or_throw();
  auto t = [](const std::vector<double>& x, const Tensor& like) {
    return torch::tensor(x, torch::kDouble).reshape(like.sizes());
  };
  const std::vector<Tensor> want{t(f.out, got[0]),          t(f.final_state.S, got[1]), t(f.final_state.z, got[2]),
                                 t(g.grad.dq, got[3]),      t(g.grad.dk, got[4]),       t(g.grad.dv, got[5]),
                                 t(g.grad.dparams, got[6]), t(g.dinitial.S, got[7]),    t(g.dinitial.z, got[8])};
  for (size_t i = 0; i < want.size(); ++i) expect_close(got[i], want[i], 1e-9, 1e-12, kNames[i]);
}

TEST(StateHostKernels, ChainedKernelCallsEqualAtenOneCall) {
  for (bool kernel_backward : {true, false}) {
    const AttentionSpec spec = luna_spec();
    const Inputs in64 = make_inputs(spec, 2, 23, 2, torch::kDouble, 7);
    LinearAttentionOptions aten_opts;
    aten_opts.path = AttentionPath::aten;
    const auto want = run(in64, spec, {0, 23}, aten_opts);
    Inputs in32 = in64;
    for (Tensor* x : {&in32.q, &in32.k, &in32.v, &in32.params, &in32.S0, &in32.z0}) *x = x->to(torch::kFloat);
    LinearAttentionOptions opts;
    opts.path = AttentionPath::host_kernels;
    opts.kernel_backward = kernel_backward;
    const auto got = run(in32, spec, {0, 8, 9, 23}, opts);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      expect_close(got[i], want[i], 1e-4, 2e-5, std::string(kNames[i]) + (kernel_backward ? "" : " (aten grad)"));
      worst = std::max(worst, max_rel(got[i], want[i]));
    }
    std::printf("[ measured ] host kernels chained vs aten fp64 (kernel_backward %d): worst max error / max|ref| "
                "%.2e\n", int(kernel_backward), worst);
  }
}

TEST(StateStep, DecodingTokenByTokenEqualsTheCausalForward) {
  const AttentionSpec spec = luna_spec();
  for (AttentionPath path : {AttentionPath::aten, AttentionPath::host_kernels}) {
    const Inputs in = make_inputs(spec, 3, 11, 2, torch::kFloat, 9);
    LinearAttentionOptions opts;
    opts.path = path;
    torch::NoGradGuard no_grad;
    LinearAttentionOptions full_opts;
    full_opts.path = AttentionPath::aten;
    const Tensor want = linear_attention(in.q.to(torch::kDouble), in.k.to(torch::kDouble), in.v.to(torch::kDouble),
                                         in.params.to(torch::kDouble), spec, full_opts);
    LinearAttentionState st;
    std::vector<Tensor> outs;
    for (int64_t t = 0; t < 11; ++t) {
      const LinearAttentionState before = st;
      auto r = linear_attention_step(in.q.narrow(1, t, 1), in.k.narrow(1, t, 1), in.v.narrow(1, t, 1), in.params,
                                     spec, st, opts);
      if (before.defined()) EXPECT_FALSE(r.state.S.is_same(before.S)) << "the step must not reuse its input state";
      outs.push_back(r.out);
      st = r.state;
    }
    expect_close(torch::cat(outs, 1), want, 1e-5, 1e-6, std::string("decoded out, path ") + std::string(to_string(path)));
    const auto whole = linear_attention_with_state(in.q, in.k, in.v, in.params, spec, {}, true, full_opts);
    expect_close(st.S, whole.final_state.S, 1e-5, 1e-6, "S after decoding");
    expect_close(st.z, whole.final_state.z, 1e-5, 1e-6, "z after decoding");
  }
}

TEST(StateModule, IncrementalGenerationEqualsTheFullForward) {
  AttentionSpec spec = spec_of(R"({"family": "elu", "head_dim": 4, "value_dim": 4, "causal": true, "dtype": "fp32"})");
  for (bool dwc : {false, true}) {
    nn::MultiheadOptions mo;
    mo.embed_dim = 8;
    mo.num_heads = 2;
    mo.dwc = dwc;
    mo.dwc_kernel = 3;
    mo.batch_first = true;
    torch::manual_seed(1);
    nn::MultiheadLinearAttention mha(mo, spec);
    torch::NoGradGuard no_grad;
    const Tensor x = torch::randn({2, 9, 8});
    const Tensor want = std::get<0>(mha->forward(x, x, x));
    // A prompt of 4 tokens, then one token at a time.
    auto [prompt_out, state] = mha->forward_incremental(x.narrow(1, 0, 4));
    std::vector<Tensor> outs{prompt_out};
    for (int64_t t = 4; t < 9; ++t) {
      auto [o, next] = mha->forward_incremental(x.narrow(1, t, 1), state);
      outs.push_back(o);
      state = next;
    }
    EXPECT_EQ(state.tokens, 9);
    expect_close(torch::cat(outs, 1), want, 1e-5, 1e-6, dwc ? "incremental (dwc)" : "incremental");
  }
}

TEST(StateErrors, RejectedInputsNameTheField) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  AttentionSpec perf = spec_of(R"({"family": "performer", "head_dim": 4, "value_dim": 3, "causal": true,
                                   "dtype": "fp32", "performer": {"features": 6}})");
  const Tensor q = torch::randn({1, 3, 1, 4}), v = torch::randn({1, 3, 1, 3});
  const Tensor pp = init_feature_params(perf, 1);
  std::string m = message([&] { linear_attention_with_state(q, q, v, pp, perf, {}, true); });
  EXPECT_NE(m.find("output_final_state"), std::string::npos) << m;
  EXPECT_NE(m.find("performer"), std::string::npos) << m;
  m = message([&] {
    linear_attention_with_state(q, q, v, pp, perf, {torch::zeros({1, 1, 6, 3}), torch::zeros({1, 1, 6})}, false);
  });
  EXPECT_NE(m.find("initial_state"), std::string::npos) << m;
  AttentionSpec luna = luna_spec();
  const Tensor lq = torch::randn({1, 3, 1, 6}), lv = torch::randn({1, 3, 1, 5});
  const Tensor lp = init_feature_params(luna, 1);
  m = message([&] {
    linear_attention_with_state(lq, lq, lv, lp, luna, {torch::zeros({1, 1, 5, 5}), torch::zeros({1, 1, 6})}, true);
  });
  EXPECT_NE(m.find("initial_state.S must be [batch, heads, D, dv] = [1, 1, 6, 5]"), std::string::npos) << m;
  m = message([&] { linear_attention_with_state(lq, lq, lv, lp, luna, {torch::zeros({1, 1, 6, 5}), Tensor()}, true); });
  EXPECT_NE(m.find("needs both S and z"), std::string::npos) << m;
  m = message([&] { linear_attention_step(lq, lq, lv, lp, luna, {}); });
  EXPECT_NE(m.find("one token per sequence"), std::string::npos) << m;
  AttentionSpec nc = luna;
  nc.causal = false;
  m = message([&] { linear_attention_with_state(lq, lq, lv, lp, nc, {}, true); });
  EXPECT_NE(m.find("causal"), std::string::npos) << m;
  LinearAttentionOptions host;
  host.path = AttentionPath::host_kernels;
  const Tensor gq = lq.narrow(1, 0, 1).clone().requires_grad_(true);
  m = message([&] { linear_attention_step(gq, gq, lv.narrow(1, 0, 1), lp, luna, {}, host); });
  EXPECT_NE(m.find("no backward"), std::string::npos) << m;
}

}  // namespace
}  // namespace lunajit
