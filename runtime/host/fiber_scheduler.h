// The host emulator's execution of a CUDA grid: every thread of a block is a
// fiber, the fibers of a block run on one OS thread and switch at barriers and
// warp operations, blocks run in parallel on a pool of OS threads.
//
// Kernels reach the scheduler through the C functions of
// templates/lunajit/emulation/host_abi.h, which the host JIT binds into every
// module as absolute symbols (emulation_symbols()).
//
// A block whose threads can make no progress (a thread exited while others wait
// at __syncthreads, threads wait at different barriers, a warp operation waits
// for a lane that exited) is abandoned, never waited for: run_grid() returns an
// error naming the kernel, the block and the thread.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "common/result.h"
#include "runtime/backend.h"
#include "runtime/host/sanitizer.h"

namespace lunajit::host {

// One thread of a kernel: the extern "C" wrapper the host JIT appends for each
// entry, which unpacks `args` (CUDA's `void* args[]`) into the kernel's parameters.
using KernelEntryFn = void (*)(void** args);

// Global memory a sanitized launch may touch (bounds check): [begin, begin + bytes).
struct MemoryRange {
  std::uintptr_t begin = 0;
  std::size_t bytes = 0;
  unsigned id = 0;  // the allocation's number, for messages ("buffer #3")
};

struct GridLaunch {
  KernelEntryFn entry = nullptr;
  void** args = nullptr;
  LaunchConfig config;
  std::string_view kernel_name;  // for error messages
  // Sanitizers (sanitizer.h): null or all-off runs plain. The instrumented
  // checks need `entry` from the instrumented object (host_jit.h).
  const SanitizeOptions* sanitize = nullptr;
  std::span<const MemoryRange> buffers = {};  // sorted by begin; for bounds
  SanitizerReport* report = nullptr;     // findings and bank statistics, if wanted
};

// Runs every block of the grid and returns when all have finished (or the first
// failed: blocks not yet started are skipped). Checks the configuration like
// the device would (block size <= 1024, nonzero dimensions).
Status run_grid(const GridLaunch& launch);

// OS threads that run blocks: LUNAJIT_HOST_THREADS, else the CPUs this process
// may run on.
unsigned host_thread_count();

// Bytes of stack per fiber: LUNAJIT_HOST_STACK_KB * 1024, else 256 KiB. Stacks
// are reserved, not committed, and reused from block to block; a guard page
// below each one turns an overflow into a fault instead of silent corruption.
std::size_t fiber_stack_bytes();

// The functions of host_abi.h, by symbol name, for the JIT to define.
struct HostSymbol {
  const char* name;
  void* address;
};
std::span<const HostSymbol> emulation_symbols();

}  // namespace lunajit::host
