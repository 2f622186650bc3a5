// `lunajit tune SPEC --shapes B,H,N[;B,H,N...] [--arch sm_90] [--budget S]`:
// tunes every tunable pass of the spec at the given shapes and stores the
// choices in the tuning database (autotune/tuner.h). With a GPU: candidates
// timed with CUDA events ("measured"); without: compiled with NVRTC for
// --arch, checked on the host backend at a small shape against the
// reference, ranked by the cost model ("model-ranked"). Only the cost model's
// best --top-k candidates per shape are compiled, checked and ranked
// (default 6); --exhaustive takes the whole space. A progress bar goes to
// stderr, a summary table (or --json) to stdout.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "apps/subcommand.h"
#include "codegen/launch_plan.h"

namespace lunajit {

Subcommand add_tune_command(CLI::App& app);


struct TuneRun {
  std::string spec;             // spec JSON text or file
  std::string shapes = "4,8,1024";
  std::string arch;             // empty: the GPU's, else sm_90
  std::string backend = "auto";
  std::string pass = "all";     // forward | backward | all (every tunable pass)
  double budget_seconds = 0;    // GPU: total timing budget per (pass, shape); 0: 0.2 s per candidate
  size_t max_candidates = 0;    // 0: the whole search space
  size_t top_k = 6;             // the model's best per shape that are compiled (0: all); TuneOptions::top_k
  bool exhaustive = false;      // every candidate (ignores top_k)
  int threads = 0;
  bool retune = false;
  bool json = false;
  bool quiet = false;           // no progress bar
  std::optional<std::string> note;  // printed before the table (the demo names its subset)
};

// What `lunajit tune` does, callable from the demo.
int run_tune(const TuneRun& args);

// The demo's last LUNA step: tunes the default LUNA spec at one shape on an
// evenly spaced subset of its candidates (the whole space takes minutes on
// the host), saying so in its output.
int run_demo_tune();

}  // namespace lunajit
