// The ABI between kernels JIT-compiled for the host and the fiber scheduler of
// the lunajit runtime (runtime/host/fiber_scheduler.cpp).
//
// Plain C++ with no CUDA keywords: host_prelude.h includes it on the kernel side
// and the runtime includes it on the library side, so both agree on the layout by
// construction (like kernel_args.cuh). The functions are defined in the lunajit
// runtime and handed to each JIT'd module as absolute symbols, so the executable
// needs no -rdynamic.
#pragma once

extern "C" {

struct LunajitEmuDim3 {
  unsigned x, y, z;
};

// What the built-ins of the current CUDA thread read. One per OS thread; the
// scheduler rewrites `thread_idx` before it resumes a fiber, the rest when a
// block starts.
struct LunajitEmuContext {
  LunajitEmuDim3 thread_idx;
  LunajitEmuDim3 block_idx;
  LunajitEmuDim3 block_dim;
  LunajitEmuDim3 grid_dim;
  unsigned char* dynamic_smem;       // 128-byte aligned, `dynamic_smem_bytes` long
  unsigned long long dynamic_smem_bytes;
};

// Warp-level operations; all but `activemask` meet at a rendezvous of the lanes
// named in the mask (consecutive linear thread ids, 32 a warp).
enum LunajitEmuWarpOp {
  LUNAJIT_EMU_SYNCWARP = 0,
  LUNAJIT_EMU_SHFL_IDX = 1,
  LUNAJIT_EMU_SHFL_UP = 2,
  LUNAJIT_EMU_SHFL_DOWN = 3,
  LUNAJIT_EMU_SHFL_XOR = 4,
  LUNAJIT_EMU_BALLOT = 5,
  LUNAJIT_EMU_ANY = 6,
  LUNAJIT_EMU_ALL = 7,
  LUNAJIT_EMU_REDUCE_ADD = 8,   // param: 1 = signed, 0 = unsigned (32-bit values)
  LUNAJIT_EMU_REDUCE_MIN = 9,
  LUNAJIT_EMU_REDUCE_MAX = 10,
  LUNAJIT_EMU_ACTIVEMASK = 11,  // no rendezvous: lanes of the warp that have not exited
  LUNAJIT_EMU_COLLECTIVE = 12,  // lunajit_emu_warp_collective (the scheduler's tag, not passed by kernels)
};

// The context of the CUDA thread running on this OS thread. The pointer is fixed
// per OS thread (a block never migrates), hence `const`: the compiler may hoist
// the call, and still reloads the fields after every scheduler call.
LunajitEmuContext* lunajit_emu_context(void) noexcept __attribute__((const));

// __syncthreads_count: waits until every thread of the block arrives; returns
// the number of threads that passed a nonzero predicate.
int lunajit_emu_syncthreads(int predicate) noexcept;

// One warp operation of kind `op` (LunajitEmuWarpOp) over the lanes of `mask`;
// `value` carries up to 8 bytes, `param` the lane / delta / lane mask.
unsigned long long lunajit_emu_warp(int op, unsigned mask, unsigned long long value, int param,
                                    int width) noexcept;

// Aborts the block: launch() returns an error naming the thread and `what`.
[[noreturn]] void lunajit_emu_trap(const char* what) noexcept;

// ---- block-payload warp collective (lunajit/mma.cuh) ----
// Each lane of `mask` calls lunajit_emu_warp_collective with a pointer to its
// own payload (its registers, on its fiber's stack). When the last lane of the
// mask arrives, the scheduler calls `fn(lanes, mask)` once, on that lane, with
// lanes[l] = lane l's payload (null for lanes outside the mask); `fn` reads
// every lane's inputs and writes every lane's outputs in place, then all lanes
// return. The lanes must agree on `fn`, `what` (operation, shape, type, e.g.
// "mma.sync.m16n8k16.bf16"), `mask`
// and the call site (`file`, `line`); a lane that disagrees, a mask that is not
// the whole warp where `fn` needs it, or a lane that exited aborts the block
// with the kernel, block, warp and both lines.
typedef void (*LunajitEmuCollectiveFn)(void* const* lanes, unsigned mask);
void lunajit_emu_warp_collective(LunajitEmuCollectiveFn fn, const char* what, unsigned mask, void* payload,
                                 const char* file, int line) noexcept;

// ---- cp.async (per thread) ----
// Issues an asynchronous copy of `src_bytes` from `src` to `dst`, zero-filling
// up to `bytes`: `dst` is poisoned (0xFF) now and written when the thread's
// wait_group covering it completes. commit closes the thread's open group;
// wait completes all but the `pending` most recent committed groups. A store
// into a pending destination (seen at the wait) is an error naming `line`.
void lunajit_emu_cp_async(void* dst, const void* src, unsigned bytes, unsigned src_bytes, int line) noexcept;
void lunajit_emu_cp_async_commit(void) noexcept;
void lunajit_emu_cp_async_wait(int pending, int line) noexcept;

// ---- sanitizer instrumentation (runtime/host/sanitizer_pass.h) ----
// Only the instrumented variant of a kernel object calls this: before every
// load and store that may touch shared or global memory.
struct LunajitEmuSite {
  const char* file;
  unsigned line;
  unsigned column;
};
#define LUNAJIT_EMU_ACCESS_WRITE 1u
#define LUNAJIT_EMU_ACCESS_ALIGN_SHIFT 8  // bits 8..15: log2 of the access's alignment in the IR
void lunajit_emu_access(const void* address, unsigned long long bytes, unsigned flags,
                        const LunajitEmuSite* site) noexcept;

}  // extern "C"
