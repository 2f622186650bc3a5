// Host emulation prelude: the CUDA built-ins a lunajit kernel uses, as plain C++
// for the host JIT (runtime/host/host_jit.cpp). lunajit/device.cuh includes it
// first when LUNAJIT_HOST_EMULATION is defined, so NVRTC and Clang compile the
// very same generated source.
//
// Execution model (runtime/host/fiber_scheduler.cpp): every CUDA thread is a
// fiber; the threads of a block run on one OS thread, switching at barriers and
// warp operations; blocks run in parallel on a pool of OS threads. Hence:
//   - `__shared__` is `static thread_local`: one copy per OS thread, and an OS
//     thread runs one block at a time, so a block sees only its own. Like on the
//     device its contents are undefined when a block starts.
//   - memory shared between blocks (global memory) is touched concurrently, so
//     atomics are real atomics (std::atomic_ref, relaxed like CUDA's).
//   - warp operations meet at a rendezvous of the lanes in the mask and are
//     exact, including shuffles of half and bfloat16 values.
// Fast-math intrinsics (__expf, __fdividef, ...) use the precise host function;
// results differ from the device within the intrinsics' documented error.
//
// Ordering matters (docs/HOST_JIT_NOTES.md): the attribute macros first, then the
// CUDA headers (which keep predefined __device__/__shared__ and use gridDim and
// blockDim as field names), then the index macros.
#pragma once

#include <atomic>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

#include "lunajit/emulation/host_abi.h"

// ---- attribute macros -------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __shared__ static thread_local
#define __constant__
#define __managed__

// vector_types.h: float2/float4/uint3/dim3 with the device's alignment.
// vector_functions.h would pull in cuda_runtime_api.h; its make_* are below.
#include "vector_types.h"
#define __VECTOR_FUNCTIONS_H__

inline char1 make_char1(signed char x) { return {x}; }
inline uchar4 make_uchar4(unsigned char x, unsigned char y, unsigned char z, unsigned char w) { return {x, y, z, w}; }
inline char4 make_char4(signed char x, signed char y, signed char z, signed char w) { return {x, y, z, w}; }
inline short2 make_short2(short x, short y) { return {x, y}; }
inline ushort2 make_ushort2(unsigned short x, unsigned short y) { return {x, y}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int3 make_int3(int x, int y, int z) { return {x, y, z}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline longlong2 make_longlong2(long long x, long long y) { return {x, y}; }
inline float1 make_float1(float x) { return {x}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float3 make_float3(float x, float y, float z) { return {x, y, z}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }

#include <cuda_fp16.h>
#include <cuda_bf16.h>

// crt/host_defines.h (pulled in above) defines __align__ and __forceinline__ for
// GNU compilers but leaves __launch_bounds__ and __noinline__ to the device.
#undef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif
#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif
#undef __launch_bounds__
#define __launch_bounds__(...)
#ifndef __grid_constant__
#define __grid_constant__
#endif

// ---- thread indices ---------------------------------------------------------
namespace lunajit::emulation {
inline const uint3& thread_idx() { return *reinterpret_cast<const uint3*>(&lunajit_emu_context()->thread_idx); }
inline const uint3& block_idx() { return *reinterpret_cast<const uint3*>(&lunajit_emu_context()->block_idx); }
inline const dim3& block_dim() { return *reinterpret_cast<const dim3*>(&lunajit_emu_context()->block_dim); }
inline const dim3& grid_dim() { return *reinterpret_cast<const dim3*>(&lunajit_emu_context()->grid_dim); }
}  // namespace lunajit::emulation

#define threadIdx (::lunajit::emulation::thread_idx())
#define blockIdx (::lunajit::emulation::block_idx())
#define blockDim (::lunajit::emulation::block_dim())
#define gridDim (::lunajit::emulation::grid_dim())
constexpr int warpSize = 32;

namespace lunajit {
// Dynamic shared memory of the block (sized by the launch); 128-byte aligned.
inline unsigned char* dynamic_smem() { return lunajit_emu_context()->dynamic_smem; }
}  // namespace lunajit

// ---- barriers, fences -------------------------------------------------------
inline void __syncthreads() { lunajit_emu_syncthreads(0); }
inline int __syncthreads_count(int predicate) { return lunajit_emu_syncthreads(predicate); }
inline int __syncthreads_or(int predicate) { return lunajit_emu_syncthreads(predicate) != 0; }
inline int __syncthreads_and(int predicate) {
  const dim3& b = blockDim;
  return lunajit_emu_syncthreads(predicate) == static_cast<int>(b.x * b.y * b.z);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { lunajit_emu_warp(LUNAJIT_EMU_SYNCWARP, mask, 0, 0, 32); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_signal_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
[[noreturn]] inline void __trap() { lunajit_emu_trap("__trap()"); }
[[noreturn]] inline void __brkpt() { lunajit_emu_trap("__brkpt()"); }
inline void __nanosleep(unsigned) {}
inline long long clock64() { return static_cast<long long>(__builtin_readcyclecounter()); }

// ---- warp operations --------------------------------------------------------
namespace lunajit::emulation {
// Moves any value of up to 8 bytes (int, float, double, __half, __half2,
// __nv_bfloat16, ...) through the warp rendezvous bit for bit.
template <class T>
inline T warp_exchange(int op, unsigned mask, T value, int param, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "warp shuffles move values of at most 8 bytes");
  unsigned long long bits = 0;
  memcpy(&bits, &value, sizeof(T));
  bits = lunajit_emu_warp(op, mask, bits, param, width);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace lunajit::emulation

template <class T>
inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize) {
  return lunajit::emulation::warp_exchange(LUNAJIT_EMU_SHFL_IDX, mask, var, src_lane, width);
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return lunajit::emulation::warp_exchange(LUNAJIT_EMU_SHFL_UP, mask, var, static_cast<int>(delta), width);
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  return lunajit::emulation::warp_exchange(LUNAJIT_EMU_SHFL_DOWN, mask, var, static_cast<int>(delta), width);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  return lunajit::emulation::warp_exchange(LUNAJIT_EMU_SHFL_XOR, mask, var, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(lunajit_emu_warp(LUNAJIT_EMU_BALLOT, mask, predicate != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int predicate) {
  return static_cast<int>(lunajit_emu_warp(LUNAJIT_EMU_ANY, mask, predicate != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int predicate) {
  return static_cast<int>(lunajit_emu_warp(LUNAJIT_EMU_ALL, mask, predicate != 0, 0, 32));
}
inline unsigned __activemask() {
  return static_cast<unsigned>(lunajit_emu_warp(LUNAJIT_EMU_ACTIVEMASK, 0xffffffffu, 0, 0, 32));
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
  return static_cast<unsigned>(lunajit_emu_warp(LUNAJIT_EMU_REDUCE_ADD, mask, v, 0, 32));
}
inline int __reduce_add_sync(unsigned mask, int v) {
  return static_cast<int>(lunajit_emu_warp(LUNAJIT_EMU_REDUCE_ADD, mask, static_cast<unsigned>(v), 1, 32));
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
  return static_cast<unsigned>(lunajit_emu_warp(LUNAJIT_EMU_REDUCE_MIN, mask, v, 0, 32));
}
inline int __reduce_min_sync(unsigned mask, int v) {
  return static_cast<int>(lunajit_emu_warp(LUNAJIT_EMU_REDUCE_MIN, mask, static_cast<unsigned>(v), 1, 32));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  return static_cast<unsigned>(lunajit_emu_warp(LUNAJIT_EMU_REDUCE_MAX, mask, v, 0, 32));
}
inline int __reduce_max_sync(unsigned mask, int v) {
  return static_cast<int>(lunajit_emu_warp(LUNAJIT_EMU_REDUCE_MAX, mask, static_cast<unsigned>(v), 1, 32));
}

// ---- atomics (device-scope, relaxed) ----------------------------------------
namespace lunajit::emulation {
template <class T>
inline std::atomic_ref<T> atomic(T* address) { return std::atomic_ref<T>(*address); }

// Read-modify-write through compare-exchange, for the operations std::atomic_ref
// lacks (min, max, inc, dec, 16-bit floats). Returns the old value.
template <class T, class F>
inline T atomic_update(T* address, F update) {
  std::atomic_ref<T> a(*address);
  T old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, update(old), std::memory_order_relaxed)) {
  }
  return old;
}

template <class H>
inline H atomic_add_16(H* address, H v) {
  unsigned short* bits = reinterpret_cast<unsigned short*>(address);
  unsigned short old = atomic_update(bits, [v](unsigned short o) {
    H h;
    memcpy(&h, &o, 2);
    h = H(static_cast<float>(h) + static_cast<float>(v));
    unsigned short n;
    memcpy(&n, &h, 2);
    return n;
  });
  H out;
  memcpy(&out, &old, 2);
  return out;
}
}  // namespace lunajit::emulation

#define LUNAJIT_EMU_RELAXED std::memory_order_relaxed
inline int atomicAdd(int* a, int v) { return lunajit::emulation::atomic(a).fetch_add(v, LUNAJIT_EMU_RELAXED); }
inline unsigned atomicAdd(unsigned* a, unsigned v) { return lunajit::emulation::atomic(a).fetch_add(v, LUNAJIT_EMU_RELAXED); }
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return lunajit::emulation::atomic(a).fetch_add(v, LUNAJIT_EMU_RELAXED);
}
inline float atomicAdd(float* a, float v) { return lunajit::emulation::atomic(a).fetch_add(v, LUNAJIT_EMU_RELAXED); }
inline double atomicAdd(double* a, double v) { return lunajit::emulation::atomic(a).fetch_add(v, LUNAJIT_EMU_RELAXED); }
inline __half atomicAdd(__half* a, __half v) { return lunajit::emulation::atomic_add_16(a, v); }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* a, __nv_bfloat16 v) { return lunajit::emulation::atomic_add_16(a, v); }
inline int atomicSub(int* a, int v) { return lunajit::emulation::atomic(a).fetch_sub(v, LUNAJIT_EMU_RELAXED); }
inline unsigned atomicSub(unsigned* a, unsigned v) { return lunajit::emulation::atomic(a).fetch_sub(v, LUNAJIT_EMU_RELAXED); }
inline int atomicExch(int* a, int v) { return lunajit::emulation::atomic(a).exchange(v, LUNAJIT_EMU_RELAXED); }
inline unsigned atomicExch(unsigned* a, unsigned v) { return lunajit::emulation::atomic(a).exchange(v, LUNAJIT_EMU_RELAXED); }
inline unsigned long long atomicExch(unsigned long long* a, unsigned long long v) {
  return lunajit::emulation::atomic(a).exchange(v, LUNAJIT_EMU_RELAXED);
}
inline float atomicExch(float* a, float v) { return lunajit::emulation::atomic(a).exchange(v, LUNAJIT_EMU_RELAXED); }
template <class T>
inline T lunajit_emu_cas(T* a, T compare, T v) {
  lunajit::emulation::atomic(a).compare_exchange_strong(compare, v, LUNAJIT_EMU_RELAXED);
  return compare;  // the old value, whether or not it was replaced
}
inline int atomicCAS(int* a, int c, int v) { return lunajit_emu_cas(a, c, v); }
inline unsigned atomicCAS(unsigned* a, unsigned c, unsigned v) { return lunajit_emu_cas(a, c, v); }
inline unsigned long long atomicCAS(unsigned long long* a, unsigned long long c, unsigned long long v) {
  return lunajit_emu_cas(a, c, v);
}
inline unsigned short atomicCAS(unsigned short* a, unsigned short c, unsigned short v) { return lunajit_emu_cas(a, c, v); }
#define LUNAJIT_EMU_MINMAX(T)                                                                        \
  inline T atomicMax(T* a, T v) {                                                                    \
    return lunajit::emulation::atomic_update(a, [v](T o) { return o > v ? o : v; });                 \
  }                                                                                                  \
  inline T atomicMin(T* a, T v) { return lunajit::emulation::atomic_update(a, [v](T o) { return o < v ? o : v; }); }
LUNAJIT_EMU_MINMAX(int)
LUNAJIT_EMU_MINMAX(unsigned)
LUNAJIT_EMU_MINMAX(long long)
LUNAJIT_EMU_MINMAX(unsigned long long)
#undef LUNAJIT_EMU_MINMAX
#define LUNAJIT_EMU_BITWISE(T)                                                                               \
  inline T atomicAnd(T* a, T v) { return lunajit::emulation::atomic(a).fetch_and(v, LUNAJIT_EMU_RELAXED); } \
  inline T atomicOr(T* a, T v) { return lunajit::emulation::atomic(a).fetch_or(v, LUNAJIT_EMU_RELAXED); }   \
  inline T atomicXor(T* a, T v) { return lunajit::emulation::atomic(a).fetch_xor(v, LUNAJIT_EMU_RELAXED); }
LUNAJIT_EMU_BITWISE(int)
LUNAJIT_EMU_BITWISE(unsigned)
LUNAJIT_EMU_BITWISE(unsigned long long)
#undef LUNAJIT_EMU_BITWISE
inline unsigned atomicInc(unsigned* a, unsigned limit) {
  return lunajit::emulation::atomic_update(a, [limit](unsigned o) { return o >= limit ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned* a, unsigned limit) {
  return lunajit::emulation::atomic_update(a, [limit](unsigned o) { return (o == 0 || o > limit) ? limit : o - 1; });
}
#undef LUNAJIT_EMU_RELAXED

// ---- loads and stores with cache hints: plain accesses on the host ----------
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline T __ldcv(const T* p) { return *p; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwt(T* p, T v) { *p = v; }

// ---- float math intrinsics ----------------------------------------------------
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0

// ---- bit reinterpretation and integer intrinsics ----------------------------
inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double x) { long long i; memcpy(&i, &x, 8); return i; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) { return __builtin_bitreverse32(x); }
inline unsigned long long __brevll(unsigned long long x) { return __builtin_bitreverse64(x); }
inline int __mul24(int a, int b) { return a * b; }
inline unsigned __umul24(unsigned a, unsigned b) { return a * b; }
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}

// CUDA's global min/max overloads (device code calls them unqualified).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
// Mixed arithmetic types promote like CUDA's math_functions.hpp (usual conversions).
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B> && !std::is_same_v<A, B>>>
inline std::common_type_t<A, B> min(A a, B b) {
  return min(static_cast<std::common_type_t<A, B>>(a), static_cast<std::common_type_t<A, B>>(b));
}
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B> && !std::is_same_v<A, B>>>
inline std::common_type_t<A, B> max(A a, B b) {
  return max(static_cast<std::common_type_t<A, B>>(a), static_cast<std::common_type_t<A, B>>(b));
}

// ---- half and bfloat16 functions the CUDA headers declare only for the device --
// Computed in fp32 and rounded once to the 16-bit type (the product of two
// 16-bit values is exact in fp32, so __hfma differs from a fused 16-bit FMA only
// by double rounding of the sum).
#define LUNAJIT_EMU_16BIT_MATH(H, H2, TO_F, FROM_F)                                                      \
  inline H __hfma(const H a, const H b, const H c) { return FROM_F(fmaf(TO_F(a), TO_F(b), TO_F(c))); }  \
  inline H __hfma_relu(const H a, const H b, const H c) {                                               \
    float r = fmaf(TO_F(a), TO_F(b), TO_F(c));                                                          \
    return FROM_F(r > 0.0f ? r : 0.0f);                                                                 \
  }                                                                                                     \
  inline H hexp(const H a) { return FROM_F(expf(TO_F(a))); }                                            \
  inline H hexp2(const H a) { return FROM_F(exp2f(TO_F(a))); }                                          \
  inline H hexp10(const H a) { return FROM_F(exp10f(TO_F(a))); }                                        \
  inline H hlog(const H a) { return FROM_F(logf(TO_F(a))); }                                            \
  inline H hlog2(const H a) { return FROM_F(log2f(TO_F(a))); }                                          \
  inline H hlog10(const H a) { return FROM_F(log10f(TO_F(a))); }                                        \
  inline H hsqrt(const H a) { return FROM_F(sqrtf(TO_F(a))); }                                          \
  inline H hrsqrt(const H a) { return FROM_F(1.0f / sqrtf(TO_F(a))); }                                  \
  inline H hrcp(const H a) { return FROM_F(1.0f / TO_F(a)); }                                           \
  inline H hsin(const H a) { return FROM_F(sinf(TO_F(a))); }                                            \
  inline H hcos(const H a) { return FROM_F(cosf(TO_F(a))); }                                            \
  inline H htanh(const H a) { return FROM_F(tanhf(TO_F(a))); }                                          \
  inline H2 __hfma2(const H2 a, const H2 b, const H2 c) {                                               \
    H2 r;                                                                                               \
    r.x = __hfma(a.x, b.x, c.x);                                                                        \
    r.y = __hfma(a.y, b.y, c.y);                                                                        \
    return r;                                                                                           \
  }                                                                                                     \
  inline H2 h2exp(const H2 a) { H2 r; r.x = hexp(a.x); r.y = hexp(a.y); return r; }                    \
  inline H2 h2sqrt(const H2 a) { H2 r; r.x = hsqrt(a.x); r.y = hsqrt(a.y); return r; }                 \
  inline H2 h2rcp(const H2 a) { H2 r; r.x = hrcp(a.x); r.y = hrcp(a.y); return r; }
LUNAJIT_EMU_16BIT_MATH(__half, __half2, __half2float, __float2half_rn)
LUNAJIT_EMU_16BIT_MATH(__nv_bfloat16, __nv_bfloat162, __bfloat162float, __float2bfloat16_rn)
#undef LUNAJIT_EMU_16BIT_MATH
