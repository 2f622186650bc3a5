#include "reference/quadratic_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace lunajit::reference {
namespace {

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The log of the softmax kernel, so rows can be max-shifted before exp.
double softmax_logit(const double* q, const double* k, int d) { return dot(q, k, d) / std::sqrt(double(d)); }

}  // namespace

double quadratic_kernel(const QuadraticOptions& opts, const double* q, const double* k, int d) {
  switch (opts.kernel) {
    case QuadraticKernel::softmax: return std::exp(softmax_logit(q, k, d));
    case QuadraticKernel::yat: {
      double dist = 0;
      for (int c = 0; c < d; ++c) dist += (q[c] - k[c]) * (q[c] - k[c]);
      const double qk = dot(q, k, d);
      return qk * qk / (dist + opts.eps);
    }
    case QuadraticKernel::spherical_yat: {
      const double x = dot(q, k, d) / std::sqrt(dot(q, q, d) * dot(k, k, d));
      return x * x / (2.0 + opts.eps_yat - 2.0 * x);
    }
  }
  return 0;
}

Result<std::vector<double>> quadratic_weights(const QuadraticOptions& opts, const AttentionShape& shape,
                                              int d, std::span<const double> q,
                                              std::span<const double> k) {
  const size_t want = size_t(shape.rows()) * d;
  if (q.size() != want || k.size() != want)
    return Error::invalid(fmt::format("q has {} and k {} elements: expected {} each for [batch {}, seq {}, heads {}, d {}]",
                                      q.size(), k.size(), want, shape.batch, shape.seq, shape.heads, d));
  const int N = shape.seq;
  std::vector<double> A(size_t(shape.batch) * shape.heads * N * N, 0.0);
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads; ++h)
      for (int i = 0; i < N; ++i) {
        double* row = A.data() + ((int64_t(b) * shape.heads + h) * N + i) * N;
        const double* qi = q.data() + shape.row(b, i, h) * d;
        const int last = opts.causal ? i : N - 1;
        double shift = 0;  // softmax: the row max of the logits, so exp never overflows
        if (opts.kernel == QuadraticKernel::softmax) {
          shift = -std::numeric_limits<double>::infinity();
          for (int j = 0; j <= last; ++j) shift = std::max(shift, softmax_logit(qi, k.data() + shape.row(b, j, h) * d, d));
        }
        double sum = 0;
        for (int j = 0; j <= last; ++j) {
          const double* kj = k.data() + shape.row(b, j, h) * d;
          row[j] = opts.kernel == QuadraticKernel::softmax ? std::exp(softmax_logit(qi, kj, d) - shift)
                                                           : quadratic_kernel(opts, qi, kj, d);
          sum += row[j];
        }
        for (int j = 0; j <= last; ++j) row[j] /= sum;
      }
  return A;
}

std::vector<double> apply_weights(std::span<const double> weights, const AttentionShape& shape,
                                  int dv, std::span<const double> v) {
  const int N = shape.seq;
  std::vector<double> out(size_t(shape.rows()) * dv, 0.0);
  for (int b = 0; b < shape.batch; ++b)
    for (int h = 0; h < shape.heads; ++h)
      for (int i = 0; i < N; ++i) {
        const double* row = weights.data() + ((int64_t(b) * shape.heads + h) * N + i) * N;
        double* o = out.data() + shape.row(b, i, h) * dv;
        for (int j = 0; j < N; ++j) {
          const double* vj = v.data() + shape.row(b, j, h) * dv;
          for (int c = 0; c < dv; ++c) o[c] += row[j] * vj[c];
        }
      }
  return out;
}

Result<std::vector<double>> quadratic_attention(const QuadraticOptions& opts,
                                                const AttentionShape& shape, int d, int dv,
                                                std::span<const double> q,
                                                std::span<const double> k,
                                                std::span<const double> v) {
  if (v.size() != size_t(shape.rows()) * dv)
    return Error::invalid(fmt::format("v has {} elements: expected {}", v.size(), shape.rows() * dv));
  Result<std::vector<double>> A = quadratic_weights(opts, shape, d, q, k);
  if (!A) return A.error();
  return apply_weights(*A, shape, dv, v);
}

}  // namespace lunajit::reference
