// CudaDriver: the CUDA driver API opened at run time with dlopen("libcuda.so.1"),
// so lunajit builds, links and runs on machines without a GPU or driver.
//
// Only the types come from the toolkit's cuda.h (header-only); every entry point
// is looked up by its versioned symbol name ("cuMemAlloc_v2", ...) with dlsym.
// The symbols used exist in every driver since CUDA 11; cuEventElapsedTime_v2
// (12.8+) falls back to cuEventElapsedTime. The member names are snake_case so
// that cuda.h's renaming macros (#define cuMemAlloc cuMemAlloc_v2) never apply.
//
// When the library, cuInit or a device is missing, the error is
// Error{unavailable} with the message kNoCudaMessage (runtime/cuda/cuda_device.h),
// followed by the detail on a new line.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "runtime/cuda/cuda_device.h"

namespace lunajit::cuda {

class CudaDriver {
 public:
  // The process-wide driver: opened and initialized (cuInit) once; later calls
  // return the same result.
  static Result<CudaDriver*> instance();
  // Opens `library` and initializes it; for tests and for LUNAJIT_CUDA_DRIVER.
  static Result<std::unique_ptr<CudaDriver>> open(const std::string& library);

  ~CudaDriver();
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  int version() const { return version_; }
  // Every device with its properties (an error if there is none).
  Result<std::vector<DeviceInfo>> devices() const;
  Result<DeviceInfo> device(int ordinal) const;

  // Ok, or Error::failure("<what>: CUDA_ERROR_X: <driver's description>").
  Status check(CUresult r, std::string_view what) const;
  std::string error_text(CUresult r) const;

  // Entry points (the driver's own signatures).
  CUresult (*init)(unsigned int) = nullptr;
  CUresult (*driver_get_version)(int*) = nullptr;
  CUresult (*device_get_count)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_name)(char*, int, CUdevice) = nullptr;
  CUresult (*device_get_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;
  CUresult (*device_total_mem)(std::size_t*, CUdevice) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*primary_ctx_release)(CUdevice) = nullptr;
  CUresult (*ctx_set_current)(CUcontext) = nullptr;
  CUresult (*ctx_synchronize)() = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_unload)(CUmodule) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*func_set_attribute)(CUfunction, CUfunction_attribute, int) = nullptr;
  CUresult (*func_get_attribute)(int*, CUfunction_attribute, CUfunction) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void**, void**) = nullptr;
  CUresult (*mem_alloc)(CUdeviceptr*, std::size_t) = nullptr;
  CUresult (*mem_free)(CUdeviceptr) = nullptr;
  CUresult (*memcpy_htod)(CUdeviceptr, const void*, std::size_t) = nullptr;
  CUresult (*memcpy_dtoh)(void*, CUdeviceptr, std::size_t) = nullptr;
  CUresult (*memset_d8)(CUdeviceptr, unsigned char, std::size_t) = nullptr;
  CUresult (*stream_synchronize)(CUstream) = nullptr;
  CUresult (*event_create)(CUevent*, unsigned int) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*event_synchronize)(CUevent) = nullptr;
  CUresult (*event_elapsed_time)(float*, CUevent, CUevent) = nullptr;
  CUresult (*event_destroy)(CUevent) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;

 private:
  CudaDriver() = default;
  void* library_ = nullptr;
  int version_ = 0;
};

}  // namespace lunajit::cuda
