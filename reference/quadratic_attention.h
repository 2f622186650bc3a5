// Quadratic attention references (docs/MATH.md §2, last entry): softmax, yat and
// spherical yat. Not generated kernels: teachers for conversion, baselines for
// benchmarks and the targets of the SLAY approximation study. O(n^2) in double.
#pragma once

#include <span>
#include <vector>

#include "common/result.h"
#include "reference/tensor_layout.h"

namespace lunajit::reference {

enum class QuadraticKernel {
  softmax,        // exp(q.k / sqrt(d)), row-normalized (max-shifted)
  yat,            // (q.k)^2 / (|q - k|^2 + eps), row-normalized
  spherical_yat,  // (q^.k^)^2 / (C - 2 q^.k^), C = 2 + eps_yat, q^ = q/|q|, row-normalized
};

struct QuadraticOptions {
  QuadraticKernel kernel = QuadraticKernel::softmax;
  bool causal = false;    // keys j <= i only
  double eps = 1e-6;      // yat: added to |q - k|^2
  double eps_yat = 1e-3;  // spherical yat: C = 2 + eps_yat (SlayOptions::eps_yat)
};

// The unnormalized kernel value k(q, k) of `opts` for two d-vectors (softmax:
// exp(q.k/sqrt(d)) without the max shift). Spherical yat is what SLAY's
// <phi(q), phi(k)> approximates.
double quadratic_kernel(const QuadraticOptions& opts, const double* q, const double* k, int d);

// Attention weights [batch, heads, seq, seq] (row i = query, column j = key):
// the kernel values normalized by their row sum, masked entries 0, so that every
// row sums to one. q, k are [batch, seq, heads, d].
Result<std::vector<double>> quadratic_weights(const QuadraticOptions& opts, const AttentionShape& shape,
                                              int d, std::span<const double> q,
                                              std::span<const double> k);

// out [batch, seq, heads, dv] = weights v, with v [batch, seq, heads, dv].
Result<std::vector<double>> quadratic_attention(const QuadraticOptions& opts,
                                                const AttentionShape& shape, int d, int dv,
                                                std::span<const double> q,
                                                std::span<const double> k,
                                                std::span<const double> v);

// Applies weights [batch, heads, seq, seq] (quadratic or linear_attention_weights)
// to v [batch, seq, heads, dv].
std::vector<double> apply_weights(std::span<const double> weights, const AttentionShape& shape,
                                  int dv, std::span<const double> v);

}  // namespace lunajit::reference
