// Host JIT: compiles a KernelSource for the CPU in-process with Clang 19 and
// loads it with LLVM ORC, through the binary cache.
//
// The generated translation unit is compiled as C++20 with
// -DLUNAJIT_HOST_EMULATION (so lunajit/device.cuh pulls in the emulation
// prelude), against the embedded templates and CUDA headers held in an in-memory
// file system over the real one (libstdc++ and Clang's resource headers still
// come from disk). For every entry the JIT appends an extern "C" wrapper
// `void lunajit_entry_<i>(void** args)` that calls the entry's name expression
// with CUDA-style `void* args[]` unpacked by the kernel's own parameter types.
//
// Clang emits an object file (-march=native; -O0 plain, -O2 instrumented:
// host_jit.cpp says why), which is what the binary
// cache stores; a cache hit adds the stored object to a fresh LLJIT without
// compiling anything. The host functions the kernels call (host_abi.h) are
// defined in each JIT as absolute symbols: no -rdynamic needed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cache/binary_cache.h"
#include "codegen/kernel_source.h"
#include "common/result.h"
#include "runtime/host/fiber_scheduler.h"

namespace lunajit::host {

// Process-wide counts, so a test can assert that a load compiled nothing.
struct HostJitCounters {
  std::uint64_t compiles = 0;    // translation units Clang compiled
  std::uint64_t cache_hits = 0;  // objects taken from the binary cache
  std::uint64_t loads = 0;       // programs linked into a JIT (hits and misses)
};
HostJitCounters host_jit_counters();

// Clang's arguments, minus the driver path and the file names; part of the cache key.
// The instrumented variant (the host sanitizers, runtime/host/sanitizer_pass.h)
// adds line tables, turns off the vectorizers (every access stays one visible
// load or store) and runs the access instrumentation pass.
const std::vector<std::string>& host_compile_flags(bool instrumented = false);

// The source Clang compiles: `source.code` followed by the entry wrappers.
std::string host_translation_unit(const KernelSource& source);

// Cache key: hash of the translation unit, every embedded header, the compile
// flags, the Clang version, the host CPU (-march=native) and "host".
std::string host_cache_key(const KernelSource& source, bool instrumented = false);

// A loaded program: the JIT that owns the code, and one entry point per
// KernelSource entry, in order.
class HostProgram {
 public:
  ~HostProgram();
  HostProgram(const HostProgram&) = delete;
  HostProgram& operator=(const HostProgram&) = delete;

  const std::vector<KernelEntryFn>& entries() const { return entries_; }

 private:
  friend Result<std::unique_ptr<HostProgram>> load_host_program(const KernelSource&, BinaryCache&, bool);
  struct Jit;
  HostProgram();
  std::unique_ptr<Jit> jit_;
  std::vector<KernelEntryFn> entries_;
};

// Compiles `source` for the host (or takes its object code from `cache`) and
// links it. A Clang error returns ErrorKind::compile_failed with the diagnostics
// and the path of a dumped copy of the translation unit.
Result<std::unique_ptr<HostProgram>> load_host_program(const KernelSource& source, BinaryCache& cache,
                                                      bool instrumented = false);

}  // namespace lunajit::host
