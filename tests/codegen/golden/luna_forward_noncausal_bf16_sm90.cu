// lunajit generated kernel source: do not edit; regenerate with `lunajit emit`.
// pass:   forward (non-causal forward, state pass, its partials reduced, output pass)
// spec:   {"causal":false,"dtype":"bf16","eps":1e-06,"family":"luna","head_dim":64,"luna":{"activation":"relu","channels":8,"envelope":false,"mlp_width":64,"output_activation":"relu","projections":8,"shared_channels":true,"variant":"neural"},"normalize":true,"params_per_head":true,"value_dim":64}
// config: T64.w8.dv64.C64.s4.recompute.mma {"block_tokens":64,"chunk":64,"dv_block":64,"mma":true,"phi_backward":"recompute","state_splits":4,"warps":8}
// kernels (NVRTC name expressions):
//   state         lunajit::mma_state_kernel<lunajit_gen::Kernel>
//   state_reduce  lunajit::state_reduce_kernel<lunajit_gen::Kernel>
//   output        lunajit::mma_output_kernel<lunajit_gen::Kernel>

#include "lunajit/linear_attention_mma.cuh"

namespace lunajit_gen {

struct FeatureOptions {
  static constexpr int d = 64;
  static constexpr int projections = 8;
  static constexpr int channels = 8;
  static constexpr int mlp_width = 64;
  static constexpr lunajit::fm::Act activation = lunajit::fm::Act::relu;
  static constexpr lunajit::fm::OutAct output_activation = lunajit::fm::OutAct::relu;
  static constexpr bool shared_channels = true;
  static constexpr bool envelope = false;
  static constexpr lunajit::fm::LunaVariant variant = lunajit::fm::LunaVariant::neural;
};

struct Kernel {
  using T = __nv_bfloat16;
  using FeatureMap = lunajit::LunaFeatureMap<FeatureOptions>;
  static constexpr int d = 64;
  static constexpr int dv = 64;
  static constexpr int D = 64;
  static constexpr int threads = 256;
  static constexpr int block_tokens = 64;
  static constexpr int dv_block = 64;
  static constexpr int chunk = 64;
  static constexpr int state_splits = 4;
  static constexpr bool causal = false;
  static constexpr bool mma = true;
  static constexpr bool normalize = true;
  static constexpr float eps = 1.000000000e-06f;
  static constexpr bool params_per_head = true;
  static constexpr int param_floats = 1160;
  static constexpr bool performer = false;
};

static_assert(Kernel::FeatureMap::kScratchPerRow == 1,
              "host (codegen/feature_map_info.cpp) and device disagree on the feature map's scratch");

}  // namespace lunajit_gen
