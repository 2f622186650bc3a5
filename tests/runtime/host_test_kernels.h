// Hand-written CUDA kernels for the host emulation tests, as KernelSources that
// include "lunajit/device.cuh" like generated code. Every kernel takes one
// TestArgs by value; the struct is defined once here and pasted into the
// kernel source as text, so both sides share its layout.
#pragma once

#include <string>

#include "codegen/kernel_source.h"

#define LUNAJIT_TEST_ARGS_STRUCT \
  struct TestArgs {              \
    const float* in;             \
    float* out;                  \
    int* iout;                   \
    unsigned* uout;              \
    unsigned long long* ull;     \
    int n;                       \
    int param;                   \
  };

namespace lunajit::test {

LUNAJIT_TEST_ARGS_STRUCT

// Values each thread of `shuffle_kernel` writes, in this order, per thread.
inline constexpr int kShuffleOutputs = 16;
// Values each thread of `index_kernel` writes: threadIdx, blockIdx, blockDim, gridDim.
inline constexpr int kIndexOutputs = 12;
// Outputs of `half_kernel` (bit patterns), see host_emulation_test.cpp.
inline constexpr int kHalfOutputs = 16;

// Kernels (name expressions): index_kernel, lunajit_test::block_reduce<256>,
// dynamic_smem_kernel, smem_per_block_kernel, shuffle_kernel, atomic_kernel,
// divergent_barrier_kernel, divergent_warp_kernel, trap_kernel, half_kernel,
// barrier_loop_kernel.
KernelSource host_test_kernels();

// A kernel with a unique marker, so that it is compiled cold in a fresh cache.
KernelSource host_cache_test_kernel(const std::string& marker);

// A source Clang rejects: `undefined_identifier_xyz` is not declared.
KernelSource host_broken_kernel();

}  // namespace lunajit::test
