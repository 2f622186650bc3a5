// PTX instruction census of one kernel (issue 11, the report's static
// evidence): how many instructions of each kind the kernel's PTX contains,
// counted statically in the text NVRTC emits (not executed counts: a loop body
// counts once).
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
// A leading predicate guard (@%p1, @!%p2) is skipped; comments and labels
// are not instructions.
#pragma once

#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

namespace lunajit::report {

struct PtxCensus {
  int64_t mma = 0, fma = 0, ld_shared = 0, st_shared = 0, ld_global = 0, st_global = 0, cp_async = 0,
          ldmatrix = 0, sfu = 0;
  bool found = false;  // the entry was in the PTX
  nlohmann::json to_json() const;
};

// The census of the .entry `lowered_name` of `ptx` (found = false, all zero,
// when the PTX has no such entry).
PtxCensus ptx_census(std::string_view ptx, std::string_view lowered_name);

}  // namespace lunajit::report
