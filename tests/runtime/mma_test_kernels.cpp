#include "tests/runtime/mma_test_kernels.h"

#define LUNAJIT_MMA_TEST_STRINGIFY_(...) #__VA_ARGS__
#define LUNAJIT_MMA_TEST_STRINGIFY(...) LUNAJIT_MMA_TEST_STRINGIFY_(__VA_ARGS__)

namespace lunajit::test {

KernelSource mma_test_kernels() {
  KernelSource s;
  s.name = "mma_test_kernels";
  s.code = std::string("#include \"lunajit/mma.cuh\"\n") + LUNAJIT_MMA_TEST_STRINGIFY(LUNAJIT_MMA_TEST_ARGS_STRUCT) +
           R"CUDA(
namespace mma_test {
using namespace lunajit::mma;

// Two consecutive 16-bit elements of row-major `m` (leading dimension ld) as one register.
__device__ __forceinline__ unsigned row_pair(const unsigned short* m, int ld, int row, int col) {
  return (unsigned)m[row * ld + col] | ((unsigned)m[row * ld + col + 1] << 16);
}
// Elements (k, n) and (k + 1, n) of row-major K x N `m`.
__device__ __forceinline__ unsigned col_pair(const unsigned short* m, int ld, int k, int n) {
  return (unsigned)m[k * ld + n] | ((unsigned)m[(k + 1) * ld + n] << 16);
}

// D = A B + C per warp: A 16x16 row-major, B 16x8 (K x N) row-major, C/D 16x8,
// warp w at offset w * (256, 128, 128). Fragments loaded from global memory by
// the PTX ISA map; SWAP loads rows g+8 where g belongs (a deliberate bug).
template <class T, bool SWAP>
__global__ void mma_k16(const MmaArgs p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const unsigned short* A = p.a + warp * 256;
  const unsigned short* B = p.b + warp * 128;
  const float* C = p.c + warp * 128;
  float* D = p.d + warp * 128;
  const int r0 = SWAP ? g + 8 : g, r1 = SWAP ? g : g + 8;
  unsigned a[4] = {row_pair(A, 16, r0, 2 * t), row_pair(A, 16, r1, 2 * t), row_pair(A, 16, r0, 2 * t + 8),
                   row_pair(A, 16, r1, 2 * t + 8)};
  unsigned b[2] = {col_pair(B, 8, 2 * t, g), col_pair(B, 8, 2 * t + 8, g)};
  float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  mma_m16n8k16<T>(d, a, b, c);
  D[g * 8 + 2 * t] = d[0];
  D[g * 8 + 2 * t + 1] = d[1];
  D[(g + 8) * 8 + 2 * t] = d[2];
  D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// D = A B + C, m16n8k8: A 16x8, B 8x8 (K x N), one warp.
template <class T>
__global__ void mma_k8(const MmaArgs p) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  unsigned a[2] = {row_pair(p.a, 8, g, 2 * t), row_pair(p.a, 8, g + 8, 2 * t)};
  unsigned b[1] = {col_pair(p.b, 8, 2 * t, g)};
  float c[4] = {p.c[g * 8 + 2 * t], p.c[g * 8 + 2 * t + 1], p.c[(g + 8) * 8 + 2 * t], p.c[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  mma_m16n8k8<T>(d, a, b, c);
  p.d[g * 8 + 2 * t] = d[0];
  p.d[g * 8 + 2 * t + 1] = d[1];
  p.d[(g + 8) * 8 + 2 * t] = d[2];
  p.d[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// The canonical pipeline: A and B row-major in shared memory, A fragments by
// ldmatrix.x4, B fragments by ldmatrix.x2.trans, one m16n8k16. One warp.
template <class T>
__global__ void ldmatrix_gemm(const MmaArgs p) {
  __shared__ __align__(16) unsigned short sa[256];
  __shared__ __align__(16) unsigned short sb[128];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int i = lane; i < 256; i += 32) sa[i] = p.a[i];
  for (int i = lane; i < 128; i += 32) sb[i] = p.b[i];
  __syncwarp();
  unsigned a[4], b[2];
  ldmatrix<4>(a, &sa[(lane % 16) * 16 + (lane / 16) * 8]);  // matrices (rows 0-7|8-15) x (cols 0-7|8-15)
  ldmatrix<2, true>(b, &sb[(lane % 16) * 8]);               // rows k 0-7 and 8-15, transposed
  float c[4] = {p.c[g * 8 + 2 * t], p.c[g * 8 + 2 * t + 1], p.c[(g + 8) * 8 + 2 * t], p.c[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  mma_m16n8k16<T>(d, a, b, c);
  p.d[g * 8 + 2 * t] = d[0];
  p.d[g * 8 + 2 * t + 1] = d[1];
  p.d[(g + 8) * 8 + 2 * t] = d[2];
  p.d[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// Raw ldmatrix: p.a holds 4 row-major 8x8 matrices (256 elements) and 64 more;
// lane l of the lanes that count (8N) points at row l%8 of matrix l/8, the
// others at the extra 64 elements (which must not show up). r[lane * 4 + i] = reg i.
template <int N, bool TRANS>
__global__ void ldmatrix_layout(const MmaArgs p) {
  __shared__ __align__(16) unsigned short s[320];
  const int lane = threadIdx.x & 31;
  for (int i = lane; i < 320; i += 32) s[i] = p.a[i];
  __syncwarp();
  unsigned r[N];
  const unsigned short* row = lane < 8 * N ? &s[(lane / 8) * 64 + (lane % 8) * 8] : &s[256 + (lane % 8) * 8];
  ldmatrix<N, TRANS>(r, row);
  for (int i = 0; i < 4; ++i) p.r[lane * 4 + i] = i < N ? r[i] : 0u;
}

// cp.async in three groups per thread (16 floats each): ca 4 B, ca 8 B | ca 16 B,
// cg 16 B | cg 16 B zero-fill with (t % 5) * 4 source bytes; float 1 is a plain
// store. After wait_group 1, wait_group 0 and a barrier, dst[j] = s[(j + 16) % n].
__global__ void cp_async_copy(const MmaArgs p) {
  float* s = reinterpret_cast<float*>(lunajit::dynamic_smem());
  const int t = threadIdx.x, n = blockDim.x * 16;
  float* mine = s + t * 16;
  const float* src = p.src + t * 16;
  mine[1] = 1.0f;
  cp_async_ca<4>(mine + 0, src + 0);
  cp_async_ca<8>(mine + 2, src + 2);
  cp_async_commit();
  cp_async_ca<16>(mine + 4, src + 4);
  cp_async_cg(mine + 8, src + 8);
  cp_async_commit();
  cp_async_cg_zfill(mine + 12, src + 12, (t % 5) * 4);
  cp_async_commit();
  cp_async_wait<1>();
  cp_async_wait<0>();
  __syncthreads();
  for (int j = t; j < n; j += blockDim.x) p.dst[j] = s[(j + 16) % n];
}

// Bug: a store into the destination of a pending cp.async.
__global__ void cp_async_store_pending(const MmaArgs p) {
  float* s = reinterpret_cast<float*>(lunajit::dynamic_smem());
  const int t = threadIdx.x;
  cp_async_cg(s + t * 4, p.src + t * 4);
  s[t * 4 + 1] = 0.0f;
  cp_async_commit();
  cp_async_wait<0>();
  p.dst[t] = s[t * 4];
}

// Bug: a read of the destination of a pending cp.async (dst[t]), then the
// value after the wait (dst[blockDim.x + t]).
__global__ void cp_async_read_pending(const MmaArgs p) {
  float* s = reinterpret_cast<float*>(lunajit::dynamic_smem());
  const int t = threadIdx.x;
  cp_async_cg(s + t * 4, p.src + t * 4);
  cp_async_commit();
  p.dst[t] = s[t * 4];
  cp_async_wait<0>();
  p.dst[blockDim.x + t] = s[t * 4];
}

// r[i] = fma.rn.relu.bf16x2(x_i, y_i, z_i), r[n + i] = fma.rn.bf16x2(...), with
// x_i = a[2i], a[2i+1]; y_i = b[2i], b[2i+1]; z_i = a[2n + 2i], a[2n + 2i + 1].
__global__ void bf16x2_fma(const MmaArgs p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x, n = p.param;
  if (i >= n) return;
  const unsigned x = row_pair(p.a, 0, 0, 2 * i), y = row_pair(p.b, 0, 0, 2 * i), z = row_pair(p.a, 0, 0, 2 * n + 2 * i);
  p.r[i] = fma_relu_bf16x2(x, y, z);
  p.r[n + i] = fma_bf16x2(x, y, z);
}

// Bug: half of the warp reaches the mma at one line, the other half at another.
__global__ void mma_divergent_sites(const MmaArgs p) {
  const int lane = threadIdx.x & 31;
  unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float c[4] = {0, 0, 0, 0}, d[4];
  if (lane < 16) {
    mma_m16n8k16<__nv_bfloat16>(d, a, b, c);
  } else {
    mma_m16n8k16<__nv_bfloat16>(d, a, b, c);
  }
  p.d[threadIdx.x] = d[0];
}

// Bug: a block of 48 threads, so warp 1 has 16 lanes, runs ldmatrix.
__global__ void mma_partial_warp(const MmaArgs p) {
  __shared__ __align__(16) unsigned short s[64];
  for (int i = threadIdx.x; i < 64; i += blockDim.x) s[i] = 0;
  __syncthreads();
  unsigned r[1];
  ldmatrix<1>(r, &s[(threadIdx.x % 8) * 8]);
  p.r[threadIdx.x] = r[0];
}
}  // namespace mma_test
)CUDA";
  for (const char* e :
       {"mma_test::mma_k16<__nv_bfloat16, false>", "mma_test::mma_k16<__half, false>",
        "mma_test::mma_k16<__nv_bfloat16, true>", "mma_test::mma_k8<__nv_bfloat16>", "mma_test::mma_k8<__half>",
        "mma_test::ldmatrix_gemm<__nv_bfloat16>", "mma_test::ldmatrix_gemm<__half>",
        "mma_test::ldmatrix_layout<1, false>", "mma_test::ldmatrix_layout<1, true>",
        "mma_test::ldmatrix_layout<2, false>", "mma_test::ldmatrix_layout<2, true>",
        "mma_test::ldmatrix_layout<4, false>", "mma_test::ldmatrix_layout<4, true>", "mma_test::cp_async_copy",
        "mma_test::cp_async_store_pending", "mma_test::cp_async_read_pending", "mma_test::bf16x2_fma",
        "mma_test::mma_divergent_sites", "mma_test::mma_partial_warp"}) {
    s.entries.push_back({e, e});
  }
  return s;
}

}  // namespace lunajit::test
