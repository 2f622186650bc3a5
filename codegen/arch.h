// Arch: the per-compute-capability limits the kernels are checked against
// (CUDA C Programming Guide, "Technical Specifications per Compute Capability").
//
// These are limits of the instruction set generation (sm_XX), not of a GPU
// product; SM counts, bandwidth and peak FLOP/s of products belong to the
// report's GPU table.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace lunajit {

struct Arch {
  int sm = 80;                         // compute capability * 10 + minor, e.g. 90
  int max_smem_per_block = 0;          // bytes, with the opt-in attribute
  int max_smem_per_sm = 0;             // bytes
  int max_threads_per_block = 1024;
  int max_threads_per_sm = 2048;
  int registers_per_sm = 65536;
  int max_registers_per_thread = 255;
  int max_blocks_per_sm = 32;
  // Allocation rules of the occupancy calculation (CUDA Occupancy Calculator /
  // cuda_occupancy.h; CUDA C Best Practices Guide, "Occupancy"): registers are
  // allocated per warp in units of 256, from 4 register-file sub-partitions;
  // shared memory in units of 128 bytes, with 1 KiB reserved per block by the
  // system on sm_80 and later (CUDA C Programming Guide, "Shared Memory" of
  // compute capability 8.x/9.x/10.x/12.x).
  int register_alloc_unit = 256;       // registers per warp allocation unit
  int register_sub_partitions = 4;
  int max_registers_per_block = 65536;
  int smem_alloc_unit = 128;           // bytes
  int smem_reserved_per_block = 0;     // bytes; 1024 on sm_80+

  int max_warps_per_sm() const { return max_threads_per_sm / 32; }
  std::string name() const;  // "sm_90"
};

// Known archs: sm_75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121.
Result<Arch> arch_from_sm(int sm);
// Parses "sm_90", "90", "9.0".
Result<Arch> parse_arch(std::string_view s);
// Parses a comma-separated list.
Result<std::vector<Arch>> parse_arch_list(std::string_view s);
const std::vector<int>& known_sms();

}  // namespace lunajit
