// The ATen implementation of docs/MATH.md: every feature family, linear
// attention (non-causal and chunked causal, normalized or not) and the quadratic
// softmax / yat / spherical-yat attentions, composed of differentiable ATen ops
// so LibTorch's autograd supplies every gradient (inputs and feature-map
// parameters). Works on any device ATen supports; the CPU path of
// lunajit::linear_attention and the gradient fallback of the kernel paths.
//
// Tensors are in the kernel boundary layout [batch, seq, heads, dim]
// (docs/ARCHITECTURE.md). Parameters are the flat fp32 buffer of
// codegen/feature_params.h; fixed tensors in it (random features, quadrature
// nodes, luna-rff's frozen W) are read detached, so their gradient is zero, as
// in the reference. Arithmetic runs in fp64 when x is fp64 (gradcheck), else in
// fp32 (MATH.md: phi, S, z and every sum in fp32); outputs are in that compute
// dtype and the caller casts back.
//
// Performer stabilizers are stop-gradient (reference/feature_map.h): query stab =
// per-row max of the exponents, key stab = max over all keys and features of a
// (batch, head).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <torch/torch.h>

#include "codegen/attention_spec.h"

namespace lunajit::aten {

// Which side of attention rows belong to; performer stabilizes them differently.
enum class FeatureRole { query, key };

// fp64 for fp64 inputs, else fp32.
torch::ScalarType compute_dtype(torch::ScalarType input);

// Tensor `name` of the flat parameter buffer as a [heads, shape...] tensor: a view
// of the head blocks (expanded over heads when params are shared), cast to
// `dtype`; fixed tensors are detached. Throws (TORCH_CHECK) for an unknown name.
torch::Tensor param_tensor(const torch::Tensor& params, const AttentionSpec& spec, const std::string& name,
                           int64_t heads, torch::ScalarType dtype);

// phi(x) for x [batch, seq, heads, head_dim] -> [batch, seq, heads, D] in the
// feature index order of reference/feature_map.h.
//
// key_mask (keys only; undefined: every key is real): bool [batch, seq], true
// for a real key. The rows of masked keys are zero, so they drop out of
// S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j) exactly (the feature map of a
// pad token is not zero), and performer's key stabiliser is the max over real
// keys only, so the real keys' features equal those of the unpadded sequence.
// Families whose features depend on positions (cosformer) and causal performer
// are not supported with a mask (lunajit::linear_attention rejects them).
torch::Tensor feature_map(const torch::Tensor& x, const torch::Tensor& params, const AttentionSpec& spec,
                          FeatureRole role, const torch::Tensor& key_mask = {});

// Linear attention on features: phi_q [batch, seq_q, heads, D], phi_k [batch,
// seq_k, heads, D], v [batch, seq_k, heads, dv] -> o [batch, seq_q, heads, dv]
// (seq_q != seq_k only when not causal). Causal attention uses MATH.md's
// chunked form with chunk size `chunk` (intra-chunk masked products plus an
// exclusive prefix sum of per-chunk states), O(n C D + n D dv) work.
torch::Tensor linear_attention_from_features(const torch::Tensor& phi_q, const torch::Tensor& phi_k,
                                             const torch::Tensor& v, bool causal, bool normalize, double eps,
                                             int64_t chunk = 64);

// feature_map + linear_attention_from_features of `spec`; no input checks (the
// caller, lunajit::linear_attention, makes them). Output in the compute dtype.
// Causal performer instead maps the keys query i sees with the running max of
// their stabilisers (docs/MATH.md §2), chunked with exact rescaling of the state.
// k and v have the heads of q (grouped-query attention repeats them before);
// key_mask as in feature_map.
torch::Tensor linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               const torch::Tensor& params, const AttentionSpec& spec, int64_t chunk = 64,
                               const torch::Tensor& key_mask = {});

// Causal linear attention carrying state (docs/MATH.md §1a): the chunked
// causal form started from (S0 [batch, heads, D, dv], z0 [batch, heads, D];
// undefined = zero), returning {o [batch, seq, heads, dv], S_T, z_T}, all
// differentiable (S0, z0 included) by ATen's autograd. No input checks (the op
// makes them: causal, not performer or cosformer). In the compute dtype.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> linear_attention_with_state(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& params,
    const AttentionSpec& spec, const torch::Tensor& initial_S, const torch::Tensor& initial_z, int64_t chunk = 64);

// One decoding step (MATH.md §3): q, k [batch, 1, heads, d], v [batch, 1,
// heads, dv] against (S, z) (undefined = zero): S' = S + phi(k) v^T,
// z' = z + phi(k), o = phi(q)^T S' / (phi(q)^T z' + eps). Returns {o [batch,
// 1, heads, dv], S', z'}; functional and differentiable.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> linear_attention_step(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& params,
    const AttentionSpec& spec, const torch::Tensor& S, const torch::Tensor& z);

// The attention weights [batch, heads, seq, seq] linear attention applies
// (reference::linear_attention_head_weights): <phi_q_i, phi_k_j>, divided by the
// row sum + eps when normalized, zero above the diagonal when causal. O(n^2):
// for distillation targets and need_weights, not for the forward pass.
torch::Tensor linear_attention_weights(const torch::Tensor& phi_q, const torch::Tensor& phi_k, bool causal,
                                       bool normalize, double eps);

// The weights of `spec` on q, k [batch, seq, heads, head_dim]: the above on the
// features, except causal performer, whose keys are mapped per query row
// (docs/MATH.md §2) and so have no single phi_k. In the compute dtype.
// key_mask as in feature_map: masked keys' columns are zero.
torch::Tensor linear_attention_weights(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& params,
                                       const AttentionSpec& spec, const torch::Tensor& key_mask = {});

// Quadratic attentions of MATH.md §2 (reference/quadratic_attention.h).
enum class QuadraticKind { softmax, yat, spherical_yat };
std::string_view to_string(QuadraticKind k);
// "softmax", "yat", "spherical_yat" (or "spherical-yat"); nullopt otherwise.
std::optional<QuadraticKind> parse_quadratic_kind(std::string_view s);

struct QuadraticOptions {
  QuadraticKind kind = QuadraticKind::softmax;
  bool causal = false;
  double eps = 1e-6;      // yat: added to |q - k|^2
  double eps_yat = 1e-3;  // spherical yat: C = 2 + eps_yat
};

// Row-normalized weights [batch, heads, seq_q, seq_k] for q [batch, seq_q,
// heads, d], k [batch, seq_k, heads, d]; causal masks j > i; key_mask (bool
// [batch, seq_k], true = real key; undefined: all real) gives masked keys
// weight zero.
torch::Tensor quadratic_weights(const torch::Tensor& q, const torch::Tensor& k, const QuadraticOptions& opts,
                                const torch::Tensor& key_mask = {});
// weights applied to v [batch, seq_k, heads, dv] -> [batch, seq_q, heads, dv].
torch::Tensor quadratic_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const QuadraticOptions& opts, const torch::Tensor& key_mask = {});

}  // namespace lunajit::aten
