// Quadratic references: rows are distributions (sum to one, masked entries zero),
// a hand-computed softmax row, the invariances each kernel has (and one it must
// not have), and attention = weights * v.
#include <cmath>

#include <gtest/gtest.h>

#include "reference_test_util.h"

namespace lunajit::reference::testing {
namespace {

constexpr QuadraticKernel kKernels[] = {QuadraticKernel::softmax, QuadraticKernel::yat,
                                        QuadraticKernel::spherical_yat};

TEST(QuadraticAttention, RowsAreDistributionsAndCausalMasks) {
  const AttentionShape shape{2, 6, 3};
  const int d = 5, N = shape.seq;
  std::mt19937_64 rng(1);
  const std::vector<double> q = randn(rng, shape.rows() * d), k = randn(rng, shape.rows() * d);
  for (QuadraticKernel kernel : kKernels)
    for (bool causal : {false, true}) {
      Result<std::vector<double>> A = quadratic_weights({kernel, causal}, shape, d, q, k);
      ASSERT_TRUE(A.ok()) << A.error().message;
      for (int row = 0; row < shape.batch * shape.heads * N; ++row) {
        double sum = 0;
        for (int j = 0; j < N; ++j) {
          const double a = (*A)[size_t(row) * N + j];
          EXPECT_GE(a, 0.0);
          if (causal && j > row % N) EXPECT_EQ(a, 0.0);
          sum += a;
        }
        EXPECT_NEAR(sum, 1.0, 1e-14);
      }
    }
}

TEST(QuadraticAttention, SoftmaxHandComputed) {
  // d = 4 (sqrt(d) = 2), one head, two keys: logits q.k/2 = {1, 0} -> weights {e/(e+1), 1/(e+1)}.
  const AttentionShape shape{1, 2, 1};
  const std::vector<double> q{2, 0, 0, 0, 2, 0, 0, 0}, k{1, 0, 0, 0, 0, 1, 0, 0}, v{10, 20};
  Result<std::vector<double>> o = quadratic_attention({QuadraticKernel::softmax}, shape, 4, 1, q, k, v);
  ASSERT_TRUE(o.ok());
  const double e = std::exp(1.0);
  EXPECT_NEAR((*o)[0], (10 * e + 20) / (e + 1), 1e-13);
  Result<std::vector<double>> oc = quadratic_attention({QuadraticKernel::softmax, true}, shape, 4, 1, q, k, v);
  ASSERT_TRUE(oc.ok());
  EXPECT_EQ((*oc)[0], 10.0);  // causal: query 0 sees key 0 only
}

TEST(QuadraticAttention, YatHandComputed) {
  // q = (1, 0); k0 = (1, 1): (q.k)^2 = 1, |q-k|^2 = 1; k1 = (2, 0): 4 / 1. Weights {1/5, 4/5}.
  const AttentionShape shape{1, 2, 1};
  const std::vector<double> q{1, 0, 1, 0}, k{1, 1, 2, 0};
  Result<std::vector<double>> A = quadratic_weights({QuadraticKernel::yat, false, 0.0}, shape, 2, q, k);
  ASSERT_TRUE(A.ok());
  EXPECT_NEAR((*A)[0], 0.2, 1e-15);
  EXPECT_NEAR((*A)[1], 0.8, 1e-15);
  // Spherical: q^.k0^ = 1/sqrt2 -> 0.5 / (2.001 - sqrt2); q^.k1^ = 1 -> 1 / 0.001.
  QuadraticOptions sph{QuadraticKernel::spherical_yat};
  EXPECT_NEAR(quadratic_kernel(sph, q.data(), k.data(), 2), 0.5 / (2.001 - std::sqrt(2.0)), 1e-12);
  EXPECT_NEAR(quadratic_kernel(sph, q.data(), k.data() + 2, 2), 1000.0, 1e-9);
}

TEST(QuadraticAttention, Invariances) {
  const AttentionShape shape{1, 5, 2};
  const int d = 4;
  std::mt19937_64 rng(2);
  const std::vector<double> q = randn(rng, shape.rows() * d), k = randn(rng, shape.rows() * d);
  std::vector<double> k_shift(k), q3(q), k3(k);
  const std::vector<double> c = randn(rng, d);
  for (size_t i = 0; i < k.size(); ++i) {
    k_shift[i] += c[i % d];  // adds q_i.c/sqrt(d) to every logit of row i
    k3[i] *= 3;
    q3[i] *= 0.5;
  }
  const auto weights = [&](QuadraticKernel kern, const std::vector<double>& qq, const std::vector<double>& kk) {
    return quadratic_weights({kern}, shape, d, qq, kk).value_or_throw();
  };
  expect_close(weights(QuadraticKernel::softmax, q, k_shift), weights(QuadraticKernel::softmax, q, k), 1e-13, 0, "softmax shift");
  expect_close(weights(QuadraticKernel::spherical_yat, q3, k3), weights(QuadraticKernel::spherical_yat, q, k), 1e-13, 0, "sph scale");
  // yat is not scale invariant: the same rescaling must change its weights.
  const std::vector<double> a = weights(QuadraticKernel::yat, q3, k3), b = weights(QuadraticKernel::yat, q, k);
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  EXPECT_GT(diff, 1e-3);
}

TEST(QuadraticAttention, AttentionIsWeightsTimesValues) {
  const AttentionShape shape{2, 4, 2};
  const int d = 3, dv = 2, N = shape.seq;
  std::mt19937_64 rng(3);
  const std::vector<double> q = randn(rng, shape.rows() * d), k = randn(rng, shape.rows() * d), v = randn(rng, shape.rows() * dv);
  for (QuadraticKernel kernel : kKernels) {
    const std::vector<double> A = quadratic_weights({kernel, true}, shape, d, q, k).value_or_throw();
    const std::vector<double> o = quadratic_attention({kernel, true}, shape, d, dv, q, k, v).value_or_throw();
    for (int b = 0; b < shape.batch; ++b)
      for (int h = 0; h < shape.heads; ++h)
        for (int i = 0; i < N; ++i)
          for (int c = 0; c < dv; ++c) {
            double want = 0;
            for (int j = 0; j <= i; ++j)
              want += A[((b * shape.heads + h) * N + i) * N + j] * v[shape.row(b, j, h) * dv + c];
            EXPECT_NEAR(o[shape.row(b, i, h) * dv + c], want, 1e-13);
          }
  }
}

TEST(QuadraticAttention, RejectsWrongSizes) {
  const AttentionShape shape{1, 3, 1};
  Result<std::vector<double>> A = quadratic_weights({}, shape, 2, std::vector<double>(6), std::vector<double>(5));
  ASSERT_FALSE(A.ok());
  EXPECT_NE(A.error().message.find("k 5"), std::string::npos) << A.error().message;
  Result<std::vector<double>> o =
      quadratic_attention({}, shape, 2, 2, std::vector<double>(6, 1.0), std::vector<double>(6, 1.0), std::vector<double>(5));
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.error().message.find("v has 5"), std::string::npos) << o.error().message;
}

}  // namespace
}  // namespace lunajit::reference::testing
