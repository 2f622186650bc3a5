// Small hand-written kernel sources for the NVRTC and CUDA backend tests: they
// include the embedded "lunajit/device.cuh" (and through it cuda_fp16/bf16) the
// way generated sources do, with sizes the tests check ptxas's report against.
#pragma once

#include <string>

#include "codegen/kernel_source.h"

namespace lunajit::test {

// reverse_scale<256>: x[i] = a * x[reversed i within the block]; a static
//   __shared__ float[256] (1024 B) and one barrier.
// to_bf16: out[i] = bf16(in[i] * 2).
// block_sum: per block sum of blockDim.x floats through dynamic shared memory.
inline constexpr int kReverseTile = 256;
inline constexpr int kReverseStaticSmem = kReverseTile * 4;  // 256 x 4 B = 1 KiB
KernelSource small_kernels(std::string name = "nvrtc_test_small", std::string extra_code = {});

// A source NVRTC rejects ("undefined_identifier_xyz" is not declared).
KernelSource broken_kernel();

}  // namespace lunajit::test
