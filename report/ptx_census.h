// PTX instruction census of one kernel (issue 11, the report's static
// evidence): how many instructions of each kind the kernel's PTX contains,
// counted statically in the text NVRTC emits (not executed counts: a loop body
// counts once).
//
// A kernel is its .entry and every .func it reaches through direct calls
// (`call`, `call.uni`), each function's body counted once however many call
// sites it has. The kernels keep some work out of line on purpose (the causal
// backward's chunk walks, the causal forward's cp.async prefetch are
// __noinline__ so ptxas allocates them apart): a census of the .entry body
// alone would miss all of it. An indirect call (through a register) has no
// name to follow; the census counts it in `indirect_calls`.
//
//   mma        mma.* and wgmma.* (tensor-core products)
//   fma        fma.* (CUDA-core fused multiply-adds, any type)
//   ld_shared  ld.shared.* (and ld.volatile.shared)
//   st_shared  st.shared.*
//   ld_global  ld.global.* (including .nc)
//   st_global  st.global.*
//   cp_async   cp.async.* copies (not .commit_group / .wait_group / .wait_all)
//   ldmatrix   ldmatrix.*
//   sfu        ex2, lg2, rcp, rsqrt, sqrt, sin, cos (.approx forms and the IEEE ones
//              ptxas expands; tanh.approx too)
//   functions  the .func bodies counted with the entry (0: all inline)
// A leading predicate guard (@%p1, @!%p2) is skipped; comments and labels
// are not instructions.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lunajit::report {

struct PtxCensus {
  int64_t mma = 0, fma = 0, ld_shared = 0, st_shared = 0, ld_global = 0, st_global = 0, cp_async = 0,
          ldmatrix = 0, sfu = 0;
  int64_t functions = 0;       // .func bodies reached from the entry and counted
  int64_t indirect_calls = 0;  // calls through a register (not followed)
  bool found = false;          // the entry was in the PTX
  nlohmann::json to_json() const;
};

// The census of the .entry `lowered_name` of `ptx` and the functions it calls
// (found = false, all zero, when the PTX has no such entry).
PtxCensus ptx_census(std::string_view ptx, std::string_view lowered_name);

// The text the census counts: the body of the .entry `lowered_name`, then the
// body of each .func it reaches through direct calls, each once (empty when
// the PTX has no such entry). For checks finer than the census's kinds (one
// mma shape, one instruction variant).
std::vector<std::string_view> kernel_bodies(std::string_view ptx, std::string_view lowered_name);

}  // namespace lunajit::report
