#include "codegen/gpu_specs.h"

#include <algorithm>
#include <cctype>

namespace lunajit {

const std::vector<GpuSpec>& gpu_table() {
  // Numbers from NVIDIA's product datasheets and architecture whitepapers;
  // tensor-core peaks are dense (the datasheets' "with sparsity" figures
  // halved), FP32 accumulate. Columns: key, name, sm, SMs, GB/s, GiB, FP32,
  // FP16 tensor, BF16 tensor, TF32 tensor (TFLOP/s), boost MHz, L2 MiB, source.
  static const std::vector<GpuSpec> table = {
      // A100 SXM4: BF16/FP16 312, TF32 156 (datasheet: 624/312 with sparsity); boost 1410 MHz (GA100 whitepaper table 3).
      {"a100", "NVIDIA A100 SXM4 80GB", 80, 108, 2039, 80, 19.5, 312, 312, 156, 1410, 40,
       "NVIDIA A100 Tensor Core GPU datasheet (2021); Ampere GA100 whitepaper"},
      // A10: BF16/FP16 125, TF32 62.5 (datasheet: 250/125 sparse); boost 1695 MHz.
      {"a10", "NVIDIA A10", 86, 72, 600, 24, 31.2, 125, 125, 62.5, 1695, 6,
       "NVIDIA A10 Tensor Core GPU datasheet"},
      // L4: BF16/FP16 121, TF32 60 (datasheet: 242/120 sparse); boost 2040 MHz.
      {"l4", "NVIDIA L4", 89, 58, 300, 24, 30.3, 121, 121, 60, 2040, 48,
       "NVIDIA L4 Tensor Core GPU datasheet"},
      // L40S: BF16/FP16 362, TF32 183 (datasheet: 733/366 sparse); boost 2520 MHz.
      {"l40s", "NVIDIA L40S", 89, 142, 864, 48, 91.6, 362, 362, 183, 2520, 96,
       "NVIDIA L40S datasheet"},
      // RTX 4090: FP16/BF16 with FP32 accumulate 165.2, TF32 82.6 (whitepaper appendix A, dense); boost 2520 MHz.
      {"rtx4090", "NVIDIA GeForce RTX 4090", 89, 128, 1008, 24, 82.6, 165, 165, 82.6, 2520, 72,
       "NVIDIA Ada Lovelace architecture whitepaper (v2.1), appendix table"},
      // H100 SXM5: BF16/FP16 989.4, TF32 494.7 (datasheet: 1979/989 sparse); boost 1980 MHz (Hopper whitepaper table 3).
      {"h100", "NVIDIA H100 SXM5 80GB", 90, 132, 3350, 80, 67, 989, 989, 494.7, 1980, 50,
       "NVIDIA H100 Tensor Core GPU datasheet; Hopper whitepaper"},
      // H200 SXM: the H100's SM and clocks (datasheet: BF16/FP16 1979, TF32 989 sparse), 4.8 TB/s HBM3e.
      {"h200", "NVIDIA H200 SXM 141GB", 90, 132, 4800, 141, 67, 989, 989, 494.7, 1980, 50,
       "NVIDIA H200 Tensor Core GPU datasheet"},
      // B200 (per GPU of HGX B200): BF16/FP16 2.25 PF, TF32 1.1 PF dense (4.5/2.2 sparse); boost ~1965 MHz (approximate).
      {"b200", "NVIDIA B200", 100, 148, 8000, 180, 80, 2250, 2250, 1100, 1965, 126,
       "NVIDIA DGX B200 / HGX B200 datasheets (per GPU, dense); FP32 and clock approximate"},
      // RTX 5090: FP16/BF16 with FP32 accumulate 209.5, TF32 104.8 (whitepaper appendix, dense); boost 2407 MHz.
      {"rtx5090", "NVIDIA GeForce RTX 5090", 120, 170, 1792, 32, 104.8, 209.5, 209.5, 104.8, 2407, 96,
       "NVIDIA RTX Blackwell GPU architecture whitepaper, appendix table"},
  };
  return table;
}

double tensor_peak_tflops(const GpuSpec& g, DType operand) {
  switch (operand) {
    case DType::bf16: return g.bf16_tensor_tflops;
    case DType::fp16: return g.fp16_tensor_tflops;
    case DType::fp32: return g.tf32_tensor_tflops;
  }
  return g.bf16_tensor_tflops;
}

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}
std::string alnum(std::string_view s) {
  std::string out;
  for (char c : lower(s))
    if (std::isalnum(static_cast<unsigned char>(c))) out += c;
  return out;
}
}  // namespace

const GpuSpec* find_gpu(std::string_view key_or_name) {
  const std::string want = alnum(key_or_name);
  for (const auto& g : gpu_table())
    if (g.key == want) return &g;
  // Driver names: "NVIDIA H200", "NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB".
  const GpuSpec* best = nullptr;
  for (const auto& g : gpu_table()) {
    const std::string key = g.key;
    if (want.find(key) != std::string::npos && (!best || key.size() > best->key.size())) best = &g;
  }
  return best;
}

const GpuSpec* representative_gpu(int sm) {
  const char* key = nullptr;
  switch (sm) {
    case 80: key = "a100"; break;
    case 86: key = "a10"; break;
    case 89: key = "l40s"; break;
    case 90: key = "h100"; break;
    case 100: key = "b200"; break;
    case 120: key = "rtx5090"; break;
    default: return nullptr;
  }
  return find_gpu(key);
}

}  // namespace lunajit
