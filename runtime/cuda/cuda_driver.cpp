// CudaDriver: dlopen, dlsym of versioned entry points, cuInit, device queries.
#include "runtime/cuda/cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>
#include <utility>

namespace lunajit::cuda {
namespace {

Error no_cuda(const std::string& detail) {
  return Error::unavailable(std::string(kNoCudaMessage) + "\n" + detail);
}

}  // namespace

std::string format_driver_version(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

Result<std::unique_ptr<CudaDriver>> CudaDriver::open(const std::string& library) {
  void* lib = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = ::dlerror();
    return no_cuda("dlopen(" + library + "): " + (why ? why : "failed"));
  }
  std::unique_ptr<CudaDriver> d(new CudaDriver());
  d->library_ = lib;

  std::string missing;
  // Casts the symbol to the member's type; records the name when it is absent.
  auto load = [&](auto& fn, const char* symbol, const char* fallback = nullptr) {
    void* p = ::dlsym(lib, symbol);
    if (!p && fallback) p = ::dlsym(lib, fallback);
    if (!p) missing += std::string(missing.empty() ? "" : ", ") + symbol;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  load(d->init, "cuInit");
  load(d->driver_get_version, "cuDriverGetVersion");
  load(d->device_get_count, "cuDeviceGetCount");
  load(d->device_get, "cuDeviceGet");
  load(d->device_get_name, "cuDeviceGetName");
  load(d->device_get_attribute, "cuDeviceGetAttribute");
  load(d->device_total_mem, "cuDeviceTotalMem_v2");
  load(d->primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  load(d->primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
  load(d->ctx_set_current, "cuCtxSetCurrent");
  load(d->ctx_synchronize, "cuCtxSynchronize");
  load(d->module_load_data, "cuModuleLoadData");
  load(d->module_unload, "cuModuleUnload");
  load(d->module_get_function, "cuModuleGetFunction");
  load(d->func_set_attribute, "cuFuncSetAttribute");
  load(d->func_get_attribute, "cuFuncGetAttribute");
  load(d->launch_kernel, "cuLaunchKernel");
  load(d->mem_alloc, "cuMemAlloc_v2");
  load(d->mem_free, "cuMemFree_v2");
  load(d->memcpy_htod, "cuMemcpyHtoD_v2");
  load(d->memcpy_dtoh, "cuMemcpyDtoH_v2");
  load(d->memset_d8, "cuMemsetD8_v2");
  load(d->stream_synchronize, "cuStreamSynchronize");
  load(d->event_create, "cuEventCreate");
  load(d->event_record, "cuEventRecord");
  load(d->event_synchronize, "cuEventSynchronize");
  load(d->event_elapsed_time, "cuEventElapsedTime_v2", "cuEventElapsedTime");
  load(d->event_destroy, "cuEventDestroy_v2");
  load(d->get_error_string, "cuGetErrorString");
  load(d->get_error_name, "cuGetErrorName");
  if (!missing.empty()) return no_cuda(library + " lacks " + missing + " (driver older than CUDA 11?)");

  if (CUresult r = d->init(0); r != CUDA_SUCCESS) return no_cuda("cuInit: " + d->error_text(r));
  if (CUresult r = d->driver_get_version(&d->version_); r != CUDA_SUCCESS)
    return no_cuda("cuDriverGetVersion: " + d->error_text(r));
  int count = 0;
  if (CUresult r = d->device_get_count(&count); r != CUDA_SUCCESS)
    return no_cuda("cuDeviceGetCount: " + d->error_text(r));
  if (count == 0) return no_cuda("the driver (" + format_driver_version(d->version_) + ") sees no device");
  return d;
}

// The driver is never dlclose'd: it keeps threads and state past cuInit, and
// unloading it under them is not supported.
CudaDriver::~CudaDriver() = default;

Result<CudaDriver*> CudaDriver::instance() {
  static const Result<CudaDriver*> driver = []() -> Result<CudaDriver*> {
    const char* env = std::getenv("LUNAJIT_CUDA_DRIVER");
    auto opened = open(env && *env ? env : "libcuda.so.1");
    if (!opened) return opened.error();
    return opened->release();  // lives for the process
  }();
  return driver;
}

std::string CudaDriver::error_text(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name) get_error_name(r, &name);
  if (get_error_string) get_error_string(r, &text);
  std::string out = name ? name : "CUDA error " + std::to_string(static_cast<int>(r));
  if (text) out += std::string(": ") + text;
  return out;
}

Status CudaDriver::check(CUresult r, std::string_view what) const {
  if (r == CUDA_SUCCESS) return ok_status();
  return Error::failure(std::string(what) + ": " + error_text(r));
}

Result<DeviceInfo> CudaDriver::device(int ordinal) const {
  CUdevice dev = 0;
  if (auto s = check(device_get(&dev, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")"); !s)
    return s.error();
  DeviceInfo info;
  info.ordinal = ordinal;
  info.driver_version = version_;
  char name[256] = {};
  if (auto s = check(device_get_name(name, sizeof name, dev), "cuDeviceGetName"); !s) return s.error();
  info.name = name;
  if (auto s = check(device_total_mem(&info.total_memory, dev), "cuDeviceTotalMem"); !s) return s.error();
  const std::pair<int*, CUdevice_attribute> attrs[] = {
      {&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
      {&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
      {&info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT},
      {&info.max_threads_per_block, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK},
      {&info.max_smem_per_block_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
      {&info.max_smem_per_sm, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR},
      {&info.l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE},
      {&info.clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE},
      {&info.memory_clock_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE},
      {&info.memory_bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH},
  };
  for (auto [field, attr] : attrs) {
    // Clock attributes are deprecated on newer drivers and may fail; 0 means unknown.
    if (device_get_attribute(field, attr, dev) != CUDA_SUCCESS) *field = 0;
  }
  return info;
}

Result<std::vector<DeviceInfo>> CudaDriver::devices() const {
  int count = 0;
  if (auto s = check(device_get_count(&count), "cuDeviceGetCount"); !s) return s.error();
  std::vector<DeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    auto d = device(i);
    if (!d) return d.error();
    out.push_back(std::move(*d));
  }
  if (out.empty()) return no_cuda("the driver sees no device");
  return out;
}

Result<std::vector<DeviceInfo>> list_devices() {
  auto d = CudaDriver::instance();
  if (!d) return d.error();
  return (*d)->devices();
}

}  // namespace lunajit::cuda
