// KernelSource: one generated CUDA translation unit and what is needed to run it.
//
// The code is deterministic for a (spec, config, pass) and includes only the
// embedded headers of templates/ (and cuda_fp16.h / cuda_bf16.h), so NVRTC and
// the host JIT compile the very same text. Kernels are named by NVRTC name
// expressions (e.g. "lunajit::feature_map_kernel<lunajit_gen::Kernel>"), which
// the compilers turn into lowered (mangled) names.
#pragma once

#include <string>
#include <vector>

#include "codegen/attention_spec.h"
#include "codegen/tile_config.h"

namespace lunajit {

struct KernelEntry {
  std::string role;             // "state", "output", "causal_chunk", "key_stab", "feature_map", ...
  std::string name_expression;  // what NVRTC's nvrtcAddNameExpression receives
};

struct KernelSource {
  AttentionSpec spec;
  TileConfig config;
  Pass pass = Pass::forward;
  std::string name;   // short, file-name friendly: "luna_fwd_causal_bf16_<hash8>"
  std::string code;   // the translation unit
  std::vector<KernelEntry> entries;

  // Hash of the code and every embedded header it can include.
  std::string content_hash() const;
  const KernelEntry* entry(std::string_view role) const;
};

// Hash of every embedded header (templates and CUDA headers), computed once.
const std::string& embedded_headers_hash();

}  // namespace lunajit
