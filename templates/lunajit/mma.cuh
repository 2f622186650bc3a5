// Warp-level matrix primitives: tensor-core MMA, ldmatrix, cp.async and packed
// bf16x2 arithmetic, with one interface on both backends.
//
//   device (NVRTC): inline PTX, one instruction per call (sm_80 and later).
//   host (LUNAJIT_HOST_EMULATION): the block-payload warp collective of the
//     emulation ABI (lunajit/emulation/host_abi.h): all 32 lanes of the warp
//     meet, each hands in a pointer to its registers, the last lane to arrive
//     computes every lane's result with the fragment maps below and releases
//     the warp. A lane that arrives with another operation, shape or call site,
//     or a warp that is not complete, aborts the launch with an error naming
//     the kernel, block, warp and source line.
//
// Fragment maps (PTX ISA 8.x, section 9.7.14.5 "Warp-level Matrix Fragments"):
//   g = laneid >> 2 (groupID), t = laneid & 3 (threadID_in_group); a 32-bit
//   register holds two 16-bit elements, the lower-indexed one in the low half.
//   "Matrix Fragments for mma.m16n8k16 with floating point type" (.f16/.bf16):
//     A (16x16, row-major): a0,a1 = (row g,   cols 2t, 2t+1)     reg 0
//                           a2,a3 = (row g+8, cols 2t, 2t+1)     reg 1
//                           a4,a5 = (row g,   cols 2t+8, 2t+9)   reg 2
//                           a6,a7 = (row g+8, cols 2t+8, 2t+9)   reg 3
//     B (16x8, "col"):      b0,b1 = (k 2t, 2t+1,   col n = g)    reg 0
//                           b2,b3 = (k 2t+8, 2t+9, col n = g)    reg 1
//     C/D (16x8, f32):      c0 = (g, 2t), c1 = (g, 2t+1), c2 = (g+8, 2t), c3 = (g+8, 2t+1)
//   "Matrix Fragments for mma.m16n8k8" (.f16/.bf16):
//     A (16x8):  a0,a1 = (row g, cols 2t, 2t+1) reg 0; a2,a3 = (row g+8, ...) reg 1
//     B (8x8):   b0,b1 = (k 2t, 2t+1, col g)    reg 0
//     C/D:       as for m16n8k16.
//   "Warp-level matrix load instruction: ldmatrix" (.m8n8 .b16):
//     .x1/.x2/.x4 load 1/2/4 matrices of 8 rows x 8 16-bit elements; lanes
//     8m..8m+7 give the (16-byte aligned) addresses of rows 0..7 of matrix m
//     (the other lanes' addresses are ignored). Destination register m of lane
//     l holds matrix m's row l>>2, elements 2(l&3), 2(l&3)+1; with .trans it
//     holds the transpose's: elements (row 2(l&3), col l>>2) and (row 2(l&3)+1,
//     col l>>2) of the stored matrix.
//   "cp.async", "cp.async.commit_group", "cp.async.wait_group": asynchronous
//     global -> shared copies of 4, 8 or 16 bytes (.ca) or 16 bytes (.cg); the
//     src-size form copies src_bytes < bytes and zero-fills the rest. Copies of
//     a thread are grouped by commit_group; wait_group N waits until at most N
//     of the thread's most recent groups are pending.
//
// The host computes the MMA in fp32 in a fixed order (D = C, then D += A(i,k)
// B(k,j) for k = 0, 1, ... K-1, each product exact in fp32, each sum rounded
// to nearest); the tensor cores sum in an unspecified order and may keep more
// bits, so device and host agree to fp32 summation error (~K ulp), not bitwise.
//
// cp.async on the host: the destination is poisoned (0xFF bytes: NaN for every
// float type) when the copy is issued and written when the wait_group that
// covers it completes; a store into a pending destination is an error at that
// wait (and, with the init sanitizer, so is any read of it; README "Host
// sanitizers").
#pragma once

#include "lunajit/device.cuh"

namespace lunajit::mma {

template <class A, class B> struct IsSame { static constexpr bool value = false; };
template <class A> struct IsSame<A, A> { static constexpr bool value = true; };
// NVRTC has no <type_traits> without the host headers: Select<B, X, Y>::type is X when B, else Y.
template <bool B, class X, class Y> struct Select { using type = X; };
template <class X, class Y> struct Select<false, X, Y> { using type = Y; };

// Packs two floats as a bf16x2 / f16x2 register: `lo` in bits 0..15.
LUNAJIT_DEVICE unsigned pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  unsigned r;
  memcpy(&r, &v, 4);
  return r;
}
LUNAJIT_DEVICE unsigned pack_f16x2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  unsigned r;
  memcpy(&r, &v, 4);
  return r;
}
LUNAJIT_DEVICE float bf16x2_lo(unsigned r) { return __uint_as_float(r << 16); }
LUNAJIT_DEVICE float bf16x2_hi(unsigned r) { return __uint_as_float(r & 0xffff0000u); }

}  // namespace lunajit::mma

#if !defined(LUNAJIT_HOST_EMULATION)
// ============================ device: inline PTX =============================
namespace lunajit::mma {

namespace detail {
LUNAJIT_DEVICE unsigned smem_address(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
}  // namespace detail

// D = A B + C, m16n8k16, T = __nv_bfloat16 or __half, f32 accumulators.
template <class T>
LUNAJIT_DEVICE void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]) {
  if constexpr (IsSame<T, __nv_bfloat16>::value) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%11,%12,%13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
  } else {
    static_assert(IsSame<T, __half>::value, "mma operands are __nv_bfloat16 or __half");
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%11,%12,%13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
  }
}

// D = A B + C, m16n8k8.
template <class T>
LUNAJIT_DEVICE void mma_m16n8k8(float (&d)[4], const unsigned (&a)[2], const unsigned (&b)[1], const float (&c)[4]) {
  if constexpr (IsSame<T, __nv_bfloat16>::value) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b[0]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  } else {
    static_assert(IsSame<T, __half>::value, "mma operands are __nv_bfloat16 or __half");
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b[0]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
}

// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16; `row` is this
// lane's row address (see the header comment for which lanes count).
template <int N, bool TRANS = false>
LUNAJIT_DEVICE void ldmatrix(unsigned (&r)[N], const void* row) {
  const unsigned a = detail::smem_address(row);
  if constexpr (N == 1 && !TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(a));
  } else if constexpr (N == 1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(a));
  } else if constexpr (N == 2 && !TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  } else if constexpr (N == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  } else if constexpr (N == 4 && !TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  } else {
    static_assert(N == 4, "ldmatrix loads 1, 2 or 4 matrices");
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  }
}

// cp.async.ca.shared.global: BYTES = 4, 8 or 16.
template <int BYTES>
LUNAJIT_DEVICE void cp_async_ca(void* smem_dst, const void* gmem_src) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(detail::smem_address(smem_dst)), "l"(gmem_src),
               "n"(BYTES)
               : "memory");
}
// cp.async.cg.shared.global, 16 bytes.
LUNAJIT_DEVICE void cp_async_cg(void* smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(detail::smem_address(smem_dst)), "l"(gmem_src)
               : "memory");
}
// Zero-fill form: copies `src_bytes` (0..16) and zero-fills the rest of 16 bytes.
LUNAJIT_DEVICE void cp_async_cg_zfill(void* smem_dst, const void* gmem_src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(detail::smem_address(smem_dst)), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
LUNAJIT_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
LUNAJIT_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// fma.rn.relu.bf16x2 / fma.rn.bf16x2: per half max(a*b + c, 0), one rounding.
LUNAJIT_DEVICE unsigned fma_relu_bf16x2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.relu.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
LUNAJIT_DEVICE unsigned fma_bf16x2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

}  // namespace lunajit::mma

#else
// ================= host: the block-payload warp collective ===================
namespace lunajit::mma {

namespace detail {
template <int N, bool TRANS>
constexpr const char* ldmatrix_name() {
  if constexpr (N == 1) return TRANS ? "ldmatrix.sync.aligned.m8n8.x1.trans" : "ldmatrix.sync.aligned.m8n8.x1";
  else if constexpr (N == 2) return TRANS ? "ldmatrix.sync.aligned.m8n8.x2.trans" : "ldmatrix.sync.aligned.m8n8.x2";
  else return TRANS ? "ldmatrix.sync.aligned.m8n8.x4.trans" : "ldmatrix.sync.aligned.m8n8.x4";
}

inline float half_bits_to_float(unsigned short h, bool bf16) {
  if (bf16) return __uint_as_float(static_cast<unsigned>(h) << 16);
  __half x;
  memcpy(&x, &h, 2);
  return __half2float(x);
}

// One lane's registers for an mma.
struct MmaPayload {
  unsigned a[4];
  unsigned b[2];
  float c[4];
  float d[4];
};

// The 16-bit element `i` of the lane's fragment registers (`regs`).
inline unsigned short element(const unsigned* regs, int i) {
  return static_cast<unsigned short>(regs[i >> 1] >> ((i & 1) * 16));
}

template <int K, bool BF16>
void mma_collective(void* const* lanes, unsigned) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const MmaPayload& p = *static_cast<const MmaPayload*>(lanes[l]);
    const int g = l >> 2, t = l & 3;
    // A: a0a1 (g, 2t..), a2a3 (g+8, 2t..), and for K = 16 a4a5 (g, 2t+8..), a6a7 (g+8, 2t+8..).
    for (int i = 0; i < (K == 16 ? 8 : 4); ++i) {
      const int row = g + ((i >> 1) & 1) * 8;
      const int col = 2 * t + (i & 1) + (i >> 2) * 8;
      A[row][col] = half_bits_to_float(element(p.a, i), BF16);
    }
    // B: b0b1 (k = 2t.., n = g), for K = 16 b2b3 (k = 2t+8.., n = g).
    for (int i = 0; i < (K == 16 ? 4 : 2); ++i) B[2 * t + (i & 1) + (i >> 1) * 8][g] = half_bits_to_float(element(p.b, i), BF16);
    // C: c0 (g, 2t), c1 (g, 2t+1), c2 (g+8, 2t), c3 (g+8, 2t+1).
    for (int i = 0; i < 4; ++i) C[g + (i >> 1) * 8][2 * t + (i & 1)] = p.c[i];
  }
  for (int l = 0; l < 32; ++l) {
    MmaPayload& p = *static_cast<MmaPayload*>(lanes[l]);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) {
      const int row = g + (i >> 1) * 8, col = 2 * t + (i & 1);
      float acc = C[row][col];
      for (int k = 0; k < K; ++k) acc += A[row][k] * B[k][col];  // exact product, fp32 sum in k order
      p.d[i] = acc;
    }
  }
}

struct LdmatrixPayload {
  const unsigned char* row;
  unsigned r[4];
};

template <int N, bool TRANS>
void ldmatrix_collective(void* const* lanes, unsigned) {
  const unsigned char* rows[4][8];
  for (int m = 0; m < N; ++m) {
    for (int r = 0; r < 8; ++r) {
      const unsigned char* p = static_cast<const LdmatrixPayload*>(lanes[m * 8 + r])->row;
      if (reinterpret_cast<unsigned long long>(p) % 16 != 0) {
        lunajit_emu_trap("ldmatrix with a row address that is not 16-byte aligned");
      }
      rows[m][r] = p;
    }
  }
  for (int l = 0; l < 32; ++l) {
    LdmatrixPayload& p = *static_cast<LdmatrixPayload*>(lanes[l]);
    for (int m = 0; m < N; ++m) {
      unsigned short e[2];
      for (int j = 0; j < 2; ++j) {
        const unsigned char* src = TRANS ? rows[m][2 * (l & 3) + j] + 2 * (l >> 2) : rows[m][l >> 2] + 2 * (2 * (l & 3) + j);
        memcpy(&e[j], src, 2);
      }
      p.r[m] = static_cast<unsigned>(e[0]) | (static_cast<unsigned>(e[1]) << 16);
    }
  }
}

// Rounds a double to the nearest bf16 (ties to even), once: a*b + c of bf16
// operands is exact in double unless the exponents of a*b and c differ by more
// than ~37, so fma.rn's single rounding is reproduced.
inline float round_bf16(double x) {
  if (x != x) return __uint_as_float(0x7fc00000u);
  const double ax = fabs(x);
  double q;
  if (ax < 0x1p-126) {
    q = nearbyint(x * 0x1p133) * 0x1p-133;  // bf16 subnormals: quantum 2^-133
  } else {
    int e = 0;
    const double m = frexp(x, &e);  // |m| in [0.5, 1): 8 significant bits are m * 2^8
    q = ldexp(nearbyint(m * 256.0), e - 8);
  }
  if (fabs(q) > 0x1.FEp127) return x > 0 ? INFINITY : -INFINITY;
  return static_cast<float>(q);
}
}  // namespace detail

template <class T>
inline void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4],
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  static_assert(bf16 || std::is_same_v<T, __half>, "mma operands are __nv_bfloat16 or __half");
  detail::MmaPayload p;
  memcpy(p.a, a, sizeof p.a);
  memcpy(p.b, b, sizeof p.b);
  memcpy(p.c, c, sizeof p.c);
  lunajit_emu_warp_collective(&detail::mma_collective<16, bf16>, bf16 ? "mma.sync.aligned.m16n8k16.f32.bf16" : "mma.sync.aligned.m16n8k16.f32.f16",
                              0xffffffffu, &p, file, line);
  memcpy(d, p.d, sizeof p.d);
}

template <class T>
inline void mma_m16n8k8(float (&d)[4], const unsigned (&a)[2], const unsigned (&b)[1], const float (&c)[4],
                        const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  constexpr bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  static_assert(bf16 || std::is_same_v<T, __half>, "mma operands are __nv_bfloat16 or __half");
  detail::MmaPayload p{};
  memcpy(p.a, a, 2 * sizeof(unsigned));
  p.b[0] = b[0];
  memcpy(p.c, c, sizeof p.c);
  lunajit_emu_warp_collective(&detail::mma_collective<8, bf16>, bf16 ? "mma.sync.aligned.m16n8k8.f32.bf16" : "mma.sync.aligned.m16n8k8.f32.f16",
                              0xffffffffu, &p, file, line);
  memcpy(d, p.d, sizeof p.d);
}

template <int N, bool TRANS = false>
inline void ldmatrix(unsigned (&r)[N], const void* row, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
  detail::LdmatrixPayload p{static_cast<const unsigned char*>(row), {0, 0, 0, 0}};
  lunajit_emu_warp_collective(&detail::ldmatrix_collective<N, TRANS>,
                              detail::ldmatrix_name<N, TRANS>(), 0xffffffffu, &p, file, line);
  for (int i = 0; i < N; ++i) r[i] = p.r[i];
}

template <int BYTES>
inline void cp_async_ca(void* smem_dst, const void* gmem_src, int line = __builtin_LINE()) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async.ca copies 4, 8 or 16 bytes");
  lunajit_emu_cp_async(smem_dst, gmem_src, BYTES, BYTES, line);
}
inline void cp_async_cg(void* smem_dst, const void* gmem_src, int line = __builtin_LINE()) {
  lunajit_emu_cp_async(smem_dst, gmem_src, 16, 16, line);
}
inline void cp_async_cg_zfill(void* smem_dst, const void* gmem_src, int src_bytes, int line = __builtin_LINE()) {
  if (src_bytes < 0 || src_bytes > 16) lunajit_emu_trap("cp.async src-size outside 0..16");
  lunajit_emu_cp_async(smem_dst, gmem_src, 16, static_cast<unsigned>(src_bytes), line);
}
inline void cp_async_commit() { lunajit_emu_cp_async_commit(); }
template <int N>
inline void cp_async_wait(int line = __builtin_LINE()) {
  static_assert(N >= 0, "wait_group N >= 0");
  lunajit_emu_cp_async_wait(N, line);
}

inline unsigned fma_bf16x2_impl(unsigned a, unsigned b, unsigned c, bool relu) {
  unsigned out = 0;
  for (int h = 0; h < 2; ++h) {
    const float fa = __uint_as_float((a >> (16 * h)) << 16), fb = __uint_as_float((b >> (16 * h)) << 16),
                fc = __uint_as_float((c >> (16 * h)) << 16);
    float r = detail::round_bf16(static_cast<double>(fa) * fb + fc);
    unsigned bits = __float_as_uint(r) >> 16;
    if (r != r) bits = 0x7fffu;  // canonical NaN
    else if (relu && r < 0.0f) bits = 0;
    out |= bits << (16 * h);
  }
  return out;
}
inline unsigned fma_relu_bf16x2(unsigned a, unsigned b, unsigned c) { return fma_bf16x2_impl(a, b, c, true); }
inline unsigned fma_bf16x2(unsigned a, unsigned b, unsigned c) { return fma_bf16x2_impl(a, b, c, false); }

}  // namespace lunajit::mma
#endif
