// Measured kernel times on a CUDA GPU for the report: each kernel of a pass
// timed on its own with CUDA events (CudaBackend::time_ms), after one warm-up
// run of the whole pass so every kernel finds the workspace its predecessors
// write. Inputs are seeded N(0, 1) values in the spec's dtype and the
// parameters of init_params, so data-dependent paths (exp, relu) see realistic
// values.
#pragma once

#include <map>
#include <string>

#include "codegen/launch_plan.h"
#include "common/result.h"

namespace lunajit {
class CudaBackend;
}

namespace lunajit::report {

struct KernelTiming {
  double time_ms = 0;  // mean over the repeats
  int repeats = 0;
};

// Times every kernel of (spec, config, pass) at `shape` on `gpu`, keyed by role:
// the whole pass once (warm-up), then each kernel alone, `repeats` times.
// Pass::feature_map maps keys (is_query = 0); Pass::backward runs on random
// q, k, v, dout and a zero o. Error when the pass cannot be generated, loaded
// or launched.
Result<std::map<std::string, KernelTiming>> measure_pass(CudaBackend& gpu, const AttentionSpec& spec,
                                                         const TileConfig& config, Pass pass,
                                                         const ProblemShape& shape, int repeats);

}  // namespace lunajit::report
