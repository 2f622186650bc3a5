// First include of every generated translation unit: the CUDA built-ins on the
// device (NVRTC), or their emulation on the host (LUNAJIT_HOST_EMULATION), and
// the few device helpers every template uses. Templates use only what this file
// and the host prelude both provide.
#pragma once

#if defined(LUNAJIT_HOST_EMULATION)
#include "lunajit/emulation/host_prelude.h"
#else
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace lunajit {
// Dynamic shared memory of the block (sized by the launch).
__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char lunajit_smem[];
  return lunajit_smem;
}
}  // namespace lunajit
#endif

#include "lunajit/kernel_args.cuh"

#define LUNAJIT_DEVICE __device__ __forceinline__

namespace lunajit {

// Element conversions between the I/O dtype and fp32 accumulation.
LUNAJIT_DEVICE float to_float(float x) { return x; }
LUNAJIT_DEVICE float to_float(__half x) { return __half2float(x); }
LUNAJIT_DEVICE float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T> struct FromFloat;
template <> struct FromFloat<float> {
  static LUNAJIT_DEVICE float convert(float x) { return x; }
};
template <> struct FromFloat<__half> {
  static LUNAJIT_DEVICE __half convert(float x) { return __float2half_rn(x); }
};
template <> struct FromFloat<__nv_bfloat16> {
  static LUNAJIT_DEVICE __nv_bfloat16 convert(float x) { return __float2bfloat16_rn(x); }
};
template <class T> LUNAJIT_DEVICE T from_float(float x) { return FromFloat<T>::convert(x); }

LUNAJIT_DEVICE int ceil_div(int a, int b) { return (a + b - 1) / b; }

}  // namespace lunajit
