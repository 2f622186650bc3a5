#include "codegen/occupancy.h"

#include <algorithm>

namespace lunajit {
namespace {

int64_t round_up(int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; }

}  // namespace

Occupancy theoretical_occupancy(const Arch& a, const OccupancyInput& in) {
  Occupancy o;
  const int warps = std::max(1, (in.threads + 31) / 32);
  o.max_warps = a.max_warps_per_sm();
  o.blocks_by_threads = in.threads > a.max_threads_per_block ? 0 : a.max_threads_per_sm / (32 * warps);

  const int64_t regs_per_warp = round_up(int64_t(std::max(in.registers, 1)) * 32, a.register_alloc_unit);
  if (in.registers > a.max_registers_per_thread || regs_per_warp * warps > a.max_registers_per_block) {
    o.blocks_by_registers = 0;
  } else {
    const int64_t per_partition = (a.registers_per_sm / a.register_sub_partitions) / regs_per_warp;
    o.blocks_by_registers = static_cast<int>(per_partition * a.register_sub_partitions / warps);
  }

  const int64_t smem = in.static_smem + in.dynamic_smem;
  if (smem > a.max_smem_per_block) {
    o.blocks_by_smem = 0;
  } else {
    const int64_t per_block = round_up(smem, a.smem_alloc_unit) + a.smem_reserved_per_block;
    o.blocks_by_smem = per_block > 0 ? static_cast<int>(a.max_smem_per_sm / per_block) : a.max_blocks_per_sm;
  }
  o.blocks_by_limit = a.max_blocks_per_sm;

  // Ties name the first limit in this order (threads, registers, smem, blocks).
  struct Limit { int blocks; const char* name; };
  const Limit limits[] = {{o.blocks_by_threads, "threads"}, {o.blocks_by_registers, "registers"},
                          {o.blocks_by_smem, "smem"}, {o.blocks_by_limit, "blocks"}};
  const Limit* lowest = &limits[0];
  for (const auto& l : limits)
    if (l.blocks < lowest->blocks) lowest = &l;
  o.blocks_per_sm = lowest->blocks;
  o.limited_by = lowest->name;
  o.active_warps = o.blocks_per_sm * warps;
  o.fraction = o.max_warps > 0 ? double(o.active_warps) / o.max_warps : 0;
  return o;
}

}  // namespace lunajit
