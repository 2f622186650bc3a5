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

}  // extern "C"
