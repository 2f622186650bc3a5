// Backend: one interface for running generated kernels on a CUDA GPU or on the
// CPU (host emulation). Code that launches kernels (the launch plans, the tuner,
// the binding) does not know which backend it talks to.
//
// Device memory is addressed by a `DevicePtr` (a CUdeviceptr on CUDA, a host
// address on the emulator); kernel arguments are the structs of
// templates/lunajit/kernel_args.cuh, passed as `void* args[] = {&a}`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "codegen/kernel_source.h"
#include "codegen/launch_plan.h"
#include "common/result.h"

namespace lunajit {

enum class BackendKind { host, cuda };
std::string_view to_string(BackendKind k);

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  unsigned dynamic_smem = 0;  // bytes
  // Host backend only: the sanitizers for this launch ("init,race,schedule=reverse",
  // runtime/host/sanitizer.h); empty means the backend's default
  // (LUNAJIT_HOST_SANITIZE). The CUDA backend ignores it.
  std::string_view host_sanitize = {};
};

using DevicePtr = std::uint64_t;

class Backend;

// Memory owned by a backend; freed on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, DevicePtr ptr, std::size_t bytes) : owner_(owner), ptr_(ptr), bytes_(bytes) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  DevicePtr ptr() const { return ptr_; }
  void* as_pointer() const { return reinterpret_cast<void*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  Backend* owner_ = nullptr;
  DevicePtr ptr_ = 0;
  std::size_t bytes_ = 0;
};

// A compiled and loaded KernelSource; kernels are looked up by role or name expression.
class LoadedModule {
 public:
  virtual ~LoadedModule() = default;
  virtual const KernelSource& source() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string description() const = 0;  // "host (2 threads)", "NVIDIA H200 (sm_90)"

  virtual Result<Buffer> allocate(std::size_t bytes) = 0;
  virtual Status copy_to_device(const Buffer& dst, const void* src, std::size_t bytes) = 0;
  virtual Status copy_to_host(void* dst, const Buffer& src, std::size_t bytes) = 0;
  virtual Status fill_zero(const Buffer& dst) = 0;

  // Compiles (through the binary cache) and loads every kernel of `source`.
  virtual Result<std::shared_ptr<LoadedModule>> load(const KernelSource& source) = 0;
  // Launches the kernel named `name_expression` of `module`; may be asynchronous.
  virtual Status launch(const LoadedModule& module, std::string_view name_expression,
                        const LaunchConfig& config, void** args) = 0;
  virtual Status synchronize() = 0;

  // The runtime split count (plan_launches) for running `module`'s pass at
  // `shape` on this backend; 0: the config's compiled state_splits. CUDA:
  // the cost model's best_splits for this GPU (codegen/cost_model.h).
  virtual int plan_splits(const LoadedModule& module, const ProblemShape& shape) const {
    (void)module;
    (void)shape;
    return 0;
  }

 protected:
  friend class Buffer;
  virtual void release(DevicePtr ptr) noexcept = 0;
};

// The backend LUNAJIT_BACKEND (auto | cuda | host) asks for; auto picks CUDA
// when a driver and a GPU are present, else the host emulator.
Result<std::unique_ptr<Backend>> make_backend(std::string_view kind = "auto");

}  // namespace lunajit
