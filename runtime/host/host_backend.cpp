// HostBackend (see host_backend.h).
#include "runtime/host/host_backend.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <cstring>

#include <fmt/format.h>

#include "runtime/host/fiber_scheduler.h"

namespace lunajit {
namespace {

constexpr std::size_t kAlignment = 256;  // like cudaMalloc's

// A loaded source: the plain object and, for sanitized launches, the
// instrumented one; whichever the backend's default needs is loaded by load()
// (so compile errors surface there), the other on first use.
class HostModule final : public LoadedModule {
 public:
  HostModule(KernelSource source, std::unique_ptr<host::HostProgram> program, bool instrumented)
      : source_(std::move(source)) {
    (instrumented ? instrumented_ : program_) = std::move(program);
  }
  const KernelSource& source() const override { return source_; }

  // The index of the entry whose name expression (or, failing that, role) is `name`.
  std::optional<std::size_t> find(std::string_view name, std::string_view* resolved) const {
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t i = 0; i < source_.entries.size(); ++i) {
        const KernelEntry& e = source_.entries[i];
        if ((pass == 0 ? e.name_expression : e.role) == name) {
          *resolved = e.name_expression;
          return i;
        }
      }
    }
    return std::nullopt;
  }
  // Entry `i` of the plain or the instrumented object (sanitizer_pass.h),
  // compiled or taken from the cache on first use.
  Result<host::KernelEntryFn> entry(std::size_t i, bool instrumented, BinaryCache& cache) const {
    std::lock_guard lock(mu_);
    std::unique_ptr<host::HostProgram>& slot = instrumented ? instrumented_ : program_;
    if (!slot) {
      Result<std::unique_ptr<host::HostProgram>> p = host::load_host_program(source_, cache, instrumented);
      if (!p) return p.error();
      slot = std::move(p.value());
    }
    return slot->entries()[i];
  }

 private:
  KernelSource source_;
  mutable std::mutex mu_;
  mutable std::unique_ptr<host::HostProgram> program_;
  mutable std::unique_ptr<host::HostProgram> instrumented_;
};

Status check_copy(const Buffer& buffer, std::size_t bytes, const char* what) {
  if (bytes > buffer.bytes()) {
    return Error::invalid(fmt::format("{}: {} bytes do not fit a buffer of {} bytes", what, bytes, buffer.bytes()));
  }
  if (bytes > 0 && buffer.ptr() == 0) return Error::invalid(fmt::format("{}: empty buffer", what));
  return ok_status();
}

}  // namespace

HostBackend::HostBackend(BinaryCache* cache) : cache_(cache != nullptr ? cache : &BinaryCache::global()) {
  Result<host::SanitizeOptions> env = host::sanitize_from_env();
  if (env) {
    sanitize_ = *env;
  } else {
    sanitize_error_ = env.error();
  }
}

void HostBackend::set_sanitize(const host::SanitizeOptions& options) {
  sanitize_ = options;
  sanitize_error_.reset();
}
HostBackend::~HostBackend() = default;

std::optional<Dim3> HostBackend::last_grid(std::string_view name_expression) const {
  std::lock_guard lock(results_mu_);
  auto it = grids_.find(std::string(name_expression));
  if (it == grids_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::uint64_t> HostBackend::last_async_copies(std::string_view name_expression) const {
  std::lock_guard lock(results_mu_);
  auto it = async_copies_.find(std::string(name_expression));
  if (it == async_copies_.end()) return std::nullopt;
  return it->second;
}

int HostBackend::plan_splits(const LoadedModule& module, const ProblemShape& shape) const {
  (void)shape;
  return splits_ > 0 ? std::min(splits_, module.source().config.state_splits()) : 0;
}

std::string HostBackend::description() const {
  return fmt::format("host ({} threads)", host::host_thread_count());
}

Result<Buffer> HostBackend::allocate(std::size_t bytes) {
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) return Error::failure(fmt::format("host allocation of {} bytes failed", bytes));
  {
    std::lock_guard lock(buffers_mu_);
    buffers_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, next_buffer_id_++};
  }
  return Buffer(this, reinterpret_cast<DevicePtr>(p), bytes);
}

void HostBackend::release(DevicePtr ptr) noexcept {
  {
    std::lock_guard lock(buffers_mu_);
    buffers_.erase(static_cast<std::uintptr_t>(ptr));
  }
  std::free(reinterpret_cast<void*>(ptr));
}

Status HostBackend::copy_to_device(const Buffer& dst, const void* src, std::size_t bytes) {
  if (Status s = check_copy(dst, bytes, "copy_to_device"); !s) return s;
  if (bytes > 0) std::memcpy(dst.as_pointer(), src, bytes);
  return ok_status();
}

Status HostBackend::copy_to_host(void* dst, const Buffer& src, std::size_t bytes) {
  if (Status s = check_copy(src, bytes, "copy_to_host"); !s) return s;
  if (bytes > 0) std::memcpy(dst, src.as_pointer(), bytes);
  return ok_status();
}

Status HostBackend::fill_zero(const Buffer& dst) {
  if (dst.bytes() > 0) std::memset(dst.as_pointer(), 0, dst.bytes());
  return ok_status();
}

Result<std::shared_ptr<LoadedModule>> HostBackend::load(const KernelSource& source) {
  const bool instrumented = sanitize_.any() && !sanitize_error_;
  Result<std::unique_ptr<host::HostProgram>> program = host::load_host_program(source, *cache_, instrumented);
  if (!program) return program.error();
  return std::shared_ptr<LoadedModule>(
      std::make_shared<HostModule>(source, std::move(program.value()), instrumented));
}

Status HostBackend::launch(const LoadedModule& module, std::string_view name_expression, const LaunchConfig& config,
                           void** args) {
  const auto* host_module = dynamic_cast<const HostModule*>(&module);
  if (host_module == nullptr) return Error::invalid("launch: the module was not loaded by a host backend");
  std::string_view resolved;
  std::optional<std::size_t> index = host_module->find(name_expression, &resolved);
  if (!index) {
    std::string known;
    for (const KernelEntry& e : module.source().entries) known += fmt::format(" '{}' ({})", e.name_expression, e.role);
    return Error::invalid(fmt::format("launch: module '{}' has no kernel '{}'; it has:{}", module.source().name,
                                      name_expression, known));
  }
  host::SanitizeOptions options = sanitize_;
  if (!config.host_sanitize.empty()) {
    Result<host::SanitizeOptions> parsed = host::parse_sanitize(config.host_sanitize);
    if (!parsed) return parsed.error();
    options = *parsed;
  } else if (sanitize_error_) {
    return *sanitize_error_;
  }
  Result<host::KernelEntryFn> entry_fn = host_module->entry(*index, options.any(), *cache_);
  if (!entry_fn) return entry_fn.error();
  const host::KernelEntryFn entry = *entry_fn;
  {
    std::lock_guard lock(results_mu_);
    grids_[std::string(resolved)] = config.grid;
  }
  if (!options.any()) return host::run_grid(host::GridLaunch{entry, args, config, resolved});

  std::vector<host::MemoryRange> buffers;
  if (options.bounds) {
    std::lock_guard lock(buffers_mu_);
    for (const auto& [begin, b] : buffers_) buffers.push_back({begin, b.first, b.second});
  }
  host::SanitizerReport report;
  host::GridLaunch grid{entry, args, config, resolved, &options, buffers, &report};
  Status s = host::run_grid(grid);
  std::lock_guard lock(results_mu_);
  ++sanitized_launches_;
  host::count_sanitized_launch(report.findings.size());
  last_findings_ = std::move(report.findings);
  async_copies_[std::string(resolved)] = report.async_copies;
  if (options.banks) {
    host::record_bank_sites(resolved, report.banks);
    last_banks_ = std::move(report.banks);
    std::sort(last_banks_.begin(), last_banks_.end(), [](const host::BankSite& a, const host::BankSite& b) {
      return a.wavefronts - a.ideal > b.wavefronts - b.ideal;
    });
  }
  return s;
}

std::unique_ptr<Backend> make_host_backend() { return std::make_unique<HostBackend>(); }

}  // namespace lunajit
