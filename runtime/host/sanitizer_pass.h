// The LLVM pass behind the host sanitizers (README "Host sanitizers").
//
// Registered at the end of Clang's -O2 pipeline for the instrumented variant
// of a host kernel object (host_jit.cpp), it puts a call
//   lunajit_emu_access(address, bytes, flags, &site)
// before every load, store and memcpy/memset/memmove whose address is not a
// stack slot, a constant global or the entry wrapper's argument array; `site`
// is a constant {file, line, column} from the debug location (the object is
// compiled with -gline-tables-only). The runtime (fiber_scheduler.cpp) decides
// per address: shared memory (init, race, cp.async, bank checks), a fiber
// stack (ignored) or global memory (bounds check against the launch's buffers).
//
// Why a pass of our own rather than -fsanitize=thread/address with their
// runtimes: the checks need CUDA's semantics (barrier epochs, warps, shared
// memory per block, launch buffers), not the host's threads and heap, and a
// pass after the optimizer sees only the accesses that survive register
// promotion, so a sanitized run costs one call per real memory access.
#pragma once

namespace llvm {
class PassBuilder;
}

namespace lunajit::host {

// Adds the instrumentation at the optimizer's last extension point.
void register_access_instrumentation(llvm::PassBuilder& pb);

}  // namespace lunajit::host
