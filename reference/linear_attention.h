// Linear attention forward and backward in double (docs/MATH.md §1): per head on
// precomputed features, and on whole [batch, seq, heads, *] tensors through the
// feature map of the spec. The oracle every kernel (GPU and host emulation) is
// checked against.
//
// Causal attention here is the running-state recurrence S_i = S_{i-1} + phi(k_i) v_i^T
// (no chunks); linear_attention_head_chunked is MATH.md's chunked form, and
// linear_attention_head_weights the O(n^2) masked matrix, both kept as
// independent formulas that the tests hold against the recurrence.
#pragma once

#include <span>
#include <vector>

#include "codegen/attention_spec.h"
#include "common/result.h"
#include "reference/feature_map.h"
#include "reference/tensor_layout.h"

namespace lunajit::reference {

// How features combine into outputs: causal mask, normalization, den epsilon.
struct AttentionMode {
  bool causal = false;
  bool normalize = true;
  double eps = 1e-6;
};

// The mode a spec asks for.
AttentionMode mode_of(const AttentionSpec& spec);

// One (batch, head): o [n, dv] from phi_q, phi_k [n, D] and v [n, dv];
// o_i = phi_q_i^T S / (phi_q_i^T z + eps) when normalized, phi_q_i^T S otherwise,
// with S, z over all keys (non-causal) or keys j <= i (causal recurrence).
void linear_attention_head(const double* phi_q, const double* phi_k, const double* v, int n, int D,
                           int dv, const AttentionMode& mode, double* o);

// MATH.md's chunked causal form with chunk size `chunk` (intra-chunk masked
// product plus the state of earlier chunks); equal to the causal recurrence up to
// rounding. Non-causal modes ignore `chunk`.
void linear_attention_head_chunked(const double* phi_q, const double* phi_k, const double* v,
                                   int n, int D, int dv, const AttentionMode& mode, int chunk,
                                   double* o);

// The attention matrix A [n, n] of linear attention, so that o = A v:
// A_ij = <phi_q_i, phi_k_j> / (sum_j' <phi_q_i, phi_k_j'> + eps) when normalized
// (sums over j' <= i when causal), the raw products when not; masked entries are 0.
void linear_attention_head_weights(const double* phi_q, const double* phi_k, int n, int D,
                                   const AttentionMode& mode, double* A);

// The sizes of the parts the backward adds up (never needed for the gradient
// itself): dphi_q = S g + z r, dphi_k = dS v + dz and dv = dS^T phi_k each sum
// terms that cancel when the attention cannot depend on them (one key: o = v
// whatever phi is); these hold the same sums with every term taken absolute,
// the scale of the rounding error of any floating-point evaluation.
struct TermMagnitudes {
  std::vector<double> dphi_q, dphi_k, dv;           // [n, D], [n, D], [n, dv]
  std::vector<double> S_abs, z_abs, dS_abs, dz_abs;  // working sums
  void reset(int n, int D, int dv);
};

// Backward of linear_attention_head (MATH.md §1): from dO [n, dv], writes
// dphi_q, dphi_k [n, D] and dv [n, dv] (overwritten, not accumulated), and
// the term magnitudes into `mag` when given.
void linear_attention_head_backward(const double* phi_q, const double* phi_k, const double* v,
                                    int n, int D, int dv, const AttentionMode& mode,
                                    const double* dout, double* dphi_q, double* dphi_k,
                                    double* dv_out, TermMagnitudes* mag = nullptr);

// Performer stabilizers of a problem (docs/MATH.md §2, performer); zeros for
// other families. They are what the forward pass subtracts, and what a caller
// freezes to take finite differences of the stop-gradient function (feature_map.h).
//   query        [batch, heads, seq]: s(q_i) = max_r e_r(q_i), per query row.
//   key          [batch, heads]: max_j s(k_j) over all keys (non-causal attention,
//                and feature_map() of keys).
//   key_running  [batch, heads, seq]: M_i = max_{j<=i} s(k_j), the key stabilizer
//                query row i uses in causal attention (only keys it sees).
struct Stabilizers {
  std::vector<double> query;
  std::vector<double> key;
  std::vector<double> key_running;
};

// The stabilizers the forward pass would use for q and k.
Result<Stabilizers> performer_stabilizers(const AttentionSpec& spec, const AttentionShape& shape,
                                          std::span<const double> q, std::span<const double> k,
                                          std::span<const double> params);

// phi of a whole [batch, seq, heads, d] tensor into [batch, seq, heads, D], with
// role-specific stabilizers (computed unless `frozen` gives them).
Result<std::vector<double>> feature_map(const AttentionSpec& spec, const AttentionShape& shape,
                                        std::span<const double> x, std::span<const double> params,
                                        Role role, const Stabilizers* frozen = nullptr);

struct ForwardResult {
  std::vector<double> out;  // [batch, seq, heads, dv]
  Stabilizers stab;         // what the pass used
};

// Linear attention of spec on q, k, v with params (the flat buffer, as double).
// `frozen` replaces the performer stabilizers the pass would compute. Causal
// performer maps key j for query i with the running max key_running[i]
// (docs/MATH.md §2), as an O(n^2) masked sum per head.
Result<ForwardResult> linear_attention_forward(const AttentionSpec& spec,
                                               const AttentionShape& shape,
                                               std::span<const double> q,
                                               std::span<const double> k,
                                               std::span<const double> v,
                                               std::span<const double> params,
                                               const Stabilizers* frozen = nullptr);

struct Gradients {
  std::vector<double> dq, dk, dv;  // shaped like q, k, v
  std::vector<double> dparams;     // shaped like params; fixed tensors stay 0
  // Shaped like dparams: sum over query and key rows of |J_t^T m_t|, m_t the
  // magnitudes of dphi's parts (TermMagnitudes): the scale of the rounding
  // error of a gradient whose terms cancel.
  std::vector<double> dparams_terms;
  // Shaped like dq, dk, dv: the same magnitudes for the input gradients.
  std::vector<double> dq_terms, dk_terms, dv_terms;
};

// Exact gradient of sum(dout * out) of linear_attention_forward with respect to
// q, k, v and every learned parameter (summed over query and key tokens of all
// batches; per head block when params are per head, else over heads into the
// one block). Performer stabilizers are stop-gradient (feature_map.h).
Result<Gradients> linear_attention_backward(const AttentionSpec& spec, const AttentionShape& shape,
                                            std::span<const double> q, std::span<const double> k,
                                            std::span<const double> v,
                                            std::span<const double> params,
                                            std::span<const double> dout,
                                            const Stabilizers* frozen = nullptr);

// The linear-attention weight matrices [batch, heads, seq, seq] of spec
// (linear_attention_head_weights per head): the student side of conversion
// distillation (MATH.md §4), comparable with quadratic_weights().
Result<std::vector<double>> linear_attention_weights(const AttentionSpec& spec,
                                                     const AttentionShape& shape,
                                                     std::span<const double> q,
                                                     std::span<const double> k,
                                                     std::span<const double> params);

}  // namespace lunajit::reference

namespace lunajit::reference {

// Packed variable-length batches (docs/MATH.md §3 "Packed sequences", fla's
// cu_seqlens): q, k, v and dout are [1, total, heads, *] with the sequences one
// after another; cu_seqlens [num_seqs + 1] holds their offsets (0 = cu[0] <=
// cu[1] <= ... <= cu[num_seqs] = total). Each sequence is its own problem: its
// positions (cosformer's N is its own length), its performer stabilisers and its
// causal mask; tokens of one sequence never see another's. Sequences of length 0
// contribute nothing. The results are the per-sequence results placed at their
// tokens; parameter gradients are summed over sequences. `stab` of the forward
// result is left empty (it is per sequence).
Status check_cu_seqlens(std::span<const int> cu_seqlens, int64_t total_tokens);

Result<ForwardResult> linear_attention_forward_varlen(const AttentionSpec& spec, int heads,
                                                      std::span<const int> cu_seqlens,
                                                      std::span<const double> q,
                                                      std::span<const double> k,
                                                      std::span<const double> v,
                                                      std::span<const double> params);

Result<Gradients> linear_attention_backward_varlen(const AttentionSpec& spec, int heads,
                                                   std::span<const int> cu_seqlens,
                                                   std::span<const double> q,
                                                   std::span<const double> k,
                                                   std::span<const double> v,
                                                   std::span<const double> params,
                                                   std::span<const double> dout);

}  // namespace lunajit::reference
