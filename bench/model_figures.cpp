// Predicted per-kernel figures of the cost model (codegen/cost_model.h) for
// the default LUNA spec at one shape on named GPUs, next to the former
// report model (max(bytes / BW, FLOPs / FP32 peak), the same bytes and FLOPs):
// the numbers the issue 11 note quotes. Default configs of the arch, ptxas
// registers from an NVRTC compile. Usage: model_figures [B H N] [gpu,...]
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "codegen/cost_model.h"
#include "codegen/generator.h"
#include "codegen/launch_plan.h"
#include "runtime/nvrtc_compiler.h"

using namespace lunajit;

int main(int argc, char** argv) {
  ProblemShape shape{8, 12, 16384};
  if (argc > 3) shape = {std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3])};
  std::string gpus = argc > 4 ? argv[4] : "h100,h200";
  std::stringstream list(gpus);
  for (std::string key; std::getline(list, key, ',');) {
    const GpuSpec* g = find_gpu(key);
    if (!g) { std::fprintf(stderr, "unknown gpu %s\n", key.c_str()); return 2; }
    const Arch arch = arch_from_sm(g->sm).value_or_throw();
    std::printf("== %s, B=%d H=%d N=%d, default LUNA bf16\n", g->name.c_str(), shape.batch, shape.heads, shape.seq);
    for (bool causal : {false, true})
      for (Pass pass : {Pass::forward, Pass::backward}) {
        AttentionSpec s = default_spec(Family::luna);
        s.causal = causal;
        for (bool mma : {false, true}) {
        TileConfig c = default_config(s, arch, pass).with_mma(mma);
        // The scalar causal backward on the tiles it had as the default
        // (4 warps, the largest chunk that fits), not the tensor-core default's.
        if (causal && pass == Pass::backward && !mma)
          for (int chunk : {16, 32, 64})
            if (can_implement(s, TileConfig(64, 4, 64, chunk, 4), arch, pass)) c = TileConfig(64, 4, 64, chunk, 4);
        if (mma && !can_implement(s, c, arch, pass)) continue;
        std::map<std::string, KernelUsage> usage;
        auto src = generate(s, c, pass).value_or_throw();
        auto k = compile_nvrtc(src, arch);
        if (!k) std::fprintf(stderr, "  (no ptxas registers: %s)\n", k.error().message.c_str());
        if (k) usage = usage_by_role(src, *k);
        auto p = predict_pass(s, c, pass, shape, *g, arch, usage).value_or_throw();
        double old_ms = 0;
        std::printf("  %s %s (%s): new %.3f ms\n", causal ? "causal" : "non-causal",
                    std::string(to_string(pass)).c_str(), c.to_string().c_str(), p.ms);
        for (size_t i = 0; i < p.kernels.size(); ++i) {
          const auto& k = p.kernels[i];
          const double old = std::max(k.dram_ms, k.fp32_ms);
          old_ms += old;
          std::printf("    %-13s new %8.3f ms  limiter %-7s dram %.3f fp32 %.3f shared %.3f sfu %.3f serial %.3f eff %.2f"
                      " regs %d | old roofline %.3f ms\n",
                      k.role.c_str(), k.ms, k.limiter.c_str(), k.dram_ms, k.fp32_ms, k.shared_ms, k.sfu_ms,
                      k.serial_ms, k.efficiency, usage.count(k.role) ? usage[k.role].registers : -1, old);
        }
        std::printf("    total: new %.3f ms, old report roofline %.3f ms\n", p.ms, old_ms);
        // Side by side: the same kernels run with the compiled split count
        // (what every plan ran before the split count came from the SM count).
        if (auto counts = pass_counts(s, c, pass, shape, 0)) {
          double fixed_ms = 0;
          for (const KernelCounts& k : *counts) {
            auto it = usage.find(k.role);
            fixed_ms += predict_kernel(k, *g, arch, it != usage.end() ? std::optional(it->second) : std::nullopt).ms;
          }
          std::printf("    splits: %d of %d (best_splits); at the compiled %d: %.3f ms\n", p.splits,
                      c.state_splits(), c.state_splits(), fixed_ms);
        }
        }
      }
  }
}
