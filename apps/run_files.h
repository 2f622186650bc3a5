// `lunajit run SPEC --inputs IN.safetensors [--save OUT.safetensors] [--backward]`:
// the kernels on the caller's tensors instead of random ones.
//
//   IN   q [batch, seq, heads, head_dim], k (same), v [batch, seq, heads, value_dim]
//        (F32, F64, F16 or BF16; converted to the spec's dtype for the kernels);
//        optional params (1-D, the flat layout of codegen/feature_params.h;
//        default init_params(spec, heads, --seed)); with --backward an optional
//        "do" (the upstream gradient, shaped like the output; default all ones,
//        the gradient of o.sum()).
//   OUT  o [batch, seq, heads, value_dim] F32; with --backward also dq, dk, dv
//        (F32) and dparams (F32, shaped like params, for families with
//        parameters); metadata "lunajit.spec" (canonical JSON) and "lunajit.config".
// A missing, misshapen or wrongly typed input is exit 2 naming the tensor, its
// shape and what the spec expects.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace lunajit {

struct RunFiles {
  std::string inputs, save;
};

// Adds --inputs and --save to `run`.
void add_run_file_options(CLI::App* run, RunFiles& files);

// Runs as the file comment says; returns the exit code. `spec`, `config_json`,
// `arch`, `backend` are the run command's own arguments.
int run_with_files(const RunFiles& files, const std::string& spec, const std::string& config_json,
                   const std::string& arch, const std::string& backend, bool backward, uint64_t seed, bool as_json);

}  // namespace lunajit
