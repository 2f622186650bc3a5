// Shared-memory layout of the decoding kernel (linear_attention_decode.cuh), a
// constexpr function both the kernel and the host launch plan call
// (codegen/decode_source.cpp), as layout.cuh does for the other kernels.
#pragma once

#include "lunajit/layout.cuh"

namespace lunajit {

// Shared memory of decode_step_kernel (floats): x (d), phi(q) (D), phi(k) (D),
// the feature map's scratch (one row), v (dv), den (1).
struct DecodeSmem {
  int x, phi_q, phi_k, scratch, v, den, total;
  LUNAJIT_HOST_DEVICE constexpr long long bytes() const { return 4LL * total; }
};

LUNAJIT_HOST_DEVICE constexpr DecodeSmem decode_smem_layout(int d, int D, int dv, int scratch_per_row) {
  DecodeSmem l{0, 0, 0, 0, 0, 0, 0};
  int off = 0;
  l.x = off;       off = align4(off + d);
  l.phi_q = off;   off = align4(off + D);
  l.phi_k = off;   off = align4(off + D);
  l.scratch = off; off = align4(off + scratch_per_row);
  l.v = off;       off = align4(off + dv);
  l.den = off;     off = align4(off + 1);
  l.total = off;
  return l;
}

}  // namespace lunajit
