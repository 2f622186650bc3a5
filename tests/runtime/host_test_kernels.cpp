#include "tests/runtime/host_test_kernels.h"

#define LUNAJIT_TEST_STRINGIFY_(...) #__VA_ARGS__
#define LUNAJIT_TEST_STRINGIFY(...) LUNAJIT_TEST_STRINGIFY_(__VA_ARGS__)

namespace lunajit::test {
namespace {

const std::string kPreamble = std::string("#include \"lunajit/device.cuh\"\n") +
                              LUNAJIT_TEST_STRINGIFY(LUNAJIT_TEST_ARGS_STRUCT) + "\n";

const char* kKernels = R"CUDA(
// Every thread writes its indices and the launch shape: 12 values per thread,
// at the thread's linear position in the grid (x fastest, blocks then threads).
__global__ void index_kernel(const TestArgs a) {
  unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  unsigned tid = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  unsigned* o = a.uout + (block * blockDim.x * blockDim.y * blockDim.z + tid) * 12;
  o[0] = threadIdx.x; o[1] = threadIdx.y; o[2] = threadIdx.z;
  o[3] = blockIdx.x;  o[4] = blockIdx.y;  o[5] = blockIdx.z;
  o[6] = blockDim.x;  o[7] = blockDim.y;  o[8] = blockDim.z;
  o[9] = gridDim.x;   o[10] = gridDim.y;  o[11] = gridDim.z;
}

namespace lunajit_test {
// Tree reduction of BLOCK floats per block in static shared memory.
template <int BLOCK>
__global__ void __launch_bounds__(BLOCK) block_reduce(const TestArgs a) {
  __shared__ float partial[BLOCK];  // BLOCK x 4 B
  int i = blockIdx.x * BLOCK + threadIdx.x;
  partial[threadIdx.x] = i < a.n ? a.in[i] : 0.0f;
  __syncthreads();
  for (int stride = BLOCK / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) a.out[blockIdx.x] = partial[0];
}
}  // namespace lunajit_test

// Reverses each block's slice through dynamic shared memory; iout[block] = 1
// when the buffer is 16-byte aligned and at least blockDim.x floats long.
__global__ void dynamic_smem_kernel(const TestArgs a) {
  float* s = reinterpret_cast<float*>(lunajit::dynamic_smem());
  int base = blockIdx.x * blockDim.x;
  s[threadIdx.x] = a.in[base + threadIdx.x];
  __syncthreads();
  a.out[base + threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
  if (threadIdx.x == 0) a.iout[blockIdx.x] = (reinterpret_cast<unsigned long long>(s) % 16 == 0) ? 1 : 0;
}

// Each block keeps its own index in static and dynamic shared memory across many
// barriers; a block that saw another's value reports it.
__global__ void smem_per_block_kernel(const TestArgs a) {
  __shared__ int tag;
  __shared__ int counter[4];
  int* dyn = reinterpret_cast<int*>(lunajit::dynamic_smem());
  int wrong = 0;
  for (int round = 0; round < a.param; ++round) {
    if (threadIdx.x == 0) { tag = blockIdx.x; dyn[0] = blockIdx.x * 7 + round; counter[round % 4] = 0; }
    __syncthreads();
    atomicAdd(&counter[round % 4], 1);
    if (tag != (int)blockIdx.x || dyn[0] != (int)blockIdx.x * 7 + round) wrong = 1;
    __syncthreads();
    if (counter[round % 4] != (int)blockDim.x) wrong = 1;
    __syncthreads();
  }
  a.iout[blockIdx.x * blockDim.x + threadIdx.x] = wrong;
}

// Warp operations over the block (16 results a thread, see the test).
__global__ void shuffle_kernel(const TestArgs a) {
  const unsigned full = 0xffffffffu;
  int t = threadIdx.x;
  int lane = t % 32;
  int v = t * 10;
  int* o = a.iout + t * 16;
  o[0] = __shfl_xor_sync(full, v, 5);
  o[1] = __shfl_down_sync(full, v, 3);
  o[2] = __shfl_up_sync(full, v, 2);
  o[3] = __shfl_sync(full, v, 7);
  o[4] = __shfl_sync(full, v, 3, 8);
  float f = __shfl_xor_sync(full, t + 0.5f, 16);
  o[5] = (int)(f * 2.0f);
  __half h = __shfl_down_sync(full, __float2half_rn((float)lane), 1);
  o[6] = (int)__half2float(h);
  __nv_bfloat16 b = __shfl_xor_sync(full, __float2bfloat16_rn((float)lane), 1);
  o[7] = (int)__bfloat162float(b);
  double d = __shfl_sync(full, t * 1.5, 0);
  o[8] = (int)(d * 2.0);
  o[9] = (int)__ballot_sync(full, lane % 3 == 0);
  o[10] = __any_sync(full, t == 40);
  o[11] = __all_sync(full, t < 60);
  int sum = lane;
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(full, sum, offset);
  o[12] = sum;
  o[13] = (int)__activemask();
  o[14] = __reduce_add_sync(full, lane);
  __syncwarp();
  o[15] = __shfl_down_sync(full, v, 4, 16);
}

// Exact integer sums over the whole grid.
__global__ void atomic_kernel(const TestArgs a) {
  int gid = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&a.iout[0], 1);
  atomicMax(&a.iout[1], gid);
  atomicMin(&a.iout[2], -gid);
  atomicAdd(&a.uout[0], (unsigned)gid);
  atomicAdd(&a.ull[0], 1ull << 33);
  atomicAdd(&a.out[0], 1.0f);
  int old = a.iout[3];
  for (;;) {
    int seen = atomicCAS(&a.iout[3], old, old + 2);
    if (seen == old) break;
    old = seen;
  }
  atomicOr(&a.uout[1], 1u << (gid % 32));
  atomicExch(&a.iout[4], 77);
}

// Thread 0 leaves before the barrier the others wait at.
__global__ void divergent_barrier_kernel(const TestArgs a) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  a.iout[threadIdx.x] = 1;
}

// Lanes 0..15 wait at __syncthreads, lanes 16..31 at a full-warp __syncwarp.
__global__ void divergent_warp_kernel(const TestArgs a) {
  if (threadIdx.x < 16) __syncthreads();
  else __syncwarp();
}

__global__ void trap_kernel(const TestArgs a) {
  if (blockIdx.x == 1 && threadIdx.x == 5) __trap();
  __syncthreads();
}

// Conversions and 16-bit math; bit patterns out (see the test).
__global__ void half_kernel(const TestArgs a) {
  if (threadIdx.x != 0) return;
  auto hb = [](__half h) { return (unsigned)__half_as_ushort(h); };
  auto bb = [](__nv_bfloat16 b) { return (unsigned)__bfloat16_as_ushort(b); };
  unsigned* o = a.uout;
  o[0] = hb(__float2half_rn(1.0f / 3.0f));
  o[1] = bb(__float2bfloat16_rn(1.0f / 3.0f));
  o[2] = hb(__float2half_rn(1.0f + 1.0f / 2048));        // tie: to even (1.0)
  o[3] = hb(__float2half_rn(1.0f + 3.0f / 2048));        // tie: to even (1 + 2^-9)
  o[4] = bb(__float2bfloat16_rn(1.0f + 1.0f / 256));     // tie: to even (1.0)
  o[5] = bb(__float2bfloat16_rn(1.0f + 3.0f / 256));     // tie: to even (1 + 2^-6)
  o[6] = hb(__hfma(__float2half_rn(1.5f), __float2half_rn(2.0f), __float2half_rn(0.25f)));
  o[7] = bb(__hfma(__float2bfloat16_rn(1.5f), __float2bfloat16_rn(2.0f), __float2bfloat16_rn(0.25f)));
  o[8] = hb(hsqrt(__float2half_rn(4.0f)));
  o[9] = hb(hrcp(__float2half_rn(4.0f)));
  o[10] = hb(hexp(__float2half_rn(0.0f)));
  o[11] = bb(hsqrt(__float2bfloat16_rn(9.0f)));
  o[12] = bb(hrcp(__float2bfloat16_rn(0.5f)));
  o[13] = bb(hexp(__float2bfloat16_rn(0.0f)));
  o[14] = hb(lunajit::from_float<__half>(lunajit::to_float(__float2bfloat16_rn(-2.5f))));
  o[15] = __float_as_uint(lunajit::to_float(__hadd(__float2half_rn(0.5f), __float2half_rn(0.25f))));
}

// The fiber-switch benchmark: `param` barriers, a little shared-memory traffic.
__global__ void barrier_loop_kernel(const TestArgs a) {
  __shared__ float s[1024];
  float acc = 0.0f;
  for (int i = 0; i < a.param; ++i) {
    s[threadIdx.x] = acc + threadIdx.x;
    __syncthreads();
    acc += s[(threadIdx.x + 1) % blockDim.x];
    __syncthreads();
  }
  a.out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
)CUDA";

}  // namespace

KernelSource host_test_kernels() {
  KernelSource s;
  s.name = "host_emulation_test_kernels";
  s.code = kPreamble + kKernels;
  for (const char* e : {"index_kernel", "lunajit_test::block_reduce<256>", "dynamic_smem_kernel",
                        "smem_per_block_kernel", "shuffle_kernel", "atomic_kernel", "divergent_barrier_kernel",
                        "divergent_warp_kernel", "trap_kernel", "half_kernel", "barrier_loop_kernel"}) {
    s.entries.push_back({e, e});
  }
  s.entries[1].role = "reduce";
  return s;
}

KernelSource host_cache_test_kernel(const std::string& marker) {
  KernelSource s;
  s.name = "host_cache_test";
  s.code = kPreamble + "// marker: " + marker + "\n" + R"CUDA(
template <class T>
__global__ void scale_kernel(const TestArgs a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < a.n) a.out[i] = lunajit::to_float(lunajit::from_float<T>(a.in[i] * 2.0f));
}
)CUDA";
  s.entries.push_back({"scale", "scale_kernel<__nv_bfloat16>"});
  return s;
}

KernelSource host_broken_kernel() {
  KernelSource s;
  s.name = "host_broken";
  s.code = kPreamble + R"CUDA(
__global__ void broken_kernel(const TestArgs a) {
  a.out[0] = undefined_identifier_xyz;
}
)CUDA";
  s.entries.push_back({"broken", "broken_kernel"});
  return s;
}

}  // namespace lunajit::test
