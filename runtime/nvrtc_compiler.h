// NVRTC compiler: a KernelSource to CUBIN (and PTX on request) for one arch,
// with per-function resource usage parsed from ptxas -v, through the binary
// cache.
//
// Every embedded header (templates/lunajit/..., cuda_fp16.h, cuda_bf16.h, ...)
// is handed to NVRTC as an in-memory header, so nothing is read from disk at run
// time and no -I is needed. Kernels are instantiated through NVRTC name
// expressions (jitify2's approach); the lowered (mangled) name of each is kept
// for cuModuleGetFunction and for mapping ptxas's per-function log lines back to
// the name expressions.
//
// Options, fixed for every compile: --std=c++17 (the host JIT compiles the same
// text as C++17, so a template that needs more fails on both, not on one),
// --gpu-architecture=sm_XX (CUBIN; the PTX of the same compile is kept when
// asked), -default-device, -Xptxas=-v. No --use_fast_math: the host emulation
// computes IEEE results and the two must agree.
//
// Cache key: XXH3-128 over the code, every embedded header's path and contents,
// the canonical options, the NVRTC version and the GNU build id of the loaded
// libnvrtc, the arch and LUNAJIT_VERSION. A hit returns the CUBIN with the
// lowered names, log and resources stored beside it, and no NVRTC call.
// Thread-safe: the tuner compiles candidates in parallel.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "codegen/arch.h"
#include "codegen/cost_model.h"
#include "codegen/kernel_source.h"
#include "common/result.h"

namespace lunajit {

class BinaryCache;

struct NvrtcOptions {
  bool emit_ptx = false;   // keep the PTX (CompiledKernel::ptx)
  bool line_info = false;  // -lineinfo, for profilers
  std::vector<std::string> extra;  // appended verbatim (e.g. "-DLUNAJIT_DEBUG=1"); part of the key
  // Where compiled kernels are kept: nullptr means BinaryCache::global().
  BinaryCache* cache = nullptr;
  bool use_cache = true;
};

// What ptxas reported for one kernel ("Used N registers, ...").
struct KernelResources {
  std::string name_expression;  // "lunajit::state_kernel<lunajit_gen::Kernel>"
  std::string lowered_name;     // "_ZN7lunajit12state_kernel..."
  int registers = 0;            // per thread
  int smem_bytes = 0;           // static shared memory per block (dynamic comes at launch)
  int spill_stores = 0;         // bytes
  int spill_loads = 0;          // bytes
  int stack_bytes = 0;          // stack frame per thread
  int barriers = 0;             // named barriers used
  int cmem = 0;                 // bytes of cmem[0] (ptxas of CUDA 13 no longer prints it: 0)
};

struct CompiledKernel {
  std::string cubin;
  std::string ptx;  // only with NvrtcOptions::emit_ptx
  std::map<std::string, std::string> lowered_names;  // name expression -> lowered name
  std::string log;                                    // the NVRTC/ptxas log of the compile
  std::vector<std::string> options;                   // as passed to nvrtcCompileProgram
  std::vector<KernelResources> resources;             // one per KernelSource entry, in order
  double compile_seconds = 0;  // this call: NVRTC time on a miss, cache lookup time on a hit
  bool from_cache = false;
  std::string cache_key;       // 32 hex digits

  // The resources of one kernel, or nullptr.
  const KernelResources* find(std::string_view name_expression) const;
};

// What ptxas reported for each of `src`'s kernels, by role, as the cost model
// takes it (predict_pass, best_splits); roles without resources are left out.
std::map<std::string, KernelUsage> usage_by_role(const KernelSource& src, const CompiledKernel& k);

// Compiles `src` for `arch` (through the cache unless opts.use_cache is false).
// A rejected source gives Error{compile_failed} whose message holds the NVRTC
// log, the options and the path of the source dumped to
// $TMPDIR/lunajit-failed/<name>.cu.
Result<CompiledKernel> compile_nvrtc(const KernelSource& src, const Arch& arch, const NvrtcOptions& opts = {});

// The options compile_nvrtc passes for `arch` and `opts`, in order.
std::vector<std::string> nvrtc_options(const Arch& arch, const NvrtcOptions& opts);

// "13.0" (NVRTC's major.minor as loaded at run time).
std::string nvrtc_version();
// The loaded libnvrtc's identity for cache keys: version plus GNU build id
// ("13.0 build 65be0db3...") or, where there is no build id, its file size.
std::string nvrtc_build_identity();
// The sm numbers NVRTC can target (nvrtcGetSupportedArchs), ascending.
std::vector<int> nvrtc_supported_sms();

// Number of nvrtcCompileProgram calls made by this process; a test compares it
// before and after to assert "no recompile".
std::uint64_t nvrtc_invocations();

// Parses the ptxas -v lines of an NVRTC log into resources per lowered name.
// Exposed for tests; compile_nvrtc maps the result to name expressions.
std::map<std::string, KernelResources> parse_ptxas_resources(std::string_view log);

}  // namespace lunajit
