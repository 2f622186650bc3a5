// HostBackend: the Backend on the CPU. Kernels are the same generated CUDA
// source, JIT-compiled with Clang against the emulation prelude
// (runtime/host/host_jit.h) and run by the fiber scheduler
// (runtime/host/fiber_scheduler.h); device memory is ordinary host memory.
//
// Everything is synchronous: launch() returns when the grid has finished, with
// an error naming the block and thread if a block could not complete (divergent
// barrier, __trap). Threads of a block are fibers on one OS thread; blocks run in
// parallel on host_thread_count() OS threads.
#pragma once

#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cache/binary_cache.h"
#include "runtime/backend.h"
#include "runtime/host/host_jit.h"
#include "runtime/host/sanitizer.h"

namespace lunajit {

class HostBackend final : public Backend {
 public:
  // Kernels' object code is cached in `cache` (the process-wide
  // BinaryCache::global() when null); the cache must outlive the backend.
  explicit HostBackend(BinaryCache* cache = nullptr);
  ~HostBackend() override;

  BackendKind kind() const override { return BackendKind::host; }
  std::string description() const override;  // "host (8 threads)"

  // 256-byte aligned host memory; DevicePtr is its address.
  Result<Buffer> allocate(std::size_t bytes) override;
  Status copy_to_device(const Buffer& dst, const void* src, std::size_t bytes) override;
  Status copy_to_host(void* dst, const Buffer& src, std::size_t bytes) override;
  Status fill_zero(const Buffer& dst) override;

  // Compiles through the binary cache (or loads the cached object) and links.
  Result<std::shared_ptr<LoadedModule>> load(const KernelSource& source) override;
  // `name_expression` may also be an entry's role ("state", "output", ...).
  // Synchronous.
  Status launch(const LoadedModule& module, std::string_view name_expression, const LaunchConfig& config,
                void** args) override;
  Status synchronize() override { return ok_status(); }
  // The runtime split count of every plan (Backend::plan_splits), capped at
  // each config's state_splits; 0 (the default): the compiled count. Tests
  // set it to run the counts a GPU would pick (before creating runners: a
  // runner remembers its count per shape).
  int plan_splits(const LoadedModule& module, const ProblemShape& shape) const override;
  void set_splits(int splits) { splits_ = splits; }
  // The grid of the last launch of a kernel (its name expression), for tests
  // that check what a plan launched; nullopt if never launched.
  std::optional<Dim3> last_grid(std::string_view name_expression) const;

  BinaryCache& cache() const { return *cache_; }

  // Sanitizers (runtime/host/sanitizer.h, README "Host sanitizers") for every
  // launch that does not name its own in LaunchConfig::host_sanitize; starts
  // as LUNAJIT_HOST_SANITIZE (an unparsable value makes every launch fail
  // with its error). A finding fails the launch: its Error says what, where
  // and which line, and last_findings() holds it structured.
  void set_sanitize(const host::SanitizeOptions& options);
  const host::SanitizeOptions& sanitize() const { return sanitize_; }
  const std::vector<host::SanitizerFinding>& last_findings() const { return last_findings_; }
  // Bank statistics of the last launch with `banks` (block (0,0,0)), worst first.
  const std::vector<host::BankSite>& last_bank_sites() const { return last_banks_; }
  // Launches that ran with at least one check or a non-default schedule. The
  // last_* results are those of the most recent sanitized launch.
  std::uint64_t sanitized_launches() const { return sanitized_launches_; }
  // The cp.async copies (every block's threads) of the last sanitized launch
  // of a kernel (its name expression): tests tell a pipelined load path from
  // the synchronous one by it; nullopt if no sanitized launch of it ran.
  std::optional<std::uint64_t> last_async_copies(std::string_view name_expression) const;

 protected:
  void release(DevicePtr ptr) noexcept override;

 private:
  BinaryCache* cache_;
  int splits_ = 0;
  host::SanitizeOptions sanitize_;
  std::optional<Error> sanitize_error_;  // LUNAJIT_HOST_SANITIZE did not parse
  std::vector<host::SanitizerFinding> last_findings_;
  std::vector<host::BankSite> last_banks_;
  std::uint64_t sanitized_launches_ = 0;
  std::map<std::string, Dim3> grids_;  // last_grid
  std::map<std::string, std::uint64_t> async_copies_;  // last_async_copies
  mutable std::mutex results_mu_;  // the five above (the last_* results written by sanitized launches)
  // Live allocations, for the bounds check: begin -> (bytes, number).
  std::mutex buffers_mu_;
  std::map<std::uintptr_t, std::pair<std::size_t, unsigned>> buffers_;
  unsigned next_buffer_id_ = 1;
};

// The host backend on the global binary cache; make_backend("host") calls this.
std::unique_ptr<Backend> make_host_backend();

}  // namespace lunajit
