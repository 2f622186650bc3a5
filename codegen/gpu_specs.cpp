#include "codegen/gpu_specs.h"

#include <algorithm>
#include <cctype>

namespace lunajit {

const std::vector<GpuSpec>& gpu_table() {
  // Numbers from NVIDIA's product datasheets and architecture whitepapers.
  static const std::vector<GpuSpec> table = {
      {"a100", "NVIDIA A100 SXM4 80GB", 80, 108, 2039, 80, 19.5, 312, 312, 40,
       "NVIDIA A100 Tensor Core GPU datasheet (2021); Ampere GA100 whitepaper"},
      {"a10", "NVIDIA A10", 86, 72, 600, 24, 31.2, 125, 125, 6,
       "NVIDIA A10 Tensor Core GPU datasheet"},
      {"l4", "NVIDIA L4", 89, 58, 300, 24, 30.3, 121, 121, 48,
       "NVIDIA L4 Tensor Core GPU datasheet"},
      {"l40s", "NVIDIA L40S", 89, 142, 864, 48, 91.6, 362, 362, 96,
       "NVIDIA L40S datasheet"},
      {"rtx4090", "NVIDIA GeForce RTX 4090", 89, 128, 1008, 24, 82.6, 165, 165, 72,
       "NVIDIA Ada Lovelace architecture whitepaper (v2.1), appendix table"},
      {"h100", "NVIDIA H100 SXM5 80GB", 90, 132, 3350, 80, 67, 989, 989, 50,
       "NVIDIA H100 Tensor Core GPU datasheet; Hopper whitepaper"},
      {"h200", "NVIDIA H200 SXM 141GB", 90, 132, 4800, 141, 67, 989, 989, 50,
       "NVIDIA H200 Tensor Core GPU datasheet"},
      {"b200", "NVIDIA B200", 100, 148, 8000, 180, 80, 2250, 2250, 126,
       "NVIDIA DGX B200 / HGX B200 datasheets (per GPU, dense); FP32 approximate"},
      {"rtx5090", "NVIDIA GeForce RTX 5090", 120, 170, 1792, 32, 104.8, 209.5, 209.5, 96,
       "NVIDIA RTX Blackwell GPU architecture whitepaper, appendix table"},
  };
  return table;
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
