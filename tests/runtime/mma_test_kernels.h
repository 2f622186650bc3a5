// Hand-written kernels over templates/lunajit/mma.cuh (mma.sync, ldmatrix,
// cp.async, bf16x2), shared by the host emulation tests (mma_emulation_test.cpp)
// and the NVRTC compile test (tests/runtime_nvrtc), so both backends build the
// very same source. Every kernel takes one MmaArgs by value.
#pragma once

#include "codegen/kernel_source.h"

#define LUNAJIT_MMA_TEST_ARGS_STRUCT \
  struct MmaArgs {                   \
    const unsigned short* a;         \
    const unsigned short* b;         \
    const float* c;                  \
    float* d;                        \
    unsigned* r;                     \
    const float* src;                \
    float* dst;                      \
    int param;                       \
  };

namespace lunajit::test {

LUNAJIT_MMA_TEST_ARGS_STRUCT

// Entries (name expressions; see mma_test_kernels.cpp for what each computes):
//   mma_k16<T, SWAP>, mma_k8<T>, ldmatrix_gemm<T>, ldmatrix_layout<N, TRANS>,
//   cp_async_copy, cp_async_store_pending, cp_async_read_pending, bf16x2_fma,
//   mma_divergent_sites, mma_partial_warp; T in {__nv_bfloat16, __half}.
KernelSource mma_test_kernels();

}  // namespace lunajit::test
