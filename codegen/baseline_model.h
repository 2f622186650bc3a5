// Baselines for the kernel report's hardware comparison (report/summary.h):
// what the same attention layer would cost on the same GPU done two other
// ways, predicted from counts and the GPU table (codegen/gpu_specs.h) like the
// cost model (codegen/cost_model.h), never measured.
//
// ------------------------------------------- quadratic softmax attention
// FlashAttention-like: one fused kernel per pass that reaches a fixed fraction
// of the dtype's dense tensor-core peak and of DRAM bandwidth. FLOPs are
// FlashAttention's benchmark convention (benchmarks/benchmark_flash_attention.py:
// f = 4 B H N^2 d, halved when causal; backward 2.5 f, forward + backward 3.5 f),
// generalised to dv != d:
//   flops_fwd  = 2 B H N^2 (d + dv) * (causal ? 1/2 : 1)     (Q K^T and P V)
//   flops_bwd  = 2.5 flops_fwd                               (dV, dP, dQ, dK and the recomputed Q K^T)
//   bytes_fwd  = B H N (2d + 2dv) e + 4 B H N                (read Q, K, V, write O; fp32 logsumexp)
//   bytes_bwd  = B H N (4d + 4dv) e + 4 B H N                (read Q, K, V, O, dO, logsumexp; write dQ, dK, dV)
//   t_pass     = max(flops / (eff_pass * tensor_peak(dtype)), bytes / (eff_bw * BW)) + launches * 3 us
// with eff_fwd = 0.70, eff_bwd = 0.50 (FlashAttention-2 reports 50-73% of the
// A100's peak, the backward at the low end; FlashAttention-3 75% forward on
// H100), eff_bw = 0.80, launches 1 forward and 3 backward (FlashAttention-2's
// dot(dO, O) pre-pass, the main kernel, the dQ conversion). fp32 specs use the
// TF32 peak (FlashAttention has no fp32 path; this is what a TF32 one could do).
// The launch term is the cost model's kLaunchOverheadMs, so the three
// predictions of a report pay for launches alike.
//
// ------------------------------------------- eager ATen composition
// The spec's linear attention written as ATen ops (torch_binding/aten_attention.cpp),
// each op a kernel that writes its result to DRAM and the next op reads it back:
//   t_pass = bytes / (eff_bw * BW) + ops * 3 us
// a bandwidth bound (the ops' FLOPs are not what limits them). Bytes count every
// materialised tensor once written and once read (fp32, the compute dtype), the
// inputs read once in their dtype and the output written once:
//   phi(q), phi(k): the feature map's intermediates per token (eager_feature_map,
//     e.g. luna neural shared channels: x cast to fp32 d, u M, u W1, + b1 and the
//     activation 3 M Hm, W2 and + b2 2 M L, the output activation M L, phi D),
//     for queries and keys, and phi read once more (numerator and denominator
//     both read it);
//   v cast to fp32 (N dv);
//   non-causal: S = phi(k)^T v (D dv), z (D), num = phi(q) S (N dv), den (N,
//     product and + eps), o = num / den (N dv);
//   causal (MATH.md's chunked form, chunk C = 64 as the ATen path's default):
//     A = phi(q_c) phi(k_c)^T (N C, read by tril), tril(A) (N C, read by A V
//     and by its row sum), per-chunk states kv (N/C D dv) and z (N/C D), each with its
//     cumsum and cat (3 copies), num (A V, phi(q) S_<c, their sum: 3 x N dv),
//     den (row sum, phi(q) z_<c, sum, + eps: 4 x N), o (N dv);
//   the output cast back to the I/O dtype (fp32 read, dtype written);
//   backward: 2x the forward's bytes and ops (each saved tensor read again and
//     its gradient written and read once): an estimate, not a count.
// These counts follow the ATen code as written for LUNA; for the other
// families the feature map is counted as its projection and phi (D + D floats),
// which is a lower bound.
#pragma once

#include "codegen/attention_spec.h"
#include "codegen/gpu_specs.h"
#include "codegen/launch_plan.h"

namespace lunajit {

inline constexpr double kSoftmaxForwardEfficiency = 0.70;
inline constexpr double kSoftmaxBackwardEfficiency = 0.50;
inline constexpr double kBandwidthEfficiency = 0.80;
inline constexpr int kSoftmaxForwardLaunches = 1;
inline constexpr int kSoftmaxBackwardLaunches = 3;
inline constexpr int kEagerCausalChunk = 64;

// One pass of a baseline: its counts and predicted time.
struct BaselinePass {
  double flops = 0;
  double bytes = 0;
  int launches = 0;
  double ms = 0;
  const char* limiter = "";  // "tensor" or "dram" (softmax), "dram" (eager)
};

struct BaselinePrediction {
  BaselinePass forward, backward;
  double total_ms() const { return forward.ms + backward.ms; }
};

// Quadratic softmax attention at FlashAttention-like efficiency (above), for
// the spec's dims, dtype and causality at `shape` on `gpu`.
BaselinePrediction softmax_attention_baseline(const AttentionSpec& spec, const ProblemShape& shape,
                                              const GpuSpec& gpu);

// The eager ATen composition of the spec's linear attention (above).
BaselinePrediction eager_linear_attention_baseline(const AttentionSpec& spec, const ProblemShape& shape,
                                                   const GpuSpec& gpu);

// fp32 values the eager feature map materialises per token of one head
// (phi included), and the number of ATen ops that write them.
struct EagerFeatureMap {
  double floats = 0;
  int ops = 0;
};
EagerFeatureMap eager_feature_map(const AttentionSpec& spec);

}  // namespace lunajit
