#include "codegen/baseline_model.h"

#include <algorithm>
#include <cmath>

#include "codegen/cost_model.h"

namespace lunajit {
namespace {

double pass_ms(double compute_s, double memory_s, int launches) {
  return std::max(compute_s, memory_s) * 1e3 + launches * kLaunchOverheadMs;
}

// Bytes and op count of an eager composition, one materialised fp32 tensor at a time.
struct EagerTally {
  double bytes = 0;
  int ops = 0;
  // A tensor of `floats` values written by one op and read `reads` times.
  void tensor(double floats, int reads = 1) {
    bytes += 4 * floats * (1 + reads);
    ++ops;
  }
};

}  // namespace

BaselinePrediction softmax_attention_baseline(const AttentionSpec& spec, const ProblemShape& shape,
                                              const GpuSpec& gpu) {
  const double BH = double(shape.batch) * shape.heads, N = shape.seq, d = spec.head_dim, dv = spec.value_dim;
  const double e = dtype_bytes(spec.dtype);
  const double peak = tensor_peak_tflops(gpu, spec.dtype) * 1e12, bw = gpu.memory_gbps * 1e9 * kBandwidthEfficiency;
  BaselinePrediction p;
  // 2 N^2 (d + dv) per head: Q K^T and P V; the causal mask skips half.
  p.forward.flops = 2 * BH * N * N * (d + dv) * (spec.causal ? 0.5 : 1.0);
  p.backward.flops = 2.5 * p.forward.flops;
  // Q, K, V read, O and the fp32 logsumexp written; the backward reads Q, K, V, O, dO and the
  // logsumexp and writes dQ, dK, dV.
  p.forward.bytes = BH * N * (2 * d + 2 * dv) * e + 4 * BH * N;
  p.backward.bytes = BH * N * (4 * d + 4 * dv) * e + 4 * BH * N;
  p.forward.launches = kSoftmaxForwardLaunches;
  p.backward.launches = kSoftmaxBackwardLaunches;
  for (auto [pass, eff] : {std::pair{&p.forward, kSoftmaxForwardEfficiency}, {&p.backward, kSoftmaxBackwardEfficiency}}) {
    const double compute_s = peak > 0 ? pass->flops / (eff * peak) : 0, memory_s = bw > 0 ? pass->bytes / bw : 0;
    pass->ms = pass_ms(compute_s, memory_s, pass->launches);
    pass->limiter = compute_s >= memory_s ? "tensor" : "dram";
  }
  return p;
}

EagerFeatureMap eager_feature_map(const AttentionSpec& s) {
  // One entry per materialised tensor of torch_binding/aten_attention.cpp `features` (per token).
  EagerFeatureMap f;
  auto t = [&](double floats) { f.floats += floats, ++f.ops; };
  const double d = s.head_dim, D = s.feature_dim();
  t(d);  // x cast to the fp32 compute dtype
  if (s.family == Family::luna) {
    const double M = s.luna.projections, L = s.luna.channels, Hm = s.luna.mlp_width;
    t(M);  // u = einsum(x, W)
    switch (s.luna.variant) {
      case LunaVariant::neural:
        if (s.luna.shared_channels) {
          t(M * Hm), t(M * Hm), t(M * Hm);  // u * W1, + b1, activation
          t(M * L), t(M * L);               // einsum with W2, + b2
        } else {
          t(M * L * Hm), t(M * L * Hm), t(M * L * Hm), t(M * L * Hm);  // u * W1, + b1, activation, * W2
          t(M * L), t(M * L);                                          // sum over Hm, + b2
        }
        if (s.luna.output_activation != OutputActivation::none) t(M * L);
        break;
      case LunaVariant::bank_coef:
        for (int l = 0; l < s.luna.channels; ++l) t(M);  // one basis function each
        t(M * L), t(M * L);                                // stack, * coef
        break;
      case LunaVariant::rff: t(M), t(M), t(2 * M); break;  // cos, sin, stack
    }
    if (s.luna.envelope) t(1), t(1), t(1);  // a . x + c, sigmoid, * scale
    t(D);                                   // phi = psi * scale
    return f;
  }
  // Other families: the projection (or the element-wise input) and phi; a lower bound.
  t(D), t(D);
  return f;
}

BaselinePrediction eager_linear_attention_baseline(const AttentionSpec& spec, const ProblemShape& shape,
                                                   const GpuSpec& gpu) {
  const double BH = double(shape.batch) * shape.heads, N = shape.seq, d = spec.head_dim, dv = spec.value_dim;
  const double D = spec.feature_dim(), e = dtype_bytes(spec.dtype);
  const EagerFeatureMap fm = eager_feature_map(spec);
  EagerTally x;  // per (batch, head)
  x.bytes += N * (2 * d + dv) * e;         // q, k, v read
  x.bytes += 2 * 8 * fm.floats * N;       // phi(q), phi(k): each intermediate written and read once
  x.ops += 2 * fm.ops;
  x.bytes += 2 * 4 * N * D;                // phi(q), phi(k) read a second time (numerator and denominator)
  x.tensor(N * dv);                        // v cast to fp32
  if (!spec.causal) {
    x.tensor(D * dv);                      // S = phi(k)^T v
    x.tensor(D);                           // z = sum phi(k)
    x.tensor(N * dv);                      // num = phi(q) S
    x.tensor(N), x.tensor(N);              // phi(q) z, + eps
    x.tensor(N * dv);                      // o = num / den
  } else {
    const double C = std::min<double>(kEagerCausalChunk, N), chunks = std::ceil(N / C);
    x.tensor(N * C);                       // A = phi(q_c) phi(k_c)^T, read by tril
    x.tensor(N * C, 2);                    // tril(A), read by A V and by its row sum
    x.tensor(chunks * D * dv), x.tensor(chunks * D * dv), x.tensor(chunks * D * dv);  // kv, cumsum, cat
    x.tensor(chunks * D), x.tensor(chunks * D), x.tensor(chunks * D);                 // z, cumsum, cat
    x.tensor(N * dv), x.tensor(N * dv), x.tensor(N * dv);  // A V, phi(q) S_<c, their sum
    x.tensor(N), x.tensor(N), x.tensor(N), x.tensor(N);    // row sum of A, phi(q) z_<c, sum, + eps
    x.tensor(N * dv);                                      // o = num / den
  }
  x.bytes += N * dv * (4 + e);             // o cast back to the I/O dtype (fp32 read, dtype written)
  x.ops += 1;
  const double bw = gpu.memory_gbps * 1e9 * kBandwidthEfficiency;
  BaselinePrediction p;
  p.forward.bytes = BH * x.bytes;
  p.forward.launches = x.ops;
  p.backward.bytes = 2 * p.forward.bytes;
  p.backward.launches = 2 * x.ops;
  for (BaselinePass* pass : {&p.forward, &p.backward}) {
    pass->ms = pass_ms(0, bw > 0 ? pass->bytes / bw : 0, pass->launches);
    pass->limiter = "dram";
  }
  return p;
}

}  // namespace lunajit
