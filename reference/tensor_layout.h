// Tensor layout of the double-precision reference (docs/MATH.md, ARCHITECTURE.md).
//
// The reference works on contiguous std::vector<double> tensors in the kernel
// boundary layout: q, k [batch, seq, heads, d], v and out [batch, seq, heads, dv],
// feature maps phi [batch, seq, heads, D], attention weights [batch, heads, seq, seq]
// (row = query i, column = key j). Parameters are the flat buffer of
// codegen/feature_params.h converted to double, one block per head when
// spec.params_per_head, else a single block shared by all heads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "codegen/attention_spec.h"
#include "common/result.h"

namespace lunajit::reference {

// Batch, sequence and head counts of one problem; d, dv and D come from the spec.
struct AttentionShape {
  int batch = 1;
  int seq = 1;
  int heads = 1;

  // Rows of a [batch, seq, heads, *] tensor.
  int64_t rows() const { return int64_t(batch) * seq * heads; }
  // Row index of token t of (batch b, head h) in a [batch, seq, heads, *] tensor.
  int64_t row(int b, int t, int h) const { return (int64_t(b) * seq + t) * heads + h; }
};

// Copies the rows of (batch b, head h) of a [batch, seq, heads, width] tensor into
// a contiguous [seq, width] matrix, the form the per-head functions take.
std::vector<double> gather_head(std::span<const double> x, const AttentionShape& shape, int width,
                                int b, int h);

// Adds (accumulate = true) or writes a contiguous [seq, width] matrix back into the
// rows of (batch b, head h) of a [batch, seq, heads, width] tensor.
void scatter_head(std::span<const double> head, const AttentionShape& shape, int width, int b,
                  int h, std::span<double> x, bool accumulate = false);

// The parameter buffer (fp32, as init_params returns it) widened to double.
std::vector<double> to_double(std::span<const float> x);

// Offset, in doubles, of the parameter block head h reads: h * per_head_floats
// when spec.params_per_head, else 0 (one block shared by all heads).
int64_t param_block_offset(const AttentionSpec& spec, int h);

// Checks that q, k, v (and params, when the family has any) have the sizes
// `shape` and `spec` imply; the error names the tensor, its size and the expected one.
Status check_sizes(const AttentionSpec& spec, const AttentionShape& shape, size_t q_size,
                   size_t k_size, size_t v_size, size_t params_size);

}  // namespace lunajit::reference
