// Feature maps phi of every family of docs/MATH.md §2, in double, with their
// Jacobian-transpose products (input and parameter gradients).
//
// Feature layouts: the index order of phi(x) in R^D. This is the contract the GPU
// templates follow too (FeatureMapArgs writes phi in exactly this order).
//   luna       D = M*L, index i*L + l (projection i major, channel l minor):
//              phi = h(x)/sqrt(M) * psi_l(u_i), u_i = W_i . x,
//              h(x) = sigmoid(a . x + c) with envelope, else 1.
//              neural:    psi(u) = out_act(W2 sigma(W1 u + b1) + b2), shared MLP
//                         (W1 [Hm], b1 [Hm]) or one MLP per channel (W1 [L,Hm], b1 [L,Hm]).
//              bank_coef: psi_l(u) = coef_l * basis_{l mod 8}(u), basis = [sin, cos,
//                         tanh, sigmoid, relu, gelu, softplus, exp(-u^2/2)].
//              rff:       psi(u) = [cos u, sin u] (L = 2 whatever channels says), W frozen.
//              output_activation applies to the neural variant only.
//   performer  D = m, index r: m^{-1/2} exp(omega_r . x' - |x'|^2/2 - stab) + kernel_eps,
//              x' = d^{-1/4} x.
//   rff        D = 2m: indices [0, m) = sqrt(1/m) cos(omega_r . x), [m, 2m) = sqrt(1/m) sin(omega_r . x).
//   elu        D = d: elu(x) + 1.       relu  D = d: max(x, 0).
//   t2r        D = features: relu(W x + b).
//   hedgehog   D = 2f: [0, f) = softmax(y), [f, 2f) = softmax(-y), y = W x + b.
//   cosformer  D = 2d: [0, d) = relu(x) sin(pi t/(2N)), [d, 2d) = relu(x) cos(pi t/(2N)),
//              t the 1-based token position, N the sequence length.
//   slay       D = R*P*M, index r*P*M + p*M + j: sqrt(w_r) phi_anc_p(u) phi_prf_j(u; s_r),
//              u = x/|x|, phi_anc_p = P^{-1/2} (a_p . u)^2,
//              phi_prf_j = M^{-1/2} exp(sqrt(2 s_r) omega_{r,j} . u - s_r),
//              s_r = params "nodes", w_r = params "weights". Undefined at x = 0.
//
// Performer stabilizers are treated as stop-gradient constants: the gradients are
// the exact gradients of phi with stab held at the value the forward pass used
// (the FAVOR+ convention; max() has only a subgradient). With kernel_eps = 0 and
// eps = 0 the stabilizers cancel exactly in a normalized output, so there the
// stop-gradient gradient is also the gradient of the full function.
#pragma once

#include <span>
#include <vector>

#include "codegen/attention_spec.h"
#include "codegen/feature_params.h"

namespace lunajit::reference {

// Which side of attention a row belongs to; performer stabilizes the two differently.
enum class Role { query, key };

// Where the rows of one (batch, head) sequence sit, and what they are shifted by.
struct RowContext {
  int seq_len = 0;               // N (cosformer); row t of the block is position t + 1
  int first_position = 1;        // 1-based position of row 0 (cosformer)
  const double* stab = nullptr;  // performer: per-row shift of the exponent; nullptr = 0
};

// The feature map of `spec` with one head's parameter block. Holds a reference to
// the parameters (they must outlive it); stateless otherwise, so one map serves
// queries and keys alike.
class FeatureMap {
 public:
  // `head_params` is the head's block of the double parameter buffer, at least
  // param_layout(spec).per_head_floats long (may be empty for parameter-free families).
  FeatureMap(const AttentionSpec& spec, std::span<const double> head_params);

  // Feature dimension D (spec.feature_dim()).
  int dim() const { return dim_; }

  // phi of n rows x [n, d] into phi [n, D], the layout above. `ctx` gives the
  // positions (cosformer) and the stabilizer of each row (performer).
  void forward(const double* x, int n, const RowContext& ctx, double* phi) const;

  // Jacobian-transpose product: for upstream dphi [n, D], adds J^T dphi to dx [n, d]
  // and the gradient of sum(dphi * phi) with respect to every learned parameter to
  // dparams (this head's block, same layout as the parameters). Fixed tensors are
  // never written. Stabilizers in ctx are held constant (stop-gradient).
  void backward(const double* x, int n, const RowContext& ctx, const double* dphi, double* dx,
                double* dparams) const;

  // Performer stabilizers of n rows: for queries stab_t = max_r (omega_r . x'_t -
  // |x'_t|^2/2) per row; for keys the max of that over all n rows and features,
  // repeated n times. All zeros for the other families.
  std::vector<double> stabilizers(const double* x, int n, Role role) const;

 private:
  void luna_forward(const double* x, int n, double* phi) const;
  void luna_backward(const double* x, int n, const double* dphi, double* dx,
                     double* dparams) const;
  // Performer exponents omega_r . x' - |x'|^2/2 of one row, into e [m].
  void performer_exponents(const double* x, double* e) const;
  // Offset of tensor `name` inside the block; -1 if absent.
  int64_t offset(const char* name) const;
  // Whether tensor `name` gets a gradient.
  bool learned(const char* name) const;

  AttentionSpec spec_;
  ParamLayout layout_;
  std::span<const double> p_;
  int dim_ = 0;
};

// Elementwise activations of luna with their derivatives (shared with tests and
// the host emulation checks). gelu is the erf form x * Phi(x).
double activation(Activation a, double t);
double activation_grad(Activation a, double t);
double output_activation(OutputActivation a, double y);
double output_activation_grad(OutputActivation a, double y);
// Bank basis function l mod 8 of the bank_coef variant, and its derivative.
double bank_basis(int l, double u);
double bank_basis_grad(int l, double u);

}  // namespace lunajit::reference
