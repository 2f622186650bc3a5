// Sequence parallelism for linear attention over c10d (docs/ARCHITECTURE.md,
// "Distributed"): one sequence split into R contiguous shards, shard r on rank
// r (rank 0 holds the first tokens). Linear attention only needs each rank's
// state delta
//     S_r = sum_{j in shard r} phi(k_j) v_j^T   [batch, heads, D, dv]
//     z_r = sum_{j in shard r} phi(k_j)         [batch, heads, D]
// (packed as one [batch, heads, D, dv + 1] tensor; z only when normalized):
//
//   non-causal  (S, z) = sum_r (S_r, z_r) on every rank; o_i = phi(q_i) S /
//               (phi(q_i) z + eps) for the local queries.
//   causal      rank r's exclusive prefix (S_<r, z_<r) = sum_{j<r} (S_j, z_j),
//               then the local chunked causal pass seeded with it: o_i =
//               (local causal numerator + phi(q_i) S_<r) / (local denominator +
//               phi(q_i) z_<r + eps).
//
// The sums over ranks are differentiable collectives (torch_binding/
// distributed.h): the backward of the all-reduce is an all-reduce of (dS, dz),
// the backward of the exclusive prefix the reverse exclusive prefix
// sum_{j>r} (dS_j, dz_j); everything else is ATen autograd, so gradients reach
// this rank's q, k, v and the feature parameters. Sums over ranks run in rank
// order (Reduction::fixed_order), so outputs and gradients are the same bits in
// every run; they equal the single-process lunajit::linear_attention to fp32
// rounding (different summation order).
//
// feature_params is replicated: its gradient on each rank is that rank's
// tokens' share; the full gradient is the sum over ranks (data-parallel style:
// all_reduce_gradients averages, so scale by R, or sum the losses' shares).
//
// Communication per call and rank: forward one allgather of the packed delta,
// B * H * D * (dv + 1) * sizeof(compute dtype) bytes contributed and (R - 1)
// times that received (dv instead of dv + 1 when not normalized); the backward
// the same again. (Reduction::backend_allreduce, non-causal only: one allreduce
// of the same payload each way.)
//
// Supported: the families whose features are per token: luna (every variant),
// rff, elu, relu, t2r, hedgehog, slay. Not: cosformer (features depend on the
// global position and length), performer (its key stabiliser is a max over all
// keys, causal: a running max). Any device the process group's backend serves
// (Gloo: CPU; NCCL: CUDA). Grouped-query k, v are repeated to q's heads;
// non-causal shards of q and of k, v may differ in length. Every shard must
// have at least one token.
//
// Paths (SequenceParallelOptions::path):
//   aten          the features materialised by ATen, the delta one einsum, the
//                 local causal pass aten::linear_attention_from_features.
//   host_kernels, cuda_kernels
//                 the generated kernels through the carried-state op
//                 (lunajit::linear_attention_with_state), differentiated by
//                 the backward kernels:
//                 causal      delta = the final state of a zero-state pass over
//                             the shard; o = a second pass seeded with the
//                             prefix (two passes: the kernels have no
//                             state-only entry yet);
//                 non-causal  delta = the final state of a causal pass over the
//                             k, v shard (the non-causal state is the causal
//                             final state); o from the summed state by an
//                             unnormalized causal pass over q seeded with the
//                             state and fed v = 0 (so the keys add nothing),
//                             value_dim dv + 1 carrying the denominator column,
//                             in fp32, divided in ATen. Two passes as well.
//                 Tensors in spec.dtype, fp32 params, as for the op.
//   automatic     cuda_kernels for CUDA tensors (when compiled in), else aten.
#pragma once

#include <torch/torch.h>

#include <optional>

#include "codegen/attention_spec.h"
#include "codegen/tile_config.h"
#include "torch_binding/distributed.h"
#include "torch_binding/linear_attention.h"

namespace lunajit::dist {

struct SequenceParallelOptions {
  int64_t chunk = 64;  // the local causal pass's chunk size (aten::linear_attention_from_features)
  // fixed_order (deterministic) or backend_allreduce (non-causal only; the
  // causal prefix is always an allgather summed in rank order).
  Reduction reduction = Reduction::fixed_order;
  AttentionPath path = AttentionPath::aten;
  // Kernel paths: the tile config of the passes over the spec itself (the
  // non-causal output pass, a spec of its own, uses the tuned or default one).
  std::optional<TileConfig> config;
};

// This rank's output [batch, n_r, heads, dv] for its shard q [batch, n_r, heads,
// head_dim], k [batch, m_r, heads_kv, head_dim], v [batch, m_r, heads_kv, dv]
// (m_r == n_r when causal). A collective: every rank of comm calls it with the
// same spec, options, batch, heads and dims. The same input checks as
// lunajit::linear_attention (TORCH_CHECK, naming the argument), plus the family
// and shard rules above.
torch::Tensor sequence_parallel_linear_attention(Communicator& comm, const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v, const torch::Tensor& feature_params,
                                                 const AttentionSpec& spec, const SequenceParallelOptions& options = {});

// Bytes this rank contributes to one call's forward collective (the backward
// contributes as many): B * H * D * (dv + normalize) * element size.
int64_t sequence_parallel_payload_bytes(const AttentionSpec& spec, int64_t batch, int64_t heads,
                                        torch::ScalarType compute);

}  // namespace lunajit::dist
