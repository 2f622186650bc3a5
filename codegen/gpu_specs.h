// GpuSpec: the published numbers of GPU products that the cost model (autotune/)
// and the kernel reports (report/) rank and predict with: SM count, memory
// bandwidth, peak FLOP/s by precision, and the compute capability whose limits
// (codegen/arch.h) apply. Peak tensor numbers are dense (no 2:4 sparsity).
// Each row names its source; where vendors publish only boost-clock figures,
// those are used.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "codegen/arch.h"
#include "codegen/attention_spec.h"

namespace lunajit {

struct GpuSpec {
  std::string key;              // "h200", "a100", ...
  std::string name;             // "NVIDIA H200 SXM 141GB"
  int sm = 0;                   // compute capability, e.g. 90
  int sm_count = 0;
  double memory_gbps = 0;       // DRAM bandwidth, GB/s (1e9 bytes/s)
  double memory_gib = 0;
  double fp32_tflops = 0;       // non-tensor FP32 (FMA = 2 FLOPs)
  double fp16_tensor_tflops = 0;  // dense FP16 tensor-core, FP32 accumulate
  double bf16_tensor_tflops = 0;  // dense BF16 tensor-core, FP32 accumulate
  double tf32_tensor_tflops = 0;  // dense TF32 tensor-core (fp32 I/O specs on a TF32 path)
  double boost_mhz = 0;         // boost clock: shared-memory and SFU rates are per clock
  double l2_mib = 0;
  std::string source;           // where the numbers come from
};

// The table: A100, A10, L4, L40S, RTX 4090, H100 SXM, H200, B200, RTX 5090.
const std::vector<GpuSpec>& gpu_table();

// Looks a product up by key ("h200") or by a device name reported by the
// driver ("NVIDIA H200"), case-insensitively; nullptr when unknown.
const GpuSpec* find_gpu(std::string_view key_or_device_name);

// The representative product of an arch (used to predict when only "sm_90" is
// given): sm_80 A100, sm_86 A10, sm_89 L40S, sm_90 H100 SXM, sm_100 B200,
// sm_120 RTX 5090; nullptr for archs without one.
const GpuSpec* representative_gpu(int sm);

// Peak FLOP/s (in TFLOP/s) a kernel without tensor cores can reach: the FP32 rate.
inline double scalar_peak_tflops(const GpuSpec& g) { return g.fp32_tflops; }

// Dense tensor-core peak (TFLOP/s, FP32 accumulate) for products whose
// operands are `operand` (bf16, fp16; fp32 operands run on TF32).
double tensor_peak_tflops(const GpuSpec& g, DType operand);

// Per-SM rates per clock that the table does not vary (CUDA C++ Programming
// Guide, "Arithmetic Instructions" throughput table and "Shared Memory" of
// compute capabilities 8.x-12.x): 32 banks of 4 bytes serve one wavefront of
// 128 bytes per clock; the special-function units (MUFU: rcp, rsqrt, ex2, lg2,
// sin, cos) retire 16 results per clock per SM.
inline constexpr double kSharedWavefrontsPerClockPerSm = 1;
inline constexpr double kSfuOpsPerClockPerSm = 16;

}  // namespace lunajit
