#include "codegen/arch.h"

#include <charconv>

#include <fmt/format.h>

namespace lunajit {
namespace {

// CUDA C Programming Guide, "Technical Specifications per Compute Capability"
// (shared memory per block is the opt-in maximum, cudaFuncAttributeMaxDynamicSharedMemorySize).
struct ArchRow {
  int sm, smem_block, smem_sm, threads_sm, blocks_sm;
};
constexpr ArchRow kArchTable[] = {
    {75, 65536, 65536, 1024, 16},     // Turing
    {80, 166912, 167936, 2048, 32},   // A100
    {86, 101376, 102400, 1536, 16},   // A10, RTX 30xx
    {87, 166912, 167936, 2048, 16},   // Orin
    {88, 101376, 102400, 1536, 16},
    {89, 101376, 102400, 1536, 24},   // L4, L40S, RTX 40xx
    {90, 232448, 233472, 2048, 32},   // H100, H200
    {100, 232448, 233472, 2048, 32},  // B200
    {103, 232448, 233472, 2048, 32},  // B300
    {110, 232448, 233472, 2048, 32},  // Thor
    {120, 101376, 102400, 1536, 32},  // RTX 50xx
    {121, 101376, 102400, 1536, 32},  // DGX Spark
};

}  // namespace

std::string Arch::name() const { return fmt::format("sm_{}", sm); }

const std::vector<int>& known_sms() {
  static const std::vector<int> sms = [] {
    std::vector<int> v;
    for (const auto& r : kArchTable) v.push_back(r.sm);
    return v;
  }();
  return sms;
}

Result<Arch> arch_from_sm(int sm) {
  for (const auto& r : kArchTable) {
    if (r.sm != sm) continue;
    Arch a;
    a.sm = sm;
    a.max_smem_per_block = r.smem_block;
    a.max_smem_per_sm = r.smem_sm;
    a.max_threads_per_sm = r.threads_sm;
    a.max_blocks_per_sm = r.blocks_sm;
    a.smem_reserved_per_block = sm >= 80 ? 1024 : 0;
    return a;
  }
  std::string allowed;
  for (const auto& r : kArchTable) allowed += fmt::format("{}sm_{}", allowed.empty() ? "" : ", ", r.sm);
  return Error::invalid(fmt::format("arch = sm_{}: unknown; allowed: {}", sm, allowed));
}

Result<Arch> parse_arch(std::string_view s) {
  std::string_view digits = s;
  if (digits.starts_with("sm_")) digits.remove_prefix(3);
  else if (digits.starts_with("compute_")) digits.remove_prefix(8);
  std::string cleaned;
  for (char c : digits)
    if (c != '.') cleaned += c;
  int sm = 0;
  auto [p, ec] = std::from_chars(cleaned.data(), cleaned.data() + cleaned.size(), sm);
  if (ec != std::errc() || p != cleaned.data() + cleaned.size() || cleaned.empty())
    return Error::invalid(fmt::format("arch = \"{}\": expected sm_XX (e.g. sm_80, sm_90)", s));
  return arch_from_sm(sm);
}

Result<std::vector<Arch>> parse_arch_list(std::string_view s) {
  std::vector<Arch> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string_view item = s.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (!item.empty()) {
      auto a = parse_arch(item);
      if (!a) return a.error();
      out.push_back(*a);
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (out.empty()) return Error::invalid("arch: empty list; expected e.g. sm_80,sm_90");
  return out;
}

}  // namespace lunajit
