#include "autotune/cost_model.h"

#include <algorithm>
#include <cmath>

namespace lunajit {
namespace {

constexpr double kLaunchOverheadMs = 0.003;
constexpr int kWarpsToHideLatency = 16;
constexpr int kAssumedRegisters = 64;

int blocks_per_sm(const Arch& arch, int threads, int registers, int64_t smem) {
  const int warps = (threads + 31) / 32;
  int by_threads = arch.max_threads_per_sm / (32 * warps);
  const int regs_per_warp = (registers * 32 + 255) / 256 * 256;
  int by_regs = regs_per_warp > 0 ? (arch.registers_per_sm / regs_per_warp) / warps : arch.max_blocks_per_sm;
  int by_smem = arch.max_blocks_per_sm;
  if (smem > 0) {
    const int64_t per_block = (smem + 127) / 128 * 128 + (arch.sm >= 80 ? 1024 : 0);
    by_smem = static_cast<int>(arch.max_smem_per_sm / per_block);
  }
  return std::max(0, std::min({by_threads, by_regs, by_smem, arch.max_blocks_per_sm}));
}

}  // namespace

double feature_map_flops(const AttentionSpec& s) {
  const double d = s.head_dim, D = s.feature_dim();
  switch (s.family) {
    case Family::luna: {
      const double M = s.luna.projections, L = s.luna.channels, Hm = s.luna.mlp_width;
      return 2 * d * M + M * (2 * Hm + 2 * Hm * L) + M * Hm + 2 * M * L;
    }
    case Family::performer: return D * (2 * d + 6) + 2 * d;
    case Family::rff: return D * (d + 2);
    case Family::elu: return 2 * d;
    case Family::relu: return d;
    case Family::t2r: return D * (2 * d + 2);
    case Family::hedgehog: return D / 2 * (2 * d + 11);
    case Family::cosformer: return 7 * d;
    case Family::slay: {
      const double P = s.slay.anchors, R = s.slay.nodes, M = s.slay.prf_features;
      return 2 * d + P * (2 * d + 3) + R * M * (2 * d + 7) + 3 * D;
    }
  }
  return D * d;
}

Result<CostEstimate> estimate_cost(const AttentionSpec& spec, const TileConfig& c, Pass pass,
                                   const ProblemShape& shape, const GpuSpec& gpu, const Arch& arch,
                                   const std::map<std::string, KernelUsage>& usage) {
  auto plan = plan_launches(spec, c, pass, shape);
  if (!plan) return plan.error();
  const double bh = double(shape.batch) * shape.heads, n = shape.seq;
  const double d = spec.head_dim, dv = spec.value_dim, D = spec.feature_dim();
  const double e = dtype_bytes(spec.dtype);
  const double nd = std::ceil(dv / c.dv_block()), splits = c.state_splits();
  const double F = feature_map_flops(spec);
  const double rows = bh * n;
  const double bw = gpu.memory_gbps * 1e9, peak = scalar_peak_tflops(gpu) * 1e12;

  CostEstimate out;
  for (const KernelLaunch& k : plan->launches) {
    KernelEstimate ke;
    ke.role = k.role;
    if (k.role == "key_stab") {
      ke.bytes = rows * d * e;
      ke.flops = rows * F;
    } else if (k.role == "state") {
      ke.bytes = nd * rows * d * e + rows * dv * e + 4 * bh * splits * (D * dv + D);
      ke.flops = nd * rows * F + 2 * rows * D * dv + rows * D;
    } else if (k.role == "output") {
      ke.bytes = nd * rows * d * e + rows * dv * e + 4 * bh * splits * (D * dv + D) * std::ceil(n / c.block_tokens());
      ke.flops = nd * rows * (F + 2 * D + 1) + 2 * rows * D * dv + rows * dv;
    } else if (k.role == "causal_chunk") {
      const double C = c.chunk(), w = std::min<double>(c.dv_block(), dv);
      ke.bytes = nd * rows * 2 * d * e + rows * 2 * dv * e;
      const double per_chunk = nd * (C * (C + 1) / 2 * 2 * D + w * (C * (C + 1) + 2 * D * C) + 2 * D * w * C + D * C +
                                     C * (2 * D + 1) + C * (C + 1) / 2);
      ke.flops = nd * rows * 2 * F + bh * std::ceil(n / C) * per_chunk;
    } else {
      // Backward kernels: q, k, v, o, dout read and dq, dk, dv written, phi
      // recomputed per dv block, three D x dv products per token.
      ke.bytes = nd * rows * 2 * d * e + rows * (3 * dv + 2 * d) * e;
      ke.flops = nd * rows * 3 * F + 6 * rows * D * dv;
    }
    const double blocks = double(k.grid[0]) * k.grid[1] * k.grid[2];
    auto it = usage.find(k.role);
    const int regs = it != usage.end() && it->second.registers > 0 ? it->second.registers : kAssumedRegisters;
    const int64_t smem = k.smem_bytes + (it != usage.end() ? it->second.static_smem : 0);
    const int bps = std::max(1, blocks_per_sm(arch, int(k.threads), regs, smem));
    const double sms = gpu.sm_count;
    const double fill = std::min(1.0, blocks / sms);
    const double resident_blocks = std::min<double>(bps, std::ceil(blocks / sms));
    const double warps = resident_blocks * ((k.threads + 31) / 32);
    const double hiding = std::min(1.0, warps / kWarpsToHideLatency);
    const double slots = sms * bps;
    const double waves = std::ceil(blocks / slots);
    const double wave_eff = waves > 1 ? blocks / (waves * slots) : 1.0;
    ke.blocks = blocks;
    ke.blocks_per_sm = bps;
    ke.efficiency = fill * hiding * wave_eff;
    const double roof_s = std::max(ke.bytes / bw, ke.flops / peak);
    ke.ms = roof_s * 1e3 / std::max(ke.efficiency, 1e-6) + kLaunchOverheadMs;
    out.ms += ke.ms;
    out.kernels.push_back(std::move(ke));
  }
  return out;
}

}  // namespace lunajit
