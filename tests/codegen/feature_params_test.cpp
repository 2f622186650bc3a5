// Parameter layout and initialisation (codegen/feature_params.h).
#include "codegen/feature_params.h"

#include <cmath>

#include <gtest/gtest.h>

namespace lunajit {
namespace {

TEST(FeatureParams, LunaLayoutIsContiguousInDocumentedOrder) {
  AttentionSpec s = default_spec(Family::luna);
  ParamLayout l = param_layout(s);
  ASSERT_EQ(l.tensors.size(), 5u);
  EXPECT_EQ(l.tensors[0].name, "W");
  EXPECT_EQ(l.tensors[1].name, "W1");
  EXPECT_EQ(l.tensors[1].offset, 8 * 64);
  EXPECT_EQ(l.per_head_floats, 8 * 64 + 64 + 64 + 8 * 64 + 8);
  EXPECT_EQ(l.total_floats(s, 4), 4 * l.per_head_floats);
  s.params_per_head = false;
  EXPECT_EQ(l.total_floats(s, 4), l.per_head_floats);
}

TEST(FeatureParams, InitialisationIsDeterministicAndSeeded) {
  AttentionSpec s = default_spec(Family::luna);
  auto a = init_params(s, 2, 7), b = init_params(s, 2, 7), c = init_params(s, 2, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // W ~ N(0, 1/d): sample variance within 20% of 1/64 over 512 draws.
  double sum2 = 0;
  for (int i = 0; i < 8 * 64; ++i) sum2 += a[i] * a[i];
  EXPECT_NEAR(sum2 / 512, 1.0 / 64, 0.2 / 64);
}

TEST(FeatureParams, PerformerOrthogonalRowsWithinABlock) {
  AttentionSpec s = default_spec(Family::performer);
  s.head_dim = 16;
  s.performer.features = 16;
  auto p = init_params(s, 1);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < i; ++j) {
      double dot = 0, ni = 0, nj = 0;
      for (int c = 0; c < 16; ++c) {
        dot += p[i * 16 + c] * p[j * 16 + c];
        ni += p[i * 16 + c] * p[i * 16 + c];
        nj += p[j * 16 + c] * p[j * 16 + c];
      }
      EXPECT_NEAR(dot / std::sqrt(ni * nj), 0.0, 1e-5) << i << "," << j;
    }
}

TEST(FeatureParams, HedgehogStartsAtIdentity) {
  AttentionSpec s = default_spec(Family::hedgehog);
  auto p = init_params(s, 1);
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_EQ(p[65], 1.0f);
}

TEST(FeatureParams, GaussLaguerreIntegratesPolynomialsExactly) {
  // int_0^inf e^-t t^k dt = k!; R nodes are exact up to degree 2R - 1.
  for (int R : {1, 2, 3, 5, 8}) {
    std::vector<double> t, a;
    gauss_laguerre(R, t, a);
    double fact = 1;
    for (int k = 0; k < 2 * R; ++k) {
      if (k > 0) fact *= k;
      double q = 0;
      for (int i = 0; i < R; ++i) q += a[i] * std::pow(t[i], k);
      EXPECT_NEAR(q / fact, 1.0, 1e-9) << "R=" << R << " k=" << k;
    }
  }
}

TEST(FeatureParams, SlayAnchorsAreUnitNormAndNodesScaledByC) {
  AttentionSpec s = default_spec(Family::slay);
  auto p = init_params(s, 1);
  ParamLayout l = param_layout(s);
  const float* anchors = p.data() + l.find("anchors")->offset;
  for (int a = 0; a < s.slay.anchors; ++a) {
    double n = 0;
    for (int c = 0; c < s.head_dim; ++c) n += anchors[a * s.head_dim + c] * anchors[a * s.head_dim + c];
    EXPECT_NEAR(n, 1.0, 1e-5);
  }
  std::vector<double> t, w;
  gauss_laguerre(3, t, w);
  EXPECT_NEAR(p[l.find("nodes")->offset], t[0] / (2 + 1e-3), 1e-6);
  EXPECT_NEAR(p[l.find("weights")->offset + 2], w[2] / (2 + 1e-3), 1e-6);
}

}  // namespace
}  // namespace lunajit
