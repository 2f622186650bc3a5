// The host JIT when the build has none (-DLUNAJIT_HOST_JIT=OFF: a GPU machine
// without LLVM/Clang 19 development files, bench/gpu_check.sh): every load is
// an `unavailable` error that says so; the host backend, and everything that
// checks on it, fails with that message instead of running. Replaces
// runtime/host/host_jit.cpp and sanitizer_pass.cpp, the only LLVM users.
#include "runtime/host/host_jit.h"

namespace lunajit::host {

struct HostProgram::Jit {};

HostJitCounters host_jit_counters() { return {}; }

const std::vector<std::string>& host_compile_flags(bool) {
  static const std::vector<std::string> none;
  return none;
}

std::string host_translation_unit(const KernelSource& source) { return source.code; }

std::string host_cache_key(const KernelSource& source, bool instrumented) {
  return "no-host-jit-" + source.content_hash() + (instrumented ? "-instrumented" : "");
}

HostProgram::HostProgram() = default;
HostProgram::~HostProgram() = default;

Result<std::unique_ptr<HostProgram>> load_host_program(const KernelSource& source, BinaryCache&, bool) {
  return Error::unavailable("host backend: " + source.name +
                            ": this build has no host JIT (configured with -DLUNAJIT_HOST_JIT=OFF); "
                            "run on a CUDA GPU, or rebuild with LLVM/Clang 19 and LUNAJIT_HOST_JIT=ON");
}

}  // namespace lunajit::host
