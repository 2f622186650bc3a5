// Where cold NVRTC time per kernel goes (issue 11 item 3): compiles the
// default-config kernels of the default LUNA spec (forward and backward, sm_90)
// with the binary cache off under several option sets and prints the wall
// time of each, plus NVRTC's own phase split (--time=<file>: front end, NVVM
// optimizer, ptxas). Usage: nvrtc_time [repeats] [pch_dir] [verbose]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/generator.h"
#include "codegen/tile_config.h"
#include "runtime/nvrtc_compiler.h"

using namespace lunajit;

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::string pch_dir = argc > 2 ? argv[2] : "/tmp/lunajit_pch";
  const bool verbose = argc > 3;  // full error messages (e.g. why --pch fails)
  const Arch arch = arch_from_sm(90).value_or_throw();
  struct Variant { const char* name; std::vector<std::string> extra; };
  const std::vector<Variant> variants = {
      {"default (-O3 ptxas)", {}},
      {"-Xptxas=-O1", {"-Xptxas=-O1"}},
      {"-Xptxas=-O0", {"-Xptxas=-O0"}},
      {"-dopt=off", {"-dopt=off"}},
      {"--pch (auto)", {"--pch", "--pch-dir=" + pch_dir}},
      {"-time phases", {"--time=/tmp/lunajit_nvrtc_time.csv"}},
  };
  for (AttentionSpec spec : {default_spec(Family::luna)}) {
    for (bool causal : {false, true}) {
      spec.causal = causal;
      for (Pass pass : {Pass::forward, Pass::backward}) {
        auto src = generate(spec, default_config(spec, arch, pass), pass);
        if (!src) { std::fprintf(stderr, "%s\n", src.error().message.c_str()); return 1; }
        std::printf("== %s %s: %zu kernels, %zu bytes of source\n", causal ? "causal" : "non-causal",
                    std::string(to_string(pass)).c_str(), src->entries.size(), src->code.size());
        for (const auto& v : variants) {
          NvrtcOptions o;
          o.use_cache = false;
          o.extra = v.extra;
          for (int r = 0; r < repeats; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            auto k = compile_nvrtc(*src, arch, o);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            int regs = 0, spill = 0;
            if (k) for (auto& res : k->resources) { regs = std::max(regs, res.registers); spill += res.spill_stores; }
            std::printf("  %-22s run %d: %6.3f s  %s max regs %d spill %d\n", v.name, r, s,
                        k ? "ok" : k.error().message.substr(0, verbose ? std::string::npos : 120).c_str(), regs, spill);
          }
        }
        std::ifstream t("/tmp/lunajit_nvrtc_time.csv");
        std::stringstream ss; ss << t.rdbuf();
        std::printf("  --time output:\n%s\n", ss.str().c_str());
        std::remove("/tmp/lunajit_nvrtc_time.csv");
      }
    }
  }
}
