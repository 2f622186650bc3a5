// Theoretical occupancy (shared by the cost model, codegen/cost_model.h, and the
// kernel reports) of a kernel on an arch, from the arch table
// (codegen/arch.h) and the kernel's resources (ptxas registers and static
// shared memory, the launch's threads and dynamic shared memory): the rules of
// NVIDIA's occupancy calculator (cuda_occupancy.h).
//
//   warps per block  W  = ceil(threads / 32)
//   by threads          = floor(max_threads_per_sm / (32 W))
//   by registers        regs per warp = ceil(regs * 32 / 256) * 256;
//                       warps per sub-partition = floor((regs_per_sm / 4) / regs per warp);
//                       blocks = floor(4 * warps per sub-partition / W)
//                       (0 when regs > max per thread or regs * 32 W > max per block)
//   by shared memory    per block = ceil((static + dynamic) / 128) * 128 + reserved (1 KiB on sm_80+);
//                       blocks = floor(max_smem_per_sm / per block)
//                       (0 when static + dynamic > max_smem_per_block)
//   by the block limit  = max_blocks_per_sm
//   blocks per SM = the smallest; occupancy = blocks * W / (max_threads_per_sm / 32).
//
// Worked example (sm_90, 128 threads, 96 registers, 40 KiB smem): W = 4; by
// threads 16; 96 * 32 = 3072 regs per warp, 16384 / 3072 = 5 warps per
// sub-partition, 20 / 4 = 5 blocks; smem 41984 B, 233472 / 41984 = 5 blocks;
// 5 blocks * 4 warps / 64 = 0.3125.
#pragma once

#include <cstdint>
#include <string>

#include "codegen/arch.h"

namespace lunajit {

struct OccupancyInput {
  int threads = 128;
  int registers = 0;            // per thread (ptxas)
  int64_t static_smem = 0;      // bytes (ptxas)
  int64_t dynamic_smem = 0;     // bytes (launch)
};

struct Occupancy {
  int blocks_by_threads = 0;
  int blocks_by_registers = 0;
  int blocks_by_smem = 0;
  int blocks_by_limit = 0;
  int blocks_per_sm = 0;
  std::string limited_by;  // "threads", "registers", "smem", "blocks"
  int active_warps = 0;
  int max_warps = 0;
  double fraction = 0;     // active_warps / max_warps
};

Occupancy theoretical_occupancy(const Arch& arch, const OccupancyInput& in);

}  // namespace lunajit
