// Carried state and decoding on the generated kernels (host emulation) against
// the double reference (reference/recurrent_state.h):
//  - a causal sequence cut into pieces, each piece a kernel call seeded with
//    the previous piece's final state, equals one call: outputs, the final
//    state, and in the backward (pieces in reverse, each fed the next piece's
//    d initial state) dq, dk, dv, dparams and d initial state;
//  - the decode kernel run token by token equals the causal forward;
//  - kernels refuse state for performer.
// Tolerance: fp32 everywhere (inputs rounded from double), sums of at most
// n + D ~ 60 terms: |err| <= 5e-6 * max|ref| + 1e-6 (measured worst 4e-7 relative).
#include <cmath>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "codegen/decode_source.h"
#include "reference/reference.h"
#include "runtime/attention_runner.h"
#include "tests/autotune/host_cases.h"

namespace lunajit {
namespace {

using namespace testing_host;
using reference::AttentionShape;
using reference::RecurrentState;

constexpr double kRtol = 5e-6, kAtol = 1e-6;

double check_close(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double scale = 0, worst = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  int reported = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    worst = std::max(worst, err / std::max(scale, 1e-30));
    if (err > kAtol + kRtol * scale && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (scale " << scale << ")";
  }
  EXPECT_GT(scale, 1e-6) << what << " is identically zero: the check could not fail";
  return worst;
}

std::vector<float> to_float(const std::vector<double>& x) { return {x.begin(), x.end()}; }

struct Dev {
  Buffer buf;
  size_t n = 0;
  static Dev of(const std::vector<float>& x) {
    Dev d;
    d.n = x.size();
    d.buf = host_backend().allocate(std::max<size_t>(1, x.size()) * 4).value_or_throw();
    if (!x.empty()) EXPECT_TRUE(host_backend().copy_to_device(d.buf, x.data(), x.size() * 4).ok());
    return d;
  }
  static Dev zeros(size_t n) { return of(std::vector<float>(n, 0.0f)); }
  std::vector<float> get() const {
    std::vector<float> x(n);
    EXPECT_TRUE(host_backend().copy_to_host(x.data(), buf, n * 4).ok());
    return x;
  }
  DevicePtr ptr() const { return buf.ptr(); }
};

TensorRef ref(const Dev& d, const AttentionShape& s, int width) {
  return {d.buf.as_pointer(), int64_t(s.seq) * s.heads * width, int64_t(s.heads) * width, width};
}
MutableTensorRef mref(const Dev& d, const AttentionShape& s, int width) {
  return {d.buf.as_pointer(), int64_t(s.seq) * s.heads * width, int64_t(s.heads) * width, width};
}

std::vector<double> slice_seq(const std::vector<double>& x, const AttentionShape& s, int width, int t0, int t1) {
  std::vector<double> out;
  for (int b = 0; b < s.batch; ++b)
    for (int t = t0; t < t1; ++t)
      for (int h = 0; h < s.heads; ++h) {
        const double* row = x.data() + s.row(b, t, h) * width;
        out.insert(out.end(), row, row + width);
      }
  return out;
}

template <class T>
void put_seq(std::vector<T>& x, const AttentionShape& s, int width, int t0, const std::vector<T>& piece, int len) {
  for (int b = 0; b < s.batch; ++b)
    for (int t = 0; t < len; ++t)
      for (int h = 0; h < s.heads; ++h) {
        const T* src = piece.data() + ((int64_t(b) * len + t) * s.heads + h) * width;
        std::copy(src, src + width, x.data() + s.row(b, t0 + t, h) * width);
      }
}

std::vector<double> randn(std::mt19937_64& rng, size_t n, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> x(n);
  for (double& e : x) e = double(float(dist(rng)));  // exactly representable in fp32
  return x;
}

struct Case {
  std::string name;
  AttentionSpec spec;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " " << canonical_json(c.spec); }

std::vector<Case> cases() {
  AttentionSpec luna = default_spec(Family::luna);
  luna.head_dim = 16;
  luna.value_dim = 12;
  luna.luna.projections = 4;
  luna.luna.channels = 3;
  luna.luna.mlp_width = 8;
  AttentionSpec elu = default_spec(Family::elu);
  elu.head_dim = 8;
  elu.value_dim = 20;
  elu.normalize = false;
  std::vector<Case> out{{"luna", luna}, {"elu_unnormalized", elu}};
  for (Case& c : out) {
    c.spec.causal = true;
    c.spec.dtype = DType::fp32;
  }
  return out;
}

class StateHost : public ::testing::TestWithParam<Case> {};

TEST_P(StateHost, ChainedKernelCallsEqualOneCallForwardAndGradients) {
  const AttentionSpec spec = GetParam().spec;
  const int B = 2, H = 2, N = 37, d = spec.head_dim, dv = spec.value_dim, D = spec.feature_dim();
  const AttentionShape shape{B, N, H};
  std::mt19937_64 rng(7);
  const auto q = randn(rng, shape.rows() * d), k = randn(rng, shape.rows() * d), v = randn(rng, shape.rows() * dv);
  const auto dout = randn(rng, shape.rows() * dv);
  std::vector<double> params;
  for (float p : init_params(spec, H, 3)) params.push_back(p);
  RecurrentState init{randn(rng, size_t(B) * H * D * dv, 0.3), randn(rng, size_t(B) * H * D)};
  for (double& e : init.z) e = double(float(1.0 + std::abs(e)));
  const RecurrentState dfinal{randn(rng, init.S.size()), randn(rng, init.z.size())};

  auto want = reference::linear_attention_forward_state(spec, shape, q, k, v, params, &init).value_or_throw();
  auto want_g =
      reference::linear_attention_backward_state(spec, shape, q, k, v, params, dout, &init, &dfinal).value_or_throw();

  // A chunk smaller than the pieces, so pieces span several chunks and start mid-way.
  TileConfig fcfg = default_config(spec, sm90(), Pass::forward), bcfg = default_config(spec, sm90(), Pass::backward);
  auto fwd = AttentionRunner::create(host_backend(), spec, fcfg, Pass::forward).value_or_throw();
  auto bwd = AttentionRunner::create(host_backend(), spec, bcfg, Pass::backward).value_or_throw();
  const Dev P = Dev::of(to_float(params));
  const int cuts[] = {0, 13, 14, N};  // 13, 1 and 23 tokens
  std::vector<Dev> S, Z;
  S.push_back(Dev::of(to_float(init.S)));
  Z.push_back(Dev::of(to_float(init.z)));
  std::vector<float> out(v.size());
  std::vector<Dev> po;  // each piece's output, needed by its backward
  for (int i = 0; i < 3; ++i) {
    const AttentionShape ps{B, cuts[i + 1] - cuts[i], H};
    const Dev pq = Dev::of(to_float(slice_seq(q, shape, d, cuts[i], cuts[i + 1])));
    const Dev pk = Dev::of(to_float(slice_seq(k, shape, d, cuts[i], cuts[i + 1])));
    const Dev pv = Dev::of(to_float(slice_seq(v, shape, dv, cuts[i], cuts[i + 1])));
    Dev o = Dev::zeros(size_t(ps.rows()) * dv);
    S.push_back(Dev::zeros(init.S.size()));
    Z.push_back(Dev::zeros(init.z.size()));
    StateRefs st{S[i].ptr(), Z[i].ptr(), S[i + 1].ptr(), Z[i + 1].ptr()};
    ASSERT_TRUE(fwd.forward({B, H, ps.seq}, ref(pq, ps, d), ref(pk, ps, d), ref(pv, ps, dv), mref(o, ps, dv), P.ptr(), st)
                    .ok());
    put_seq(out, shape, dv, cuts[i], o.get(), ps.seq);
    po.push_back(std::move(o));
  }
  const double e_out = check_close(out, want.out, "out");
  const double e_S = check_close(S[3].get(), want.final_state.S, "final S");
  check_close(Z[3].get(), want.final_state.z, "final z");

  std::vector<float> dq(q.size()), dk(k.size()), dvv(v.size()), dparams(params.size(), 0.0f);
  Dev dS = Dev::of(to_float(dfinal.S)), dZ = Dev::of(to_float(dfinal.z));
  for (int i = 2; i >= 0; --i) {
    const AttentionShape ps{B, cuts[i + 1] - cuts[i], H};
    const Dev pq = Dev::of(to_float(slice_seq(q, shape, d, cuts[i], cuts[i + 1])));
    const Dev pk = Dev::of(to_float(slice_seq(k, shape, d, cuts[i], cuts[i + 1])));
    const Dev pv = Dev::of(to_float(slice_seq(v, shape, dv, cuts[i], cuts[i + 1])));
    const Dev pdo = Dev::of(to_float(slice_seq(dout, shape, dv, cuts[i], cuts[i + 1])));
    Dev gq = Dev::zeros(pq.n), gk = Dev::zeros(pk.n), gv = Dev::zeros(pv.n), gp = Dev::zeros(params.size());
    Dev dS0 = Dev::zeros(init.S.size()), dZ0 = Dev::zeros(init.z.size());
    StateGradRefs st{S[i].ptr(), Z[i].ptr(), dS.ptr(), dZ.ptr(), dS0.ptr(), dZ0.ptr()};
    ASSERT_TRUE(bwd.backward({B, H, ps.seq}, ref(pq, ps, d), ref(pk, ps, d), ref(pv, ps, dv), ref(po[i], ps, dv),
                             ref(pdo, ps, dv), mref(gq, ps, d), mref(gk, ps, d), mref(gv, ps, dv), P.ptr(), gp.ptr(), st)
                    .ok());
    put_seq(dq, shape, d, cuts[i], gq.get(), ps.seq);
    put_seq(dk, shape, d, cuts[i], gk.get(), ps.seq);
    put_seq(dvv, shape, dv, cuts[i], gv.get(), ps.seq);
    const auto g = gp.get();
    for (size_t j = 0; j < g.size(); ++j) dparams[j] += g[j];
    dS = std::move(dS0);
    dZ = std::move(dZ0);
  }
  const double e_dq = check_close(dq, want_g.grad.dq, "dq");
  check_close(dk, want_g.grad.dk, "dk");
  check_close(dvv, want_g.grad.dv, "dv");
  if (!params.empty()) check_close(dparams, want_g.grad.dparams, "dparams");
  const double e_dS0 = check_close(dS.get(), want_g.dinitial.S, "dS0");
  check_close(dZ.get(), want_g.dinitial.z, "dz0");
  std::printf("[ measured ] %s: max error / max|ref|: out %.2e, S_T %.2e, dq %.2e, dS0 %.2e\n", GetParam().name.c_str(),
              e_out, e_S, e_dq, e_dS0);
}

TEST_P(StateHost, DecodeKernelTokenByTokenEqualsCausalForward) {
  const AttentionSpec spec = GetParam().spec;
  const int B = 3, H = 2, N = 19, d = spec.head_dim, dv = spec.value_dim, D = spec.feature_dim();
  const AttentionShape shape{B, N, H};
  std::mt19937_64 rng(17);
  const auto q = randn(rng, shape.rows() * d), k = randn(rng, shape.rows() * d), v = randn(rng, shape.rows() * dv);
  std::vector<double> params;
  for (float p : init_params(spec, H, 5)) params.push_back(p);
  auto want = reference::linear_attention_forward(spec, shape, q, k, v, params).value_or_throw();
  auto dec = AttentionRunner::create_decode(host_backend(), spec, default_config(spec, sm90(), Pass::forward))
                 .value_or_throw();
  const Dev P = Dev::of(to_float(params));
  Dev S = Dev::zeros(size_t(B) * H * D * dv), Z = Dev::zeros(size_t(B) * H * D);
  const AttentionShape one{B, 1, H};
  std::vector<float> out(v.size());
  for (int t = 0; t < N; ++t) {
    const Dev tq = Dev::of(to_float(slice_seq(q, shape, d, t, t + 1)));
    const Dev tk = Dev::of(to_float(slice_seq(k, shape, d, t, t + 1)));
    const Dev tv = Dev::of(to_float(slice_seq(v, shape, dv, t, t + 1)));
    Dev o = Dev::zeros(size_t(B) * H * dv);
    ASSERT_TRUE(dec.decode({B, H, 1}, ref(tq, one, d), ref(tk, one, d), ref(tv, one, dv), mref(o, one, dv), P.ptr(),
                           S.ptr(), Z.ptr())
                    .ok());
    put_seq(out, shape, dv, t, o.get(), 1);
  }
  const double e = check_close(out, want.out, "decoded out");
  auto ws = reference::linear_attention_forward_state(spec, shape, q, k, v, params, nullptr).value_or_throw();
  check_close(S.get(), ws.final_state.S, "state S after decoding");
  std::printf("[ measured ] %s decode: max error / max|ref| %.2e\n", GetParam().name.c_str(), e);
}

INSTANTIATE_TEST_SUITE_P(Specs, StateHost, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(StateHostErrors, PerformerAndNonCausalAreRefused) {
  AttentionSpec perf = default_spec(Family::performer);
  perf.causal = true;
  perf.dtype = DType::fp32;
  auto r = AttentionRunner::create_decode(host_backend(), perf, default_config(perf, sm90(), Pass::forward));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("performer"), std::string::npos) << r.error().message;
  AttentionSpec nc = default_spec(Family::elu);
  auto plan = plan_decode(nc, TileConfig(), {1, 1, 1});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.error().message.find("causal"), std::string::npos) << plan.error().message;
}

}  // namespace
}  // namespace lunajit
