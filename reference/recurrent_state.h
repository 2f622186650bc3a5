// Carried recurrent state of causal linear attention (docs/MATH.md §1a): the
// forward from an initial (S0, z0) returning the final (S, z), its backward with
// the gradient w.r.t. the initial state, and one decoding step. Double
// precision; the oracle of the kernels' and the binding's stateful paths.
//
// State layout (the same everywhere: kernels, ATen, the op, Python):
//   S  [batch, heads, D, dv]   sum over the tokens so far of phi(k_j) v_j^T
//   z  [batch, heads, D]       sum over the tokens so far of phi(k_j)
// contiguous, fp32 outside the reference. An empty S and z mean the zero state.
//
// Supported: causal specs of every family except performer (its running key
// stabiliser M_i would have to travel with the state; rejected, naming the
// field) and cosformer (its features depend on the position and the sequence
// length N, so a piece of a sequence is not the same function; rejected).
#pragma once

#include <span>
#include <vector>

#include "codegen/attention_spec.h"
#include "common/result.h"
#include "reference/linear_attention.h"

namespace lunajit::reference {

struct RecurrentState {
  std::vector<double> S;  // [batch, heads, D, dv]
  std::vector<double> z;  // [batch, heads, D]
  bool empty() const { return S.empty() && z.empty(); }
};

// ok when `spec` can carry state; otherwise an error naming `field` (e.g.
// "initial_state") and why the spec cannot.
Status check_state_support(const AttentionSpec& spec, std::string_view field = "initial_state");

// The zero state of a problem.
RecurrentState zero_state(const AttentionSpec& spec, int batch, int heads);

struct StatefulForward {
  std::vector<double> out;     // [batch, seq, heads, dv]
  RecurrentState final_state;  // after the last token
};

// o_i = phi(q_i)^T (S0 + sum_{j<=i} phi(k_j) v_j^T) / (phi(q_i)^T (z0 + sum_{j<=i} phi(k_j)) + eps)
// (normalized; unnormalized drops the denominator). `initial` may be null or
// empty (zero state).
Result<StatefulForward> linear_attention_forward_state(const AttentionSpec& spec, const AttentionShape& shape,
                                                       std::span<const double> q, std::span<const double> k,
                                                       std::span<const double> v, std::span<const double> params,
                                                       const RecurrentState* initial);

struct StatefulGradients {
  Gradients grad;          // dq, dk, dv, dparams (the *_terms fields are left empty)
  RecurrentState dinitial; // dS0, dz0
};

// Exact gradient of sum(dout * out) + <dfinal.S, S_T> + <dfinal.z, z_T> of
// linear_attention_forward_state: dS0 = dS_T + sum_i phi(q_i) g_i^T,
// dz0 = dz_T + sum_i phi(q_i) r_i (docs/MATH.md §1a). `dfinal` may be null or empty.
Result<StatefulGradients> linear_attention_backward_state(const AttentionSpec& spec, const AttentionShape& shape,
                                                          std::span<const double> q, std::span<const double> k,
                                                          std::span<const double> v, std::span<const double> params,
                                                          std::span<const double> dout,
                                                          const RecurrentState* initial,
                                                          const RecurrentState* dfinal);

// One decoding step for a batch: q, k [batch, heads, d], v [batch, heads, dv]
// (one new token per sequence; no position is needed, cosformer being
// rejected), state updated in place (an empty state: zero): S += phi(k) v^T,
// z += phi(k), then o = phi(q)^T S / (phi(q)^T z + eps) -> [batch, heads, dv].
Result<std::vector<double>> linear_attention_decode_step(const AttentionSpec& spec, int batch, int heads,
                                                         std::span<const double> q, std::span<const double> k,
                                                         std::span<const double> v, std::span<const double> params,
                                                         RecurrentState& state);

}  // namespace lunajit::reference
