// Moving tiles between global memory ([batch, seq, heads, dim], unit stride in
// dim) and fp32 shared memory. Rows past the sequence end are zero-filled so a
// partial tile never reads out of bounds.
#pragma once

#include "lunajit/device.cuh"

namespace lunajit {

// Rows [t0, t0 + rows) of (b, h), columns [c0, c0 + cols) of a tensor whose
// last dim is `dim`, into dst (rows_alloc, cols) fp32; rows >= valid and
// columns >= dim - c0 become 0. kDstStride: dst's row stride in floats (0: cols,
// rows packed; a padded tile's otherwise).
template <class T, int kThreads, int kDstStride = 0>
LUNAJIT_DEVICE void load_rows(const TensorRef& src, int b, int h, int t0, int valid, int rows_alloc, int dim,
                              int c0, int cols, float* dst) {
  const T* base = static_cast<const T*>(src.data) + b * src.stride_batch + h * src.stride_head;
  for (int e = threadIdx.x; e < rows_alloc * cols; e += kThreads) {
    const int r = e / cols;
    const int c = e - r * cols;
    float x = 0.0f;
    if (r < valid && c0 + c < dim) x = to_float(base[(long long)(t0 + r) * src.stride_seq + c0 + c]);
    if constexpr (kDstStride == 0)
      dst[e] = x;
    else
      dst[r * kDstStride + c] = x;
  }
}

}  // namespace lunajit
