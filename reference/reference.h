// The double-precision CPU reference of docs/MATH.md: the oracle every kernel,
// the host emulation and the binding are checked against. One include for all:
//   tensor_layout.h       shapes, [batch, seq, heads, dim] gather/scatter, params as double
//   feature_map.h         phi of every family and its Jacobian-transpose; the feature index orders
//   linear_attention.h    forward (recurrent, chunked, weight matrix) and exact backward
//   quadratic_attention.h softmax, yat and spherical-yat attention
// Everything is in double and single-threaded: slow on purpose, and plain enough
// to check against MATH.md line by line.
#pragma once

#include "reference/feature_map.h"
#include "reference/linear_attention.h"
#include "reference/quadratic_attention.h"
#include "reference/recurrent_state.h"
#include "reference/tensor_layout.h"
