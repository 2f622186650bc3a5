#include "autotune/timer.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "runtime/cuda/cuda_backend.h"

namespace lunajit {
namespace {

class CudaEventTimer final : public Timer {
 public:
  CudaEventTimer(CudaBackend& backend, const CudaTimerOptions& options) : backend_(backend), options_(options) {}

  Result<TimingSample> time(const TileConfig&, const std::function<Status()>& run, double best_ms) override {
    if (options_.flush_l2 && flush_.bytes() == 0) {
      // Twice the L2 so that nothing of the previous repetition stays cached.
      const size_t bytes = std::max<size_t>(2 * size_t(std::max(backend_.device().l2_bytes, 1 << 20)), 8u << 20);
      auto b = backend_.allocate(bytes);
      if (!b) return b.error();
      flush_ = std::move(*b);
    }
    for (int i = 0; i < options_.warmup; ++i)
      if (auto st = run(); !st) return st.error();
    if (auto st = backend_.synchronize(); !st) return st.error();
    TimingSample s;
    std::vector<double> ms;
    const auto start = std::chrono::steady_clock::now();
    auto median = [&] {
      std::vector<double> v = ms;
      std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
      return v[v.size() / 2];
    };
    while (int(ms.size()) < options_.max_repetitions) {
      if (options_.flush_l2)
        if (auto st = backend_.fill_zero(flush_); !st) return st.error();
      auto t = backend_.time_ms(run);  // events around the run only, not the flush
      if (!t) return t.error();
      ms.push_back(*t);
      if (int(ms.size()) < options_.min_repetitions) continue;
      if (median() > options_.reject_factor * best_ms) {
        s.rejected_early = true;
        break;
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > options_.budget_seconds)
        break;
    }
    s.repetitions = int(ms.size());
    s.median_ms = median();
    return s;
  }

 private:
  CudaBackend& backend_;
  CudaTimerOptions options_;
  Buffer flush_;
};

}  // namespace

std::unique_ptr<Timer> make_cuda_event_timer(CudaBackend& backend, const CudaTimerOptions& options) {
  return std::make_unique<CudaEventTimer>(backend, options);
}

}  // namespace lunajit
