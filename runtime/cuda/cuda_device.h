// What lunajit knows about a CUDA device, without the driver's headers: code
// that only reports devices (the CLI, make_backend, the report) includes this,
// not runtime/cuda/cuda_driver.h (which needs the toolkit's cuda.h).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace lunajit::cuda {

// The first line of every "no driver / no GPU" error (Error{unavailable});
// details follow on the next line. The CLI and make_backend("auto") rely on it.
inline constexpr std::string_view kNoCudaMessage = "no CUDA driver/GPU found; use --backend host";

// One GPU as the driver reports it.
struct DeviceInfo {
  int ordinal = 0;
  std::string name;                   // "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;     // compute capability
  int sm_count = 0;                   // multiprocessors
  std::size_t total_memory = 0;       // bytes
  int max_threads_per_block = 0;
  int max_smem_per_block_optin = 0;   // bytes, with the opt-in attribute
  int max_smem_per_sm = 0;            // bytes
  int l2_bytes = 0;
  int clock_khz = 0;                  // SM clock
  int memory_clock_khz = 0;
  int memory_bus_bits = 0;
  int driver_version = 0;             // cuDriverGetVersion: 12040 for 12.4

  int sm() const { return cc_major * 10 + cc_minor; }  // 90
};

// "12.4" from 12040.
std::string format_driver_version(int v);

// The devices of the process-wide driver; Error{unavailable} with
// kNoCudaMessage when there is no driver or no GPU.
Result<std::vector<DeviceInfo>> list_devices();

}  // namespace lunajit::cuda
