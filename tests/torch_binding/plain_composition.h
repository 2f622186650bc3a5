// A plain LibTorch composition of docs/MATH.md, written independently of
// torch_binding/aten_attention.cpp for the tests to hold the binding against:
// one (batch, head) at a time, features of 2-D [n, d] matrices built projection
// by projection and channel by channel, and attention as the explicit O(n^2)
// matrix A = phi_q phi_k^T (masked, row-normalized). Slow and obvious; LibTorch
// autograd through it gives the gradients the op must match.
#pragma once

#include <torch/torch.h>

#include "codegen/attention_spec.h"

namespace lunajit::testing {

// o [batch, seq, heads, dv] for q, k [batch, seq, heads, d], v, and the flat
// parameter buffer (fixed tensors read detached); any floating dtype.
torch::Tensor plain_linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& params, const AttentionSpec& spec);

}  // namespace lunajit::testing
