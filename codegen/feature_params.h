// Feature-map parameters: their layout in the flat fp32 buffer the kernels read,
// and their initialisation (docs/MATH.md §2).
//
// The buffer holds one block of `per_head_floats` floats per head when the spec
// has params_per_head (head h at offset h * per_head_floats), else one block
// shared by all heads. Inside a block the tensors follow each other in the order
// param_layout() lists them, row-major, without padding. Fixed tensors (random
// features, quadrature nodes) live in the same buffer so that kernels, reference
// and binding agree on one layout; they are marked learned = false.
//
// Per family (shapes as [rows, cols]; d = head_dim):
//   luna   W [M, d]; neural+shared: W1 [Hm], b1 [Hm], W2 [L, Hm], b2 [L];
//          neural+per-channel: W1 [L, Hm], b1 [L, Hm], W2 [L, Hm], b2 [L];
//          bank_coef: coef [L]; rff: (W only, frozen); envelope: a [d], c [1]
//   performer omega [m, d] (fixed)      rff omega [m, d] (fixed)
//   t2r    W [D, d], b [D]              hedgehog W [f, d], b [f]
//   slay   anchors [P, d], omega [R, M, d], nodes [R], weights [R] (all fixed;
//          nodes s_r = t_r / C and weights w_r = a_r / C of Gauss-Laguerre)
//   elu, relu, cosformer: none
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/attention_spec.h"

namespace lunajit {

struct ParamTensor {
  std::string name;
  std::vector<int> shape;
  int64_t offset = 0;  // in floats, inside one head's block
  bool learned = true;

  int64_t numel() const;
};

struct ParamLayout {
  std::vector<ParamTensor> tensors;
  int64_t per_head_floats = 0;

  // The tensor called `name`, or nullptr.
  const ParamTensor* find(const std::string& name) const;
  // Floats in a buffer for `heads` heads (one block when params are shared).
  int64_t total_floats(const AttentionSpec& spec, int heads) const;
};

ParamLayout param_layout(const AttentionSpec& spec);

// Parameters for `heads` heads, initialised as MATH.md says (luna W ~ N(0, 1/d);
// MLP layers like torch.nn.Linear, U(-1/sqrt(fan_in), 1/sqrt(fan_in)); hedgehog W
// = identity when f = d; bank coefficients 1; fixed random features from the
// family's seed). Deterministic for a given (spec, heads, seed): learned
// parameters are drawn from `seed`, fixed ones from the family's own seed (and
// the head index when params are per head).
std::vector<float> init_params(const AttentionSpec& spec, int heads, uint64_t seed = 0);

// Gauss-Laguerre nodes t_r and weights a_r for int_0^inf e^{-t} f(t) dt, R nodes
// (Newton on the Laguerre polynomial; exact for polynomials of degree < 2R).
void gauss_laguerre(int R, std::vector<double>& nodes, std::vector<double>& weights);

}  // namespace lunajit
