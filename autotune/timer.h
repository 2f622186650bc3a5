// Timer: how the tuner measures one candidate. The tuner hands it a closure
// that runs the candidate's pass once at the tuned shape; tests inject a fake
// timer that returns chosen numbers, and GPU tuning uses CUDA events.
#pragma once

#include <functional>
#include <limits>
#include <memory>

#include "codegen/tile_config.h"
#include "common/result.h"

namespace lunajit {

class CudaBackend;

struct TimingSample {
  double median_ms = 0;
  int repetitions = 0;
  bool rejected_early = false;  // stopped because it was far slower than the best so far
};

class Timer {
 public:
  virtual ~Timer() = default;
  // Times `run` (one execution of `config`'s kernels). `best_ms` is the
  // fastest median so far (infinity for the first candidate), for early
  // rejection.
  virtual Result<TimingSample> time(const TileConfig& config, const std::function<Status()>& run, double best_ms) = 0;
};

struct CudaTimerOptions {
  int warmup = 2;              // untimed runs first (instruction cache, clocks, lazy loading)
  int min_repetitions = 3;
  int max_repetitions = 100;
  double budget_seconds = 0.2;  // per candidate: repeat until spent (at least min_repetitions)
  double reject_factor = 1.75;  // after min_repetitions, stop when median > factor * best
  bool flush_l2 = true;         // overwrite a buffer twice the L2 size between repetitions
};

// CUDA-event timing on `backend` (CudaBackend::time_ms): warm-up, L2 flush
// between repetitions, repetition until the budget, median, early rejection.
std::unique_ptr<Timer> make_cuda_event_timer(CudaBackend& backend, const CudaTimerOptions& options = {});

}  // namespace lunajit
