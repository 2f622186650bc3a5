// Tuner: picks the tile config of each (spec, pass, shape bucket) and stores
// the decision in the tuning database (cache/tuning_db.h).
//
// For each tunable pass (forward; backward once generated):
//   1. candidates: search_space (valid configs deduplicated by the pass's
//      effective knobs), optionally an evenly spaced sample (demo, tests);
//      unless `exhaustive`, the cost model (codegen/cost_model.h, 64
//      registers assumed) ranks them at every pending shape and only the best
//      `top_k` at each shape go on (their union, in search-space order); the
//      others are listed as "pruned (model rank r of n)" and cannot win;
//   2. every remaining candidate is compiled with NVRTC for the arch, in parallel on all
//      cores (a candidate that can_implement accepts but NVRTC rejects is an
//      error: a bug in the templates, not something to skip);
//   3. correctness: the reference config (default_config) is checked against
//      the double-precision reference, then every candidate's output against
//      the reference config's, on the check backend at a small shape; a
//      candidate that fails can never win;
//   4. ranking at each requested shape: measured with the Timer when one is
//      given ("measured": the forward's or the backward's whole launch plan,
//      as the op runs it, on zero-filled tensors), else by the static cost model with the ptxas
//      resources of step 2 ("model-ranked"); the fastest correct candidate
//      wins, ties to the earlier candidate, so every rank of a job that tunes
//      the same way picks the same config. Model-ranked, a candidate whose
//      kernels spill (ptxas) wins only when every correct candidate spills:
//      the model cannot price local-memory traffic, and ptxas's register
//      choice for the small tiles it favours sometimes spills (T16.w4 on
//      sm_80 for LUNA with the envelope, softplus and gelu: the backward
//      state kernel at 128 registers, 8 B; T16.w8 on sm_90 for the default
//      spec until its backward map moved onto tensor cores). Measured
//      times include the spills' cost and are taken as they are.
// Shapes whose bucket is already in the database are served from it without
// compiling anything (unless `retune`). Each (pass, shape) is stored in the
// database the moment it is decided, so a tune that is stopped resumes where
// it left off: a rerun serves the finished ones from the database.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "autotune/search_space.h"
#include "autotune/timer.h"
#include "autotune/validation.h"
#include "cache/tuning_db.h"
#include "runtime/cuda/cuda_device.h"
#include "codegen/gpu_specs.h"
#include "codegen/launch_plan.h"
#include "runtime/backend.h"
#include "runtime/nvrtc_compiler.h"

namespace lunajit {

struct TuneProgress {
  std::string stage;  // "compile", "check", "time"
  Pass pass = Pass::forward;
  size_t done = 0, total = 0;
};

struct TuneResult;

// How many candidates per shape the quick tune compiles, checks and ranks
// (`lunajit tune --top-k`): 6 keeps a cold tune of the default spec (forward
// and backward, one shape) under a minute on 2 cores (README "Tuning").
inline constexpr size_t kDefaultTopK = 6;

struct TuneOptions {
  Arch arch;
  std::vector<ProblemShape> shapes;
  std::vector<Pass> passes;       // empty: tunable_passes(spec, arch)
  size_t max_candidates = 0;      // 0: the whole search space; else sample_space(.., n, default)
  size_t top_k = kDefaultTopK;    // step 1's model pre-ranking keeps this many per shape (0: all)
  bool exhaustive = false;        // compile, check and rank every candidate (no pre-ranking)
  int threads = 0;                // compile/check workers; 0: std::thread::hardware_concurrency()
  bool check = true;              // step 3 (off only for tests that look at compilation alone)
  CheckOptions check_options{.shape = {1, 2, 70}, .seed = 7};  // the small shape of step 3
  bool retune = false;            // ignore what the database holds
  NvrtcOptions nvrtc;             // step 2's compile options (and binary cache)
  std::function<void(const TuneProgress&)> progress;
  // Called for each (pass, shape) when it is served from the database
  // (from_db) or decided and stored.
  std::function<void(const TuneResult&)> on_result;
  // Tests only: changes a candidate's check output before it is compared
  // (to make a candidate wrong on purpose).
  std::function<void(const TileConfig&, std::vector<double>&)> perturb_output;
};

// One candidate of one (pass, shape).
struct CandidateResult {
  TileConfig config;
  double compile_seconds = 0;   // NVRTC (0 when cached)
  bool compiled = false;
  bool correct = false;         // passed step 3 (or step 3 was off)
  double rel_rms = 0;           // against the reference config's output
  double ms = 0;                // measured median or predicted
  std::string status;           // "ok", "wrong output: ...", "compile failed: ...", "slow (rejected early)",
                                // "pruned (model rank r of n)"
  double model_ms = 0;          // step 1's pre-ranking prediction at the first pending shape (0 when exhaustive)
  int spill_bytes = 0;          // ptxas spill stores + loads over the candidate's kernels (step 2)
};

struct TuneResult {
  Pass pass = Pass::forward;
  ProblemShape shape;
  TuningKey key;
  TileConfig chosen;
  std::string method;           // "measured" | "model-ranked"
  bool from_db = false;
  bool saved = false;           // stored in the database file (false: memory only)
  std::string tuned_at;         // the database entry's
  std::vector<CandidateResult> candidates;  // empty when from_db
  double compile_wall_seconds = 0;  // step 2 for the pass (shared by its shapes)
  double check_wall_seconds = 0;    // step 3
  uint64_t nvrtc_compiles = 0;      // NVRTC invocations of step 2
  size_t space_size = 0;            // candidates before step 1's pre-ranking
  size_t pruned = 0;                // of which pruned by the model (not compiled)
};

class Tuner {
 public:
  // `check_backend` runs step 3 (the host backend without a GPU); `timer`
  // (may be null) measures on `timing_backend` (a CudaBackend) in step 4;
  // without both, step 4 uses the cost model on `gpu` (representative_gpu of
  // the arch when null).
  Tuner(TuningDb& db, Backend& check_backend, TuneOptions options, Timer* timer = nullptr,
        Backend* timing_backend = nullptr, const GpuSpec* gpu = nullptr);

  Result<std::vector<TuneResult>> tune(const AttentionSpec& spec);

  // The candidates of (spec, pass) under these options (search space, sampled).
  std::vector<TileConfig> candidates(const AttentionSpec& spec, Pass pass) const;

 private:
  TuningDb& db_;
  Backend& check_backend_;
  TuneOptions options_;
  Timer* timer_;
  Backend* timing_backend_;
  const GpuSpec* gpu_;
};

// Compiles `configs` of (spec, pass) for `arch` with NVRTC on `threads`
// workers (0: all cores). Each element: the compiled kernel or the error.
std::vector<Result<CompiledKernel>> compile_candidates(const AttentionSpec& spec, Pass pass,
                                                       const std::vector<TileConfig>& configs, const Arch& arch,
                                                       int threads, const NvrtcOptions& options = {},
                                                       const std::function<void(size_t done)>& on_done = {});

// The database key of (spec, pass, shape).
TuningKey tuning_key(const AttentionSpec& spec, Pass pass, const ProblemShape& shape);

// The fingerprint of a GPU, and the stand-in without one: the arch's
// representative product, driver "none".
DeviceFingerprint model_fingerprint(const Arch& arch);

// The fingerprint of a CUDA device (what `lunajit tune` keys its database by).
DeviceFingerprint device_fingerprint(const cuda::DeviceInfo& device);

// What a run-time lookup decided.
struct ConfigChoice {
  TileConfig config;
  LookupKind from = LookupKind::none;  // none: default_config
  std::string method;                  // the entry's method, or "default"
};

// The config to run (spec, pass) at `shape` with: the database's exact
// bucket, else its nearest bucket, else default_config(spec, arch, pass). An
// entry whose config no longer passes can_implement is ignored. Deterministic
// for a given database file.
ConfigChoice choose_config(const TuningDb& db, const AttentionSpec& spec, Pass pass, const ProblemShape& shape,
                           const Arch& arch);

}  // namespace lunajit
