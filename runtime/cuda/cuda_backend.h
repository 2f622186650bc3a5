// CudaBackend: the Backend on a CUDA GPU through the driver API (dlopen'd, see
// runtime/cuda/cuda_driver.h; this header does not need cuda.h), with kernels compiled by compile_nvrtc for the
// device's own arch and kept in the binary cache.
//
// One backend drives one device through its primary context (the context the
// CUDA runtime and LibTorch also use, so buffers can be shared with them).
// Work goes to the legacy default stream; launch is asynchronous,
// copy_to_host and synchronize wait. Every call makes the context current on
// the calling thread first, so any thread may use the backend.
#pragma once

#include <functional>
#include <memory>

#include "runtime/backend.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/nvrtc_compiler.h"

namespace lunajit {
namespace cuda {
class CudaDriver;
}

class CudaContext;

class CudaBackend final : public Backend {
 public:
  // Device `ordinal` of the process-wide driver; Error{unavailable} with
  // cuda::kNoCudaMessage when there is no driver or GPU.
  static Result<std::unique_ptr<CudaBackend>> create(int ordinal = 0, NvrtcOptions options = {});
  ~CudaBackend() override;

  BackendKind kind() const override { return BackendKind::cuda; }
  std::string description() const override;  // "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB, driver 12.4)"

  Result<Buffer> allocate(std::size_t bytes) override;
  Status copy_to_device(const Buffer& dst, const void* src, std::size_t bytes) override;
  Status copy_to_host(void* dst, const Buffer& src, std::size_t bytes) override;
  Status fill_zero(const Buffer& dst) override;

  // Compiles through the cache, loads the CUBIN, and raises each kernel's
  // dynamic shared memory limit to what the device allows beside its static
  // shared memory, so launches need no per-launch attribute calls.
  Result<std::shared_ptr<LoadedModule>> load(const KernelSource& source) override;
  // `name_expression` may also be an entry's role ("state", "output", ...).
  Status launch(const LoadedModule& module, std::string_view name_expression, const LaunchConfig& config,
                void** args) override;
  Status synchronize() override;
  // best_splits on this GPU's table row (find_gpu by device name; else the
  // arch's representative product with this device's SM count), with the
  // module's ptxas registers; 0 (the compiled count) for an unknown arch.
  int plan_splits(const LoadedModule& module, const ProblemShape& shape) const override;

  // GPU time of `work` (launches on this backend), from events recorded
  // before and after it, in milliseconds; waits for the work to finish.
  Result<double> time_ms(const std::function<Status()>& work);

  const cuda::DeviceInfo& device() const { return device_; }
  const Arch& arch() const { return arch_; }
  // The compiled kernel behind a module a CudaBackend loaded (CUBIN, resources),
  // or nullptr for another backend's module.
  static const CompiledKernel* compiled(const LoadedModule& module);

 protected:
  void release(DevicePtr ptr) noexcept override;

 private:
  CudaBackend(cuda::CudaDriver* driver, std::shared_ptr<CudaContext> ctx, cuda::DeviceInfo device, Arch arch,
              NvrtcOptions options);

  cuda::CudaDriver* driver_;
  std::shared_ptr<CudaContext> ctx_;
  cuda::DeviceInfo device_;
  Arch arch_;
  NvrtcOptions options_;
};

// The CUDA backend on device 0 (LUNAJIT_CUDA_DEVICE picks another), or
// Error{unavailable} whose message starts with "no CUDA driver/GPU found; use
// --backend host". make_backend() calls this.
Result<std::unique_ptr<Backend>> make_cuda_backend();

}  // namespace lunajit
