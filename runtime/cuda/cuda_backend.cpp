// CudaBackend: primary context, memory, module loading and launches through
// the dlopen'd driver.
#include "runtime/cuda/cuda_backend.h"

#include "common/input_limits.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "codegen/cost_model.h"
#include "codegen/gpu_specs.h"
#include "runtime/cuda/cuda_driver.h"

namespace lunajit {

// The device's primary context, retained while any backend or module uses it.
class CudaContext {
 public:
  CudaContext(cuda::CudaDriver* driver, CUdevice device, CUcontext ctx)
      : driver_(driver), device_(device), ctx_(ctx) {}
  ~CudaContext() { driver_->primary_ctx_release(device_); }
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  Status make_current() const { return driver_->check(driver_->ctx_set_current(ctx_), "cuCtxSetCurrent"); }
  cuda::CudaDriver* driver() const { return driver_; }

 private:
  cuda::CudaDriver* driver_;
  CUdevice device_;
  CUcontext ctx_;
};

namespace {

struct CudaKernel {
  std::string name_expression;
  std::string role;
  CUfunction function = nullptr;
  int static_smem = 0;
  int max_dynamic_smem = 0;  // what the attribute was raised to
};

class CudaModule final : public LoadedModule {
 public:
  CudaModule(std::shared_ptr<CudaContext> ctx, KernelSource source, CompiledKernel compiled)
      : ctx_(std::move(ctx)), source_(std::move(source)), compiled_(std::move(compiled)) {}
  ~CudaModule() override {
    if (module_ && ctx_->make_current()) ctx_->driver()->module_unload(module_);
  }

  const KernelSource& source() const override { return source_; }
  const CompiledKernel& compiled() const { return compiled_; }

  const CudaKernel* find(std::string_view name) const {
    for (const auto& k : kernels_)
      if (k.name_expression == name) return &k;
    for (const auto& k : kernels_)
      if (k.role == name) return &k;
    return nullptr;
  }

  std::shared_ptr<CudaContext> ctx_;
  KernelSource source_;
  CompiledKernel compiled_;
  CUmodule module_ = nullptr;
  std::vector<CudaKernel> kernels_;
};

// The arch NVRTC compiles for: the device's own, or the highest known one of
// the same major version below it (a CUBIN for X.y runs on X.z, z >= y).
Result<Arch> arch_for_device(const cuda::DeviceInfo& d) {
  if (auto a = arch_from_sm(d.sm())) return a;
  int best = 0;
  for (int sm : known_sms())
    if (sm / 10 == d.cc_major && sm <= d.sm()) best = sm;
  if (best) return arch_from_sm(best);
  return Error::unavailable(fmt::format("{} has compute capability {}.{}, which lunajit does not know; known: sm_{}",
                                        d.name, d.cc_major, d.cc_minor, fmt::join(known_sms(), ", sm_")));
}

}  // namespace

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int ordinal, NvrtcOptions options) {
  auto driver = cuda::CudaDriver::instance();
  if (!driver) return driver.error();
  cuda::CudaDriver* d = *driver;
  auto info = d->device(ordinal);
  if (!info) return info.error();
  auto arch = arch_for_device(*info);
  if (!arch) return arch.error();
  CUdevice dev = 0;
  if (auto s = d->check(d->device_get(&dev, ordinal), "cuDeviceGet"); !s) return s.error();
  CUcontext ctx = nullptr;
  if (auto s = d->check(d->primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain"); !s) return s.error();
  auto context = std::make_shared<CudaContext>(d, dev, ctx);
  if (auto s = context->make_current(); !s) return s.error();
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(d, std::move(context), std::move(*info), std::move(*arch), std::move(options)));
}

CudaBackend::CudaBackend(cuda::CudaDriver* driver, std::shared_ptr<CudaContext> ctx, cuda::DeviceInfo device,
                         Arch arch, NvrtcOptions options)
    : driver_(driver), ctx_(std::move(ctx)), device_(std::move(device)), arch_(std::move(arch)),
      options_(std::move(options)) {}

CudaBackend::~CudaBackend() = default;

int CudaBackend::plan_splits(const LoadedModule& module, const ProblemShape& shape) const {
  const KernelSource& src = module.source();
  GpuSpec gpu;
  if (const GpuSpec* row = find_gpu(device_.name)) gpu = *row;
  else if (const GpuSpec* rep = representative_gpu(arch_.sm)) gpu = *rep;
  else return 0;
  if (device_.sm_count > 0) gpu.sm_count = device_.sm_count;  // a cut-down part of the row's product
  std::map<std::string, KernelUsage> usage;
  if (const CompiledKernel* k = compiled(module)) usage = usage_by_role(src, *k);
  return best_splits(src.spec, src.config, src.pass, shape, gpu, arch_, usage);
}

std::string CudaBackend::description() const {
  return fmt::format("{} (sm_{}, {} SMs, {:.1f} GiB, driver {})", device_.name, device_.sm(), device_.sm_count,
                     static_cast<double>(device_.total_memory) / (1024.0 * 1024.0 * 1024.0),
                     cuda::format_driver_version(device_.driver_version));
}

Result<Buffer> CudaBackend::allocate(std::size_t bytes) {
  if (bytes == 0) return Buffer(this, 0, 0);
  if (auto s = ctx_->make_current(); !s) return s.error();
  CUdeviceptr p = 0;
  if (auto s = driver_->check(driver_->mem_alloc(&p, bytes), fmt::format("cuMemAlloc({} bytes)", bytes)); !s)
    return s.error();
  return Buffer(this, static_cast<DevicePtr>(p), bytes);
}

void CudaBackend::release(DevicePtr ptr) noexcept {
  if (ptr == 0) return;
  if (ctx_->make_current()) driver_->mem_free(static_cast<CUdeviceptr>(ptr));
}

Status CudaBackend::copy_to_device(const Buffer& dst, const void* src, std::size_t bytes) {
  if (bytes > dst.bytes())
    return Error::invalid(fmt::format("copy_to_device: {} bytes into a buffer of {}", bytes, dst.bytes()));
  if (bytes == 0) return ok_status();
  if (auto s = ctx_->make_current(); !s) return s;
  return driver_->check(driver_->memcpy_htod(static_cast<CUdeviceptr>(dst.ptr()), src, bytes), "cuMemcpyHtoD");
}

Status CudaBackend::copy_to_host(void* dst, const Buffer& src, std::size_t bytes) {
  if (bytes > src.bytes())
    return Error::invalid(fmt::format("copy_to_host: {} bytes from a buffer of {}", bytes, src.bytes()));
  if (bytes == 0) return ok_status();
  if (auto s = ctx_->make_current(); !s) return s;
  return driver_->check(driver_->memcpy_dtoh(dst, static_cast<CUdeviceptr>(src.ptr()), bytes), "cuMemcpyDtoH");
}

Status CudaBackend::fill_zero(const Buffer& dst) {
  if (dst.bytes() == 0) return ok_status();
  if (auto s = ctx_->make_current(); !s) return s;
  return driver_->check(driver_->memset_d8(static_cast<CUdeviceptr>(dst.ptr()), 0, dst.bytes()), "cuMemsetD8");
}

Result<std::shared_ptr<LoadedModule>> CudaBackend::load(const KernelSource& source) {
  auto compiled = compile_nvrtc(source, arch_, options_);
  if (!compiled) return compiled.error();
  if (auto s = ctx_->make_current(); !s) return s.error();
  auto module = std::make_shared<CudaModule>(ctx_, source, std::move(*compiled));
  if (CUresult r = driver_->module_load_data(&module->module_, module->compiled().cubin.data());
      r != CUDA_SUCCESS) {
    std::string msg = fmt::format("cuModuleLoadData({} for sm_{}): {}", source.name, arch_.sm, driver_->error_text(r));
    int major = 0, minor = 0;
    if (std::sscanf(nvrtc_version().c_str(), "%d.%d", &major, &minor) == 2 &&
        device_.driver_version < major * 1000 + minor * 10)
      msg += fmt::format("\nthe driver ({}) is older than NVRTC ({}.{}); a CUBIN from a newer toolkit may need a newer driver",
                         cuda::format_driver_version(device_.driver_version), major, minor);
    return Error::failure(msg);
  }
  for (const auto& entry : source.entries) {
    CudaKernel k;
    k.name_expression = entry.name_expression;
    k.role = entry.role;
    const std::string& lowered = module->compiled().lowered_names.at(entry.name_expression);
    if (auto s = driver_->check(driver_->module_get_function(&k.function, module->module_, lowered.c_str()),
                                "cuModuleGetFunction(" + entry.name_expression + ")");
        !s)
      return s.error();
    driver_->func_get_attribute(&k.static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, k.function);
    // Kernels default to 48 KiB of dynamic shared memory; raise the limit once
    // to everything the device offers beside the static part.
    const int max_dynamic = device_.max_smem_per_block_optin - k.static_smem;
    if (max_dynamic > 0 &&
        driver_->func_set_attribute(k.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, max_dynamic) ==
            CUDA_SUCCESS) {
      k.max_dynamic_smem = max_dynamic;
    } else {
      k.max_dynamic_smem = 48 * 1024 - k.static_smem;
    }
    module->kernels_.push_back(std::move(k));
  }
  return std::shared_ptr<LoadedModule>(std::move(module));
}

Status CudaBackend::launch(const LoadedModule& module, std::string_view name_expression, const LaunchConfig& config,
                           void** args) {
  const auto* m = dynamic_cast<const CudaModule*>(&module);
  if (!m) return Error::invalid("CudaBackend::launch: the module was not loaded by a CUDA backend");
  const CudaKernel* k = m->find(name_expression);
  if (!k)
    return Error::invalid(fmt::format("no kernel '{}' in module {}", name_expression, module.source().name));
  const auto& g = config.grid;
  const auto& b = config.block;
  const unsigned threads = b.x * b.y * b.z;
  if (threads == 0 || static_cast<int>(threads) > device_.max_threads_per_block)
    return Error::invalid(fmt::format("{}: block of {} threads; {} allows 1..{}", k->name_expression, threads,
                                      device_.name, device_.max_threads_per_block));
  if (static_cast<int>(config.dynamic_smem) > k->max_dynamic_smem)
    return Error::invalid(fmt::format("{}: {} bytes of dynamic shared memory requested; {} allows {} beside {} static",
                                      k->name_expression, config.dynamic_smem, device_.name, k->max_dynamic_smem,
                                      k->static_smem));
  if (auto s = ctx_->make_current(); !s) return s;
  return driver_->check(driver_->launch_kernel(k->function, g.x, g.y, g.z, b.x, b.y, b.z, config.dynamic_smem,
                                               nullptr, args, nullptr),
                        fmt::format("cuLaunchKernel({}, grid ({},{},{}), block ({},{},{}), {} B dynamic smem)",
                                    k->name_expression, g.x, g.y, g.z, b.x, b.y, b.z, config.dynamic_smem));
}

Status CudaBackend::synchronize() {
  if (auto s = ctx_->make_current(); !s) return s;
  return driver_->check(driver_->ctx_synchronize(), "cuCtxSynchronize");
}

Result<double> CudaBackend::time_ms(const std::function<Status()>& work) {
  if (auto s = ctx_->make_current(); !s) return s.error();
  CUevent start = nullptr, stop = nullptr;
  if (auto s = driver_->check(driver_->event_create(&start, CU_EVENT_DEFAULT), "cuEventCreate"); !s) return s.error();
  if (auto s = driver_->check(driver_->event_create(&stop, CU_EVENT_DEFAULT), "cuEventCreate"); !s) {
    driver_->event_destroy(start);
    return s.error();
  }
  auto run = [&]() -> Result<double> {
    if (auto s = driver_->check(driver_->event_record(start, nullptr), "cuEventRecord"); !s) return s.error();
    if (auto s = work(); !s) return s.error();
    if (auto s = driver_->check(driver_->event_record(stop, nullptr), "cuEventRecord"); !s) return s.error();
    if (auto s = driver_->check(driver_->event_synchronize(stop), "cuEventSynchronize"); !s) return s.error();
    float ms = 0;
    if (auto s = driver_->check(driver_->event_elapsed_time(&ms, start, stop), "cuEventElapsedTime"); !s)
      return s.error();
    return static_cast<double>(ms);
  };
  auto result = run();
  driver_->event_destroy(start);
  driver_->event_destroy(stop);
  return result;
}

const CompiledKernel* CudaBackend::compiled(const LoadedModule& module) {
  const auto* m = dynamic_cast<const CudaModule*>(&module);
  return m ? &m->compiled() : nullptr;
}

Result<std::unique_ptr<Backend>> make_cuda_backend() {
  int ordinal = 0;
  if (const char* env = std::getenv("LUNAJIT_CUDA_DEVICE"); env && *env) {
    auto parsed = limits::parse_int("LUNAJIT_CUDA_DEVICE", env, {0, 1023});  // never atoi's silent 0
    if (!parsed) return parsed.error();
    ordinal = static_cast<int>(*parsed);
  }
  auto backend = CudaBackend::create(ordinal);
  if (!backend) return backend.error();
  return std::unique_ptr<Backend>(std::move(*backend));
}

}  // namespace lunajit
