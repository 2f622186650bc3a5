// Feature maps of the reference: the index layout of every family (the contract
// the GPU templates follow) checked entry by entry against MATH.md's formulas
// written out again here, the activations, the performer stabilizers, and the
// kernels the random-feature maps approximate.
#include <cmath>
#include <numbers>

#include <gtest/gtest.h>

#include "reference_test_util.h"

namespace lunajit::reference::testing {
namespace {

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

struct Phi {
  std::vector<double> x, params, phi;
};

// phi of n random rows of one head (seq_len = n, positions 1..n, no stabilizer).
Phi features(const AttentionSpec& spec, int n, uint64_t seed) {
  const Problem p = make_problem(spec, {1, n, 1}, seed);
  Phi f{p.q, p.params, std::vector<double>(size_t(n) * spec.feature_dim())};
  FeatureMap(spec, f.params).forward(f.x.data(), n, RowContext{n, 1, nullptr}, f.phi.data());
  return f;
}

const double* param(const AttentionSpec& spec, const std::vector<double>& params, const char* name) {
  return params.data() + param_layout(spec).find(name)->offset;
}

TEST(FeatureMapLayout, LunaNeuralIsProjectionMajor) {
  for (bool shared : {true, false}) {
    AttentionSpec spec = small_spec(Family::luna);
    spec.luna.shared_channels = shared;
    spec.luna.activation = Activation::silu;
    spec.luna.output_activation = OutputActivation::softplus;
    const int d = spec.head_dim, M = 3, L = 3, Hm = 4;
    const Phi f = features(spec, 2, 1);
    const double *W = param(spec, f.params, "W"), *W1 = param(spec, f.params, "W1"), *b1 = param(spec, f.params, "b1"),
                 *W2 = param(spec, f.params, "W2"), *b2 = param(spec, f.params, "b2");
    for (int t = 0; t < 2; ++t)
      for (int i = 0; i < M; ++i)
        for (int l = 0; l < L; ++l) {
          const double u = dot(W + i * d, f.x.data() + t * d, d);
          double y = b2[l];
          for (int k = 0; k < Hm; ++k) {
            const int hk = shared ? k : l * Hm + k;
            const double pre = W1[hk] * u + b1[hk];
            y += W2[l * Hm + k] * pre / (1 + std::exp(-pre));
          }
          EXPECT_NEAR(f.phi[t * M * L + i * L + l], std::log1p(std::exp(y)) / std::sqrt(double(M)), 1e-14);
        }
  }
}

TEST(FeatureMapLayout, LunaBankCyclesBasesAndEnvelopeGates) {
  AttentionSpec spec = small_spec(Family::luna);
  spec.luna.variant = LunaVariant::bank_coef;
  spec.luna.projections = 2;
  spec.luna.channels = 9;
  spec.luna.envelope = true;
  const int d = spec.head_dim;
  const Phi f = features(spec, 1, 2);
  const double *W = param(spec, f.params, "W"), *coef = param(spec, f.params, "coef"), *a = param(spec, f.params, "a"),
               *c = param(spec, f.params, "c");
  const double h = 1 / (1 + std::exp(-(dot(a, f.x.data(), d) + c[0])));
  const double u1 = dot(W + d, f.x.data(), d);
  const double s = h / std::sqrt(2.0);
  EXPECT_NEAR(f.phi[9 + 0], s * coef[0] * std::sin(u1), 1e-14);
  EXPECT_NEAR(f.phi[9 + 1], s * coef[1] * std::cos(u1), 1e-14);
  EXPECT_NEAR(f.phi[9 + 3], s * coef[3] / (1 + std::exp(-u1)), 1e-14);
  EXPECT_NEAR(f.phi[9 + 5], s * coef[5] * 0.5 * u1 * (1 + std::erf(u1 / std::sqrt(2.0))), 1e-14);
  EXPECT_NEAR(f.phi[9 + 7], s * coef[7] * std::exp(-0.5 * u1 * u1), 1e-14);
  EXPECT_NEAR(f.phi[9 + 8], s * coef[8] * std::sin(u1), 1e-14);  // l = 8 wraps to sin
}

TEST(FeatureMapLayout, LunaRffIsCosSinPairs) {
  AttentionSpec spec = small_spec(Family::luna);
  spec.luna.variant = LunaVariant::rff;
  ASSERT_EQ(spec.feature_dim(), 2 * spec.luna.projections);
  const int d = spec.head_dim;
  const Phi f = features(spec, 1, 3);
  const double* W = param(spec, f.params, "W");
  for (int i = 0; i < spec.luna.projections; ++i) {
    const double u = dot(W + i * d, f.x.data(), d);
    EXPECT_NEAR(f.phi[2 * i], std::cos(u) / std::sqrt(3.0), 1e-14);
    EXPECT_NEAR(f.phi[2 * i + 1], std::sin(u) / std::sqrt(3.0), 1e-14);
  }
}

TEST(FeatureMapLayout, RffIsAllCosThenAllSin) {
  const AttentionSpec spec = small_spec(Family::rff);
  const int d = spec.head_dim, m = spec.rff.features;
  const Phi f = features(spec, 1, 4);
  const double* omega = param(spec, f.params, "omega");
  for (int r = 0; r < m; ++r) {
    EXPECT_NEAR(f.phi[r], std::cos(dot(omega + r * d, f.x.data(), d)) / std::sqrt(double(m)), 1e-14);
    EXPECT_NEAR(f.phi[m + r], std::sin(dot(omega + r * d, f.x.data(), d)) / std::sqrt(double(m)), 1e-14);
  }
}

TEST(FeatureMapLayout, SimpleFamilies) {
  for (Family fam : {Family::elu, Family::relu, Family::t2r, Family::hedgehog}) {
    const AttentionSpec spec = small_spec(fam);
    const int d = spec.head_dim;
    const Phi f = features(spec, 1, 5);
    const double* x = f.x.data();
    if (fam == Family::elu)
      for (int c = 0; c < d; ++c) EXPECT_NEAR(f.phi[c], x[c] > 0 ? x[c] + 1 : std::exp(x[c]), 1e-15);
    if (fam == Family::relu)
      for (int c = 0; c < d; ++c) EXPECT_EQ(f.phi[c], std::max(x[c], 0.0));
    if (fam == Family::t2r) {
      const double *W = param(spec, f.params, "W"), *b = param(spec, f.params, "b");
      for (int r = 0; r < spec.t2r.features; ++r)
        EXPECT_NEAR(f.phi[r], std::max(dot(W + r * d, x, d) + b[r], 0.0), 1e-14);
    }
    if (fam == Family::hedgehog) {
      const int nf = spec.hedgehog.features;
      const double *W = param(spec, f.params, "W"), *b = param(spec, f.params, "b");
      double zp = 0, zm = 0;
      for (int r = 0; r < nf; ++r) {
        zp += std::exp(dot(W + r * d, x, d) + b[r]);
        zm += std::exp(-dot(W + r * d, x, d) - b[r]);
      }
      for (int r = 0; r < nf; ++r) {
        EXPECT_NEAR(f.phi[r], std::exp(dot(W + r * d, x, d) + b[r]) / zp, 1e-14);
        EXPECT_NEAR(f.phi[nf + r], std::exp(-dot(W + r * d, x, d) - b[r]) / zm, 1e-14);
      }
    }
  }
}

TEST(FeatureMapLayout, CosformerIsSinHalfThenCosHalfByPosition) {
  const AttentionSpec spec = small_spec(Family::cosformer);
  const int d = spec.head_dim, n = 4;
  const Phi f = features(spec, n, 6);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) {
      const double r = std::max(f.x[t * d + c], 0.0), angle = std::numbers::pi * (t + 1) / (2.0 * n);
      EXPECT_NEAR(f.phi[t * 2 * d + c], r * std::sin(angle), 1e-15);
      EXPECT_NEAR(f.phi[t * 2 * d + d + c], r * std::cos(angle), 1e-15);
    }
}

TEST(FeatureMapLayout, SlayIsNodeAnchorPrfMajor) {
  const AttentionSpec spec = small_spec(Family::slay);
  const int d = spec.head_dim, R = 2, P = 3, M = 4;
  const Phi f = features(spec, 1, 7);
  const double *anchors = param(spec, f.params, "anchors"), *omega = param(spec, f.params, "omega"),
               *nodes = param(spec, f.params, "nodes"), *weights = param(spec, f.params, "weights");
  std::vector<double> u(f.x);
  const double norm = std::sqrt(dot(u.data(), u.data(), d));
  for (double& e : u) e /= norm;
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p)
      for (int j = 0; j < M; ++j) {
        const double a = dot(anchors + p * d, u.data(), d);
        const double prf = std::exp(std::sqrt(2 * nodes[r]) * dot(omega + (r * M + j) * d, u.data(), d) - nodes[r]);
        EXPECT_NEAR(f.phi[r * P * M + p * M + j], std::sqrt(weights[r]) * a * a / std::sqrt(double(P)) * prf / std::sqrt(double(M)), 1e-14);
      }
  // Scale invariant: phi(3x) = phi(x).
  std::vector<double> x3(f.x), phi3(f.phi.size());
  for (double& e : x3) e *= 3;
  FeatureMap(spec, f.params).forward(x3.data(), 1, RowContext{1, 1, nullptr}, phi3.data());
  expect_close(phi3, f.phi, 1e-14, 0, "slay phi(3x)");
}

TEST(Performer, StabilizersAreRowMaxForQueriesAndGlobalMaxForKeys) {
  AttentionSpec spec = small_spec(Family::performer);
  spec.performer.kernel_eps = 0;
  const int n = 5, m = spec.performer.features;
  const Phi f = features(spec, n, 8);
  const FeatureMap fm(spec, f.params);
  const std::vector<double> sq = fm.stabilizers(f.x.data(), n, Role::query);
  const std::vector<double> sk = fm.stabilizers(f.x.data(), n, Role::key);
  std::vector<double> phi(f.phi.size());
  fm.forward(f.x.data(), n, RowContext{n, 1, sq.data()}, phi.data());
  double key_max = -INFINITY;
  for (int t = 0; t < n; ++t) {
    double row_max = 0;
    for (int r = 0; r < m; ++r) row_max = std::max(row_max, phi[t * m + r]);
    EXPECT_NEAR(row_max, 1 / std::sqrt(double(m)), 1e-15);  // the max feature is exp(0)/sqrt(m)
    EXPECT_EQ(sk[t], sk[0]);
    key_max = std::max(key_max, sq[t]);
    for (int r = 0; r < m; ++r)  // unstabilized phi scaled by exp(-stab)
      EXPECT_NEAR(phi[t * m + r], f.phi[t * m + r] * std::exp(-sq[t]), 1e-15 * f.phi[t * m + r] * std::exp(-sq[t]) + 1e-300);
  }
  EXPECT_EQ(sk[0], key_max);
}

// <phi(x), phi(y)> exp(stab) -> exp(x.y / sqrt(d)) as m grows (FAVOR+ is unbiased).
TEST(Performer, ApproximatesSoftmaxKernel) {
  AttentionSpec spec = small_spec(Family::performer, 4);
  spec.performer.features = 4096;
  spec.performer.kernel_eps = 0;
  const int d = 4;
  const std::vector<double> params = to_double(init_params(spec, 1, 0));
  const std::vector<double> x{0.3, -0.5, 0.2, 0.4}, y{-0.1, 0.6, 0.5, -0.2};
  std::vector<double> px(4096), py(4096);
  const FeatureMap fm(spec, params);
  fm.forward(x.data(), 1, {}, px.data());
  fm.forward(y.data(), 1, {}, py.data());
  const double want = std::exp(dot(x.data(), y.data(), d) / std::sqrt(double(d)));
  EXPECT_NEAR(dot(px.data(), py.data(), 4096) / want, 1.0, 0.05);
}

// rff: <phi(x), phi(y)> -> exp(-|x - y|^2 sigma^2 / 2) with omega ~ N(0, sigma^2 I), sigma^2 = 1/sqrt(d).
TEST(Rff, ApproximatesGaussianKernel) {
  AttentionSpec spec = small_spec(Family::rff, 4);
  spec.rff.features = 4096;
  const int d = 4;
  const std::vector<double> params = to_double(init_params(spec, 1, 0));
  const std::vector<double> x{0.3, -0.5, 0.2, 0.4}, y{-0.1, 0.6, 0.5, -0.2};
  std::vector<double> px(8192), py(8192);
  const FeatureMap fm(spec, params);
  fm.forward(x.data(), 1, {}, px.data());
  fm.forward(y.data(), 1, {}, py.data());
  double dist = 0;
  for (int c = 0; c < d; ++c) dist += (x[c] - y[c]) * (x[c] - y[c]);
  EXPECT_NEAR(dot(px.data(), py.data(), 8192), std::exp(-0.5 * dist / std::sqrt(double(d))), 0.03);
}

// Derivatives of the elementwise functions against central differences (step 1e-6,
// error ~1e-10), at points away from the kinks of relu.
TEST(Activations, DerivativesMatchDifferences) {
  const double h = 1e-6;
  for (double t : {-2.3, -0.7, 0.4, 1.9}) {
    for (Activation a : {Activation::relu, Activation::gelu, Activation::silu, Activation::tanh})
      EXPECT_NEAR(activation_grad(a, t), (activation(a, t + h) - activation(a, t - h)) / (2 * h), 1e-8);
    for (OutputActivation a : {OutputActivation::relu, OutputActivation::softplus, OutputActivation::none})
      EXPECT_NEAR(output_activation_grad(a, t), (output_activation(a, t + h) - output_activation(a, t - h)) / (2 * h), 1e-8);
    for (int l = 0; l < 8; ++l)
      EXPECT_NEAR(bank_basis_grad(l, t), (bank_basis(l, t + h) - bank_basis(l, t - h)) / (2 * h), 1e-8) << l;
  }
  EXPECT_NEAR(activation(Activation::gelu, 1.0), 0.8413447460685429, 1e-15);  // erf form, not tanh
  EXPECT_NEAR(output_activation(OutputActivation::softplus, 800.0), 800.0, 1e-12);
  EXPECT_NEAR(output_activation(OutputActivation::softplus, -800.0), 0.0, 1e-300);
  EXPECT_EQ(bank_basis(3, 0.0), 0.5);
  EXPECT_EQ(bank_basis(7, 0.0), 1.0);
}

}  // namespace
}  // namespace lunajit::reference::testing
