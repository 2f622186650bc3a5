// lunajit::linear_attention: the autograd op that puts lunajit's linear
// attention (docs/MATH.md) into LibTorch models.
//
//   q               [batch, seq_q, heads, head_dim]
//   k               [batch, seq_k, heads_kv, head_dim]
//   v               [batch, seq_k, heads_kv, value_dim]
//   feature_params  1-D fp32 [param_layout(spec).total_floats(spec, heads)], the
//                   flat layout of codegen/feature_params.h (init_feature_params);
//                   an empty tensor for elu, relu and cosformer
//   result          [batch, seq_q, heads, value_dim]
//
// Grouped-query attention: heads_kv may be fewer than heads (a divisor of it);
// kv head j serves query heads j*g .. j*g+g-1, g = heads / heads_kv (torch SDPA's
// enable_gqa order), computed as if k and v were repeated g times over heads (a
// copy on every path: no memory saving yet). Cross-attention: seq_k may differ
// from seq_q when not causal (an error for causal specs and for cosformer,
// whose features depend on the sequence length); on the kernel paths through
// the carried-state kernels (packed_state_kernels, then
// output_from_state_kernels: two passes), not for performer nor with key_mask
// (those run on path aten; automatic picks it).
// key_mask (options): masked keys contribute nothing; cu_seqlens (options): a
// packed variable-length batch [1, total, heads, dim]; see LinearAttentionOptions.
//
// Strides of batch, seq and heads are arbitrary (slices of a fused QKV projection
// work without a copy); the last (feature) dim must have unit stride.
//
// Paths (LinearAttentionOptions::path):
//   aten          ATen composition of MATH.md (torch_binding/aten_attention.h),
//                 any device, any floating dtype (fp16/bf16 inputs computed in
//                 fp32, fp64 in fp64); gradients by LibTorch autograd.
//   host_kernels  CPU tensors through the generated kernels on the host
//                 emulation backend (AttentionRunner): forward kernels, and the
//                 backward kernels (Pass::backward) for every gradient; with
//                 kernel_backward = false the gradient instead recomputes the
//                 forward with the ATen path and differentiates it.
//   cuda_kernels  CUDA tensors through the NVRTC-compiled kernels on the
//                 tensor's device; compiled only when LibTorch has CUDA
//                 (LUNAJIT_TORCH_CUDA). Same backward choice as host_kernels.
//   automatic     cuda_kernels for CUDA tensors (when compiled in), else aten;
//                 aten also for a call the kernels do not support
//                 (seq_k != seq_q).
// Kernel paths need the tensors in spec.dtype and fp32 params.
#pragma once

#include <optional>
#include <vector>

#include <torch/torch.h>

#include "codegen/attention_spec.h"
#include "codegen/launch_plan.h"
#include "codegen/tile_config.h"
#include "torch_binding/aten_attention.h"

namespace lunajit {

enum class AttentionPath { automatic, aten, host_kernels, cuda_kernels };
std::string_view to_string(AttentionPath p);

struct LinearAttentionOptions {
  AttentionPath path = AttentionPath::automatic;
  // ATen path: causal chunk size C (intra-chunk C x C products, states every C tokens).
  int64_t chunk = 64;
  // Reject q, k, v holding NaN or Inf: one reduction per tensor and, on a GPU, a
  // device synchronization, so off by default.
  bool check_finite = false;
  // Kernel paths: the tile config of both passes; unset = the tuning database's
  // choice, else default_config (see the note on tuning in linear_attention.cpp).
  std::optional<TileConfig> config;
  // Kernel paths: gradients from the backward kernels (true) or from the ATen
  // recomputation (false; slower on a GPU, a cross-check and a fallback).
  bool kernel_backward = true;
  // Key padding: bool [batch, seq_k], true for a real key, false for padding
  // (the opposite of torch's key_padding_mask); undefined: every key is real.
  // Masked keys drop out of S and z exactly (their feature rows are zeroed; the
  // feature map of a pad token is not zero, so zero-padding keys is not the
  // same), so a padded batch equals per-sequence calls on the real tokens, for
  // right or left padding, causal or not (a causal query sees the real keys at
  // or before it). Outputs at pad query positions are computed but meaningless
  // (0 where a normalized query sees no real key). How it is served: on the
  // kernel paths, and for cosformer and causal performer on any path, by
  // packing: the real tokens of each batch row become one sequence of a packed
  // batch (cu_seqlens below), so each row is exactly a call on its real tokens
  // (cosformer's positions and N, performer's stabilisers: the real tokens'
  // own), for any padding pattern; pad query positions get 0. Otherwise (ATen,
  // other families) by zeroed feature rows as above. Needs seq_q == seq_k
  // (self-attention) to pack; cross-attention keeps the feature-row form (ATen).
  torch::Tensor key_mask;
  // Packed variable-length batch (fla's cu_seqlens; docs/MATH.md §3 "Packed
  // sequences"): int32 1-D [num_seqs + 1] offsets on q's device, 0 = cu[0] <=
  // cu[1] <= ... <= cu[num_seqs] = total tokens; q, k, v are packed as
  // [1, total, heads, dim] and sequence s is tokens cu[s] .. cu[s+1]-1. Each
  // sequence is computed alone (tokens never see another sequence's; cosformer
  // uses each sequence's own length; causal performer's running stabiliser
  // restarts per sequence); sequences of length 0 are allowed. Every path,
  // forward and backward. Not with key_mask, nor with seq_k != seq_q. The
  // offsets are read on the host (one device-to-host copy on a GPU) to check
  // them and find the longest sequence.
  torch::Tensor cu_seqlens;
};

// The op (see the file comment). Differentiable in q, k, v and feature_params.
torch::Tensor linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& feature_params, const AttentionSpec& spec,
                               const LinearAttentionOptions& options = {});

// Carried state of causal linear attention (docs/MATH.md §1a; fla's
// initial_state / final_state): S [batch, heads, D, dv] = sum phi(k_j) v_j^T and
// z [batch, heads, D] = sum phi(k_j) over the tokens so far, D the spec's
// feature dim, heads the query heads. fp32 (fp64 allowed on path aten with
// fp64 inputs), contiguous, on q's device. Both undefined = the zero state.
struct LinearAttentionState {
  torch::Tensor S;
  torch::Tensor z;
  bool defined() const { return S.defined() || z.defined(); }
};

struct LinearAttentionStateOutput {
  torch::Tensor out;                  // [batch, seq, heads, value_dim]
  LinearAttentionState final_state;   // undefined unless output_final_state
};

// Causal linear attention from `initial_state` (undefined: zero), returning the
// final state when `output_final_state`. Chaining calls over consecutive
// pieces of a sequence, each fed the previous final state, equals one call
// over the whole (forward and every gradient, to fp32 rounding). Differentiable
// in q, k, v, feature_params and the initial state; the final state's
// gradient flows back into all of them. Paths: aten (autograd), host_kernels
// and cuda_kernels (the causal kernels with the state arguments; backward
// kernels, or the ATen recomputation with kernel_backward = false). Needs a
// causal spec, not performer (its running key stabiliser is not part of the
// state; rejected) nor cosformer (position features); no key_mask, seq_k == seq_q.
LinearAttentionStateOutput linear_attention_with_state(const torch::Tensor& q, const torch::Tensor& k,
                                                       const torch::Tensor& v, const torch::Tensor& feature_params,
                                                       const AttentionSpec& spec,
                                                       const LinearAttentionState& initial_state,
                                                       bool output_final_state,
                                                       const LinearAttentionOptions& options = {});

// Non-causal attention in two halves on a kernel path (options.path
// host_kernels or cuda_kernels; cross-attention and sequence parallelism use
// them). packed_state_kernels: the state of k, v [batch, seq_k, heads_kv, dim]
// for `heads` query heads, (S | z) packed as one fp32 [batch, heads, D, dv + 1]
// tensor (dv when not spec.normalize): the final state of a zero-state causal
// pass (linear_attention_with_state) over k, v, with k as stand-in queries.
// output_from_state_kernels: o = phi(q) S / (phi(q) z + eps) (phi(q) S when not
// normalized) for q [batch, seq_q, heads, head_dim] from such a packed state:
// an unnormalized causal pass in fp32 over q seeded with the state and fed
// v = 0, so the keys add nothing and its output is phi(q) (S | z) exactly, the
// division in ATen; o in q's dtype. Both differentiable (backward kernels), in
// k, v, q, feature_params and the state. Same spec support as
// linear_attention_with_state (not performer, not cosformer); the normalized
// readout needs value_dim + 1 <= 256.
torch::Tensor packed_state_kernels(const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& feature_params,
                                   const AttentionSpec& spec, int64_t heads, const LinearAttentionOptions& options);
torch::Tensor output_from_state_kernels(const torch::Tensor& q, const torch::Tensor& feature_params,
                                        const AttentionSpec& spec, const torch::Tensor& packed_state,
                                        const LinearAttentionOptions& options);

// Tunes the kernels of `spec` at `shapes` into the tuning database the kernel
// paths read (options.config unset), the "autotune before training" step:
// path cuda_kernels on `device` (a CUDA device: candidates checked and timed
// there, CUDA events), or host_kernels (checked by the host emulator, ranked by
// the cost model for sm_90, whose limits the emulator runs under). Shapes
// already in the database are served from it (unless options.retune). Returns
// one entry per (pass, shape): the config the kernel paths will now use.
struct TuneAttentionOptions {
  std::vector<Pass> passes;  // empty: every tunable pass (forward and backward)
  size_t top_k = 6;          // candidates per shape after the cost model's pre-ranking (autotune/tuner.h)
  int threads = 0;           // compile/check workers; 0: every core
  bool retune = false;
};
struct TunedConfig {
  Pass pass;
  ProblemShape shape;
  TileConfig config;
  std::string method;  // "measured" | "model-ranked"
  bool from_db = false;
  bool saved = false;  // stored in the database file (false: this process only)
};
std::vector<TunedConfig> tune_attention(const AttentionSpec& spec, const std::vector<ProblemShape>& shapes,
                                        AttentionPath path, const torch::Device& device,
                                        const TuneAttentionOptions& options = {});

struct LinearAttentionStepOutput {
  torch::Tensor out;           // [batch, 1, heads, value_dim]
  LinearAttentionState state;  // the state after the token
};

// One decoding step (fla's fused_recurrent with one token): q, k [batch, 1,
// heads(_kv), head_dim], v [batch, 1, heads(_kv), value_dim] against `state`
// (undefined: an empty prefix): S += phi(k) v^T, z += phi(k), o = phi(q)^T S /
// (phi(q)^T z + eps). The input state is not modified. Paths: aten
// (differentiable), host_kernels / cuda_kernels (the generated decode kernel,
// codegen/decode_source.h; inference only: an error when an input requires
// grad under grad mode). Same spec restrictions as linear_attention_with_state.
LinearAttentionStepOutput linear_attention_step(const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& v, const torch::Tensor& feature_params,
                                                const AttentionSpec& spec, const LinearAttentionState& state,
                                                const LinearAttentionOptions& options = {});

// phi(x) of spec for x [batch, seq, heads, head_dim] -> [batch, seq, heads, D]
// (ATen, differentiable), with the same input checks as linear_attention.
torch::Tensor feature_map(const torch::Tensor& x, const torch::Tensor& feature_params, const AttentionSpec& spec,
                          aten::FeatureRole role = aten::FeatureRole::query);

// codegen's init_params(spec, heads, seed) as a 1-D fp32 CPU tensor.
torch::Tensor init_feature_params(const AttentionSpec& spec, int64_t heads, uint64_t seed = 0);

// The TORCH_CHECKs linear_attention makes, each message naming the argument:
// spec valid; q, k, v 4-D with spec's dims, one batch, k and v alike in seq and
// heads, heads_kv dividing heads, seq_k == seq_q when causal, for cosformer and
// on kernel paths; floating dtypes alike (spec.dtype on kernel paths); one
// device; unit stride in the last dim; feature_params 1-D, contiguous, of the
// size the spec implies; key_mask bool [batch, seq_k] and allowed on this path
// and spec; optionally finite values.
void check_linear_attention_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   const torch::Tensor& feature_params, const AttentionSpec& spec,
                                   AttentionPath path, bool check_finite, const torch::Tensor& key_mask = {});

// Checks cu_seqlens against q [1, total, heads, head_dim] (int32, 1-D, at least
// 2 offsets, on q's device, cu[0] = 0, non-decreasing, last = total; q, k, v of
// batch 1 and one length) and returns the offsets on the host. Each message
// names the argument and the value.
std::vector<int64_t> check_cu_seqlens(const torch::Tensor& cu_seqlens, const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v);

// The path `options.path` resolves to for tensors on `device`.
AttentionPath resolve_path(AttentionPath requested, const torch::Device& device);

// k or v [batch, seq, heads_kv, dim] repeated to `heads` heads for grouped-query
// attention (kv head j -> heads j*g .. j*g+g-1); t itself when heads_kv == heads.
torch::Tensor repeat_kv_heads(const torch::Tensor& t, int64_t heads);

// Whether this build can run the CUDA kernel path (LibTorch with CUDA and a GPU present).
bool cuda_kernels_available();

}  // namespace lunajit
