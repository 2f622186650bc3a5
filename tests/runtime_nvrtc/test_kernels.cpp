#include "tests/runtime_nvrtc/test_kernels.h"

namespace lunajit::test {

KernelSource small_kernels(std::string name, std::string extra_code) {
  KernelSource src;
  src.name = std::move(name);
  src.code = R"(// nvrtc_tests: hand-written kernels (not generated).
#include "lunajit/device.cuh"

namespace lunajit_test {

template <int N>
__global__ void reverse_scale(float* x, float a) {
  __shared__ float tile[N];  // (N) floats in smem
  const int i = blockIdx.x * N + threadIdx.x;
  tile[threadIdx.x] = x[i];
  __syncthreads();
  x[i] = a * tile[N - 1 - threadIdx.x];
}

__global__ void to_bf16(const float* in, __nv_bfloat16* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = lunajit::from_float<__nv_bfloat16>(in[i] * 2.0f);
}

// Tree sum of blockDim.x (a power of two) floats in dynamic shared memory.
__global__ void block_sum(const float* in, float* out) {
  float* s = reinterpret_cast<float*>(lunajit::dynamic_smem());
  s[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

}  // namespace lunajit_test
)" + extra_code;
  src.entries = {{"reverse", "lunajit_test::reverse_scale<256>"},
                 {"convert", "lunajit_test::to_bf16"},
                 {"sum", "lunajit_test::block_sum"}};
  return src;
}

KernelSource broken_kernel() {
  KernelSource src;
  src.name = "nvrtc_test_broken";
  src.code = R"(#include "lunajit/device.cuh"
__global__ void broken(float* x) { x[0] = undefined_identifier_xyz; }
)";
  src.entries = {{"broken", "broken"}};
  return src;
}

}  // namespace lunajit::test
